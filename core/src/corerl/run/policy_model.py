"""The policy's model as a run reads it: its Hugging Face folder (``policy.model_name`` resolved in
the run directory, or a folder given as it is), its tokenizer and image encoder, the task built on
them, and the weights the algorithm starts from (the SFT warm start's, when one runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.errors import ConfigError
from corerl.run.directory import load_tokenizer, resolve_policy_model
from corerl.run.epochs import limit_to_epochs

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.run.resume_state import ResumeState


class PolicyModel:
    """The policy's model folder (``path``), ``tokenizer``, ``images`` (a vision-language policy's
    :class:`~corerl.models.vision.ImageEncoder`, else None) and ``task``, all set by :meth:`load`;
    ``warm_started`` says the algorithm starts from the SFT warm start's weights."""

    def __init__(self, config: Config, selection: Selection, run_dir: Path) -> None:
        self.config, self.selection, self.run_dir = config, selection, run_dir
        self.path = ""
        self.tokenizer: Any = None
        self.images: Any = None
        self.task: Any = None
        self.warm_started = False

    def load(self, model_path: str | None = None) -> None:
        """The model (``policy.model_name``, resolved in the run directory; or the Hugging Face
        folder ``model_path``, as it is), its tokenizer and the task."""
        from corerl.tasks import TaskContext

        core, selection = self.config.core, self.selection
        if model_path is not None:
            self.path = model_path
        else:
            self.path = resolve_policy_model(core.policy, self.run_dir)
            if core.policy.hf_config_overrides:
                from corerl.models.overrides import with_config_overrides

                self.path = with_config_overrides(self.path, core.policy.hf_config_overrides,
                                                  self.run_dir / "model_overridden")
        tokenizer = load_tokenizer(core.policy.tokenizer_path(self.path), self.path)
        if core.policy.chat_template is not None:
            tokenizer.chat_template = core.policy.chat_template
        if core.policy.chat_template_kwargs and getattr(tokenizer, "chat_template", None):
            from corerl.models.chat_template import templates_with_arguments

            tokenizer.chat_template = templates_with_arguments(tokenizer.chat_template,
                                                               dict(core.policy.chat_template_kwargs))
        self.tokenizer = tokenizer
        self.images = image_encoder(self.path, tokenizer)  # a vision-language policy's ImageEncoder
        assert selection.task.registration is not None
        self.task = selection.task.registration.create(TaskContext(
            tokenizer, core.algorithm.seed, core.data, selection.reward_fn,
            max_prompt_tokens=core.policy.max_seq_length - 1, images=self.images))
        if core.data.full_context:  # a memory check: every training batch made up at the full length
            from corerl.tasks.full_context import FullContextTask

            self.task = FullContextTask(self.task, tokenizer, core.algorithm.seed, core.policy.max_seq_length,
                                        core.policy.generation.max_new_tokens)
        check_task_fits(self.task, selection)
        limit_to_epochs(self.config, self.task)  # the run's steps, once the training rows are known

    def start_from_warm_start(self) -> None:
        """The algorithm starts from the SFT warm start's weights (it begins after the warm start)."""
        self.warm_started = True

    @property
    def starting_weights(self) -> str:
        """The checkpoint the algorithm starts from: the warm start's when one ran, else the model."""
        return str(self.run_dir / "sft_model") if self.warm_started else self.path

    def resumed_base(self, resume: ResumeState) -> str:
        """Where the policy's weights load from before a checkpoint: the model, except for a LoRA
        run resumed after its SFT warm start, whose adapter trains on the warm start's merged
        model (its checkpoint holds the adapter alone)."""
        if (resume.resume is not None and self.config.core.policy.lora.enabled and self.warm_started
                and resume.after_warm_start()):
            return self.starting_weights
        return self.path


def check_task_fits(task: Any, selection: Selection) -> None:
    """Refuse a task object that cannot feed the selected algorithm (one that trains on
    preference pairs needs a preference source; one that samples needs prompts), in one line
    naming ``data.task``."""
    from corerl.tasks.preferences import PreferenceSource

    registration, task_id = selection.algorithm.registration, selection.task.id
    if registration is None:
        return
    if registration.consumes == "preferences" and not isinstance(task, PreferenceSource):
        raise ConfigError(f"task {task_id!r} provides no preference pairs, which {registration.id} trains on",
                          key="data.task", hint="use data.task=digit_preference (built in) or data.task=preferences "
                                                "with data.train_files (prompt/chosen/rejected rows)")
    if registration.consumes == "prompts" and not hasattr(task, "sample"):
        raise ConfigError(f"task {task_id!r} provides preference pairs only, which {registration.id} does not "
                          "train on", key="algorithm.name", hint="pick an algorithm that trains on preference pairs "
                                                                  "(algorithm.name=dpo)")


def image_encoder(model_path: str, tokenizer: Any) -> Any:
    """The policy's :class:`~corerl.models.vision.ImageEncoder` when it is a vision-language
    model, else None."""
    from corerl.models.vision import ImageEncoder, is_vision_language, read_hf_config

    return ImageEncoder(model_path, tokenizer) if is_vision_language(read_hf_config(model_path)) else None
