"""The frozen models a run starts beside the policy: the reference an algorithm compares the policy
with, the config of a distillation teacher, and the reward model or LLM judge that rescores
samples (``reward_model``); each started through the run's :class:`~corerl.run.engines.Engines`
and shut down with the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.run.engines import Engines
    from corerl.run.policy_model import PolicyModel


class FrozenModels:
    """Frozen models beside the policy of ``model``, started through ``engines``."""

    def __init__(self, config: Config, selection: Selection, engines: Engines, model: PolicyModel) -> None:
        self.config, self.selection, self.engines, self.model = config, selection, engines, model

    def frozen_config(self, model_path: str, *, micro_batch_size: int | None = None, backend: str | None = None,
                      role: str | None = None, own_layout: Any = None, own_layout_key: str = "",
                      pool: str = "frozen") -> Config:
        """The config of a frozen model beside the policy (a distillation teacher, a reward model):
        the policy's, with ``model_path``, no adapter, ``micro_batch_size`` rows per scoring forward
        and training ``backend`` (unset: the policy's), in ``role`` (unset: the run's); with
        ``own_layout`` (``policy`` and ``cluster`` keys, given at ``own_layout_key``) laid over the
        recipe first (:func:`corerl.config.own_layout.with_own_layout`; cluster keys: its ranks in
        a Ray placement ``pool`` of their own)."""
        from corerl.config.own_layout import with_own_layout

        config = with_own_layout(self.config, own_layout, own_layout_key, pool)
        core = config.core
        policy = attrs.evolve(
            core.policy, model_name=model_path, training_backend=backend or core.policy.training_backend,
            logprob_micro_batch_size=micro_batch_size or core.policy.logprob_micro_batch_size,
            lora=attrs.evolve(core.policy.lora, enabled=False))
        return attrs.evolve(config, core=attrs.evolve(core, policy=policy), role=role or self.config.role)

    def start_reference(self) -> tuple[Any, Any]:
        """A frozen copy of the policy's starting weights on the policy's backend, and its offload
        (``policy.reference.cpu_offload``). With ``policy.lora`` the reference is the policy's own
        engine with the adapter switched off: no second copy of the weights is started."""
        from corerl.offload import ReferenceOffload

        if self.config.core.policy.lora.enabled:
            from corerl.lora.reference import AdapterOffReference

            reference: Any = AdapterOffReference(self.engines.training)
            return reference, ReferenceOffload(reference, enabled=False)
        assert self.selection.training_backend.registration is not None
        reference = self.engines.start(self.selection.training_backend.registration, self.model.starting_weights)
        return reference, ReferenceOffload(reference, self.config.core.policy.reference.cpu_offload)

    def start_reward_scorer(self) -> Any:
        """The scorer ``reward_model`` describes, its engine started here (shut down with the run)."""
        from corerl.config.critic import CRITIC_ROLE
        from corerl.environments.model_rewards import (
            JudgeScorer,
            ValueModelScorer,
            as_value_model,
            slot_token,
        )
        from corerl.models.tokenizer import check_same_vocabulary
        from corerl.offload import ReferenceOffload
        from corerl.run.directory import resolve_model

        settings, model, run_dir = self.config.core.reward_model, self.model, self.model.run_dir
        if settings.kind == "llm_judge":
            generation = self.engines.generation
            if settings.model_name is not None:
                path = resolve_model(settings.model_name, run_dir, key="reward_model.model_name", folder="judge")
                check_same_vocabulary(model.path, path, "reward_model.model_name", "judge")
                judge = attrs.evolve(self.config.core.policy, model_name=path)
                config = attrs.evolve(self.config, core=attrs.evolve(self.config.core, policy=judge))
                assert self.selection.generation_backend.registration is not None
                generation = self.engines.start(self.selection.generation_backend.registration, path, config=config)
            return JudgeScorer(generation, model.tokenizer, settings.judge_template, settings.judge_pattern,
                               settings.judge_max_score, settings.judge_max_new_tokens,
                               max_length=self.config.core.policy.max_seq_length)
        path = as_value_model(resolve_model(settings.model_name, run_dir, key="reward_model.model_name",
                                            folder="reward_model_base"), run_dir / "reward_value_model")
        check_same_vocabulary(model.path, path, "reward_model.model_name", "reward model")
        config = self.frozen_config(path, micro_batch_size=settings.micro_batch_size, role=CRITIC_ROLE)
        assert self.selection.training_backend.registration is not None
        engine = self.engines.start(self.selection.training_backend.registration, path, config=config)
        return ValueModelScorer(ReferenceOffload(engine, settings.cpu_offload), slot_token(model.tokenizer),
                                settings.micro_batch_size)
