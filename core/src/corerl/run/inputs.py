"""What a run needs from the machine, checked before anything is built or written: the run
directory can be made and written (and resumed or started over in), the models and tokenizer
are there, the data files are there, and what each chosen component needs from the machine (its
registration's ``check_inputs``: a database folder, a server). ``corerl validate`` and ``corerl run`` (through
:meth:`corerl.run.context.RunContext.open`) both call :func:`check_run_inputs`, so that validate
refuses what run would refuse at its start.

Once those pass, what the run would refuse of their contents is checked too, before the run
writes anything (:func:`check_contents`): the dataset task's rows (JSON objects, the prompt and
answer columns, image placeholders) and their image files (opened, not decoded: missing, not an
image, corrupt, past ``data.max_image_pixels``), and the vocabulary of a distillation teacher,
a reward model or a judge against the policy's. Prompt lengths, the weights and the tokenizers'
other files are checked when the run reads them, before training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.errors import ConfigError, ConfigErrors, CorerlError

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.plugin_manager import PluginHost


def check_run_inputs(config: Config, selection: Selection, host: PluginHost | None = None) -> None:
    """Raise every input of ``config`` the run could not use (see the module docstring), one line
    each with its key and where it was set (exit 2): the :class:`~corerl.errors.ConfigError`
    itself when there is one, else :class:`~corerl.errors.ConfigErrors` listing them. With
    ``host``, a resume is also checked against the recipe its run started with."""
    errors: list[CorerlError] = []
    for check in _checks(config, selection, host):
        try:
            check()
        except ConfigErrors as exc:
            errors += exc.errors
        except ConfigError as exc:
            errors.append(exc)
    if not errors:  # the contents of inputs that are there
        try:
            check_contents(config, selection)
        except ConfigError as exc:
            errors.append(exc)
    for error in errors:
        _say_where(error, config)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)


def _check_quantized(policy: Any) -> None:
    """A quantised policy checkpoint trains only dequantised (``policy.dequantize_base_checkpoint``)."""
    from corerl.models.dequantize import check_quantized_checkpoint
    from corerl.models.gguf import gguf_source

    if gguf_source(policy.model_name, policy.gguf_file) is None:  # a GGUF file is dequantised by its conversion
        check_quantized_checkpoint(policy.model_name, policy.dequantize_base_checkpoint)


def _checks(config: Config, selection: Selection, host: PluginHost | None) -> list[Callable[[], None]]:
    from corerl.run.directory import check_model, check_run_dir, check_tokenizer

    core = config.core
    policy, data = core.policy, core.data
    checks: list[Callable[[], None]] = [lambda: check_run_dir(config),
                                        lambda: check_model(policy.model_name, policy.gguf_file),
                                        lambda: _check_quantized(policy)]
    tokenizer = policy.tokenizer_path(policy.model_name)
    if tokenizer != policy.model_name:
        checks.append(lambda: check_tokenizer(tokenizer))
    if selection.critic_backend is not None and core.critic.model_name is not None:
        checks.append(lambda: check_model(core.critic.model_name, key="critic.model_name"))
    reward_model = core.reward_model
    if reward_model.kind is not None and reward_model.model_name is not None:
        checks.append(lambda: check_model(reward_model.model_name, key="reward_model.model_name"))
    checks += [functools.partial(check_model, model, key=key) for key, model in _algorithm_models(config, selection)]
    checks.append(lambda: _raise_all(_data_errors(data, selection.task.id)))
    checks += [functools.partial(registration.check_machine, on) for registration, on in _chosen(selection, config)
               if registration.check_inputs is not None]
    if host is not None:
        checks.append(lambda: _check_resume(config, host))
    return checks


def _chosen(selection: Selection, config: Config) -> list[tuple[Any, Any]]:
    """The registrations ``selection`` chose (each once), with the config each is checked on (the
    critic's own; the packer only when packing is on), as selection's ``check_supported`` are."""
    choices = [selection.algorithm, selection.training_backend,
               *([selection.generation_backend, selection.offload_policy] if selection.samples else []),
               *([selection.sequence_packer] if config.core.policy.sequence_packing.enabled else []),
               selection.task, selection.reward, selection.environment]
    found: list[tuple[Any, Any]] = []
    for choice in choices:
        if choice.registration is not None and all(choice.registration is not seen for seen, _ in found):
            found.append((choice.registration, config))
    if selection.critic_backend is not None and selection.critic_backend.registration is not None:
        found.append((selection.critic_backend.registration, selection.critic_config))
    return found


def check_contents(config: Config, selection: Selection) -> None:
    """Raise the first thing the run would refuse of the contents of its inputs (see the module
    docstring), once they are known to be there: the data rows and images, then the other
    models' vocabularies."""
    from corerl.models.vision import image_facts
    from corerl.tasks.dataset import check_rows

    policy = config.core.policy
    check_rows(config.core.data, selection.task.id, *image_facts(policy.model_name, policy.gguf_file))
    _check_vocabularies(config, selection)


def _check_vocabularies(config: Config, selection: Selection) -> None:
    """A distillation teacher, a reward model and a judge read the policy's token ids: their
    tokenizers must map every token to the same id (:func:`corerl.models.tokenizer.compare_vocabularies`)."""
    from corerl.models.tokenizer import compare_vocabularies, model_vocabulary

    core = config.core
    others = [(key, model, key.rsplit(".", 1)[-1].removesuffix("_model")) for key, model in _algorithm_models(config, selection)]
    reward_model = core.reward_model
    if reward_model.kind is not None and reward_model.model_name is not None:
        role = "judge" if reward_model.kind == "llm_judge" else "reward model"
        others.append(("reward_model.model_name", reward_model.model_name, role))
    if not others or core.policy.gguf_file:
        return
    tokenizer = core.policy.tokenizer_path(core.policy.model_name)
    ours = model_vocabulary(tokenizer, "policy.tokenizer_name" if tokenizer != core.policy.model_name else "policy.model_name")
    for key, model, role in others:
        theirs = model_vocabulary(model, key)
        if ours is not None and theirs is not None:
            compare_vocabularies(theirs, ours, key, role)


def _algorithm_models(config: Config, selection: Selection) -> list[tuple[str, str]]:
    """``(key, model)`` of each model setting (``setting(model=True)``) set in the selected
    algorithm's own section (a distillation teacher)."""
    from operator import attrgetter

    import attrs

    from corerl.config.paths import path_keys_of

    registration = selection.algorithm.registration
    path = getattr(registration, "config_section", None)
    section = config.section(path) if path else None
    if section is None or not attrs.has(type(section)):
        return []
    return [(f"{path}.{key}", value) for key in path_keys_of(type(section), flag="model")
            if isinstance(value := attrgetter(key)(section), str)]


def _data_errors(data: Any, task_id: str | None) -> list[ConfigError]:
    from corerl.tasks.dataset import check_data_inputs

    return check_data_inputs(data, task_id)


def _raise_all(errors: list[ConfigError]) -> None:
    if errors:
        raise ConfigErrors(list(errors))


def _check_resume(config: Config, host: PluginHost) -> None:
    """A run directory holding a complete checkpoint resumes: with the recipe it started with."""
    from corerl.run.checkpoints import latest_checkpoint
    from corerl.run.record import check_same_recipe

    run = config.core.run
    if run.name is None:
        return
    path = Path(run.output_dir) / run.name
    if path.is_dir() and latest_checkpoint(path) is not None:
        check_same_recipe(path, config, host)


def _say_where(error: CorerlError, config: Config) -> None:
    """Give ``error`` the origin of its key (the recipe file or override that set it) and, for a
    relative path a recipe gave that was found nowhere, where it was looked for."""
    from corerl.config.paths import where_looked
    from corerl.config.tree import origin_of, value_at

    if error.key is None:
        return
    if error.source is None:
        error.source = origin_of(error.key, config.origins)
    if any(words in error.message for words in NOT_FOUND):
        looked = where_looked(error.key, value_at(config.raw, error.key), config.origins)
        if looked is not None:
            error.hint = f"{error.hint}; {looked}" if error.hint else looked
        train_first = run_that_makes(str(value_at(config.raw, error.key)), error.source)
        if train_first is not None and error.message.startswith("model path "):
            error.hint = train_first


def run_that_makes(model: str, recipe: str | None) -> str | None:
    """For a missing model that is a run's final model (``<runs>/<name>/final``, as the
    distillation demo's teacher is), what to run first: the command the recipe's own comments give
    for ``run.name=<name>``, else the general form."""
    parts = Path(model).parts
    if len(parts) < 2 or parts[-1] != "final":
        return None
    name = parts[-2]
    command = f"corerl run <the recipe that trains it> run.name={name}"
    try:
        lines = Path(recipe).read_text(encoding="utf-8").splitlines() if recipe else []
    except OSError:
        lines = []
    for line in lines:
        text = line.strip().lstrip("#").strip()
        if line.strip().startswith("#") and text.startswith("corerl run ") and f"run.name={name}" in text:
            said, _, note = text.partition("#")
            command = said.strip() + (f" ({note.strip()})" if note.strip() else "")
            break
    return f"it is the final model of a run named {name!r}, not made yet: train it first with {command}, then run this again"


#: what the messages of a file or folder that is not there say
NOT_FOUND = ("does not exist", "not a local folder", "No such file")
