"""The critic's view of a recipe: the config PPO's value-model backend is built from.

A training backend reads ``policy.*`` (its ``policy.<backend>_cfg`` section, the optimizer, the
micro-batch sizes). The critic is trained by a training backend too, so it gets a config of the
same shape: the policy's, with the ``critic`` section's keys laid over ``policy``, each
``critic.<backend>_cfg`` section in place of the policy's ``policy.<backend>_cfg``, and
``role="critic"`` (the backend then loads a value model and computes values).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from corerl.config.section_paths import critic_section

if TYPE_CHECKING:
    from corerl.config import Config

__all__ = ["CRITIC_ROLE", "critic_config", "critic_layout_sections", "critic_section"]

CRITIC_ROLE = "critic"


def critic_layout_sections(config: Config) -> dict[str, str]:
    """``critic.<backend>_cfg`` path -> ``policy.<backend>_cfg`` path, for each such section the
    recipe gives."""
    given = config.raw.get("critic", {}) if isinstance(config.raw.get("critic"), dict) else {}
    return {f"critic.{key}": f"policy.{key}" for key in given if f"critic.{key}" in config.sections}


def critic_config(config: Config, backend: str | None = None, model_path: str | None = None) -> Config:
    """The config of the critic's training backend (see the module docstring): ``backend`` is the
    critic's training backend id (None: ``critic.training_backend``, else the policy's
    ``policy.training_backend``), ``model_path`` where the critic's checkpoint was resolved
    (None: ``critic.model_name``, else the policy's model)."""
    core, critic = config.core, config.core.critic
    layouts = critic_layout_sections(config)
    backend = backend or critic.training_backend or (None if layouts else core.policy.training_backend)
    policy = attrs.evolve(
        core.policy,
        model_name=model_path or critic.model_name or core.policy.model_name,
        training_backend=backend,
        train_micro_batch_size=critic.train_micro_batch_size or core.policy.train_micro_batch_size,
        logprob_micro_batch_size=critic.value_micro_batch_size or core.policy.logprob_micro_batch_size,
        max_grad_norm=critic.max_grad_norm, optimizer=critic.optimizer, scheduler=critic.scheduler,
    )
    sections = dict(config.sections)
    for critic_path, policy_path in layouts.items():
        sections[policy_path] = config.sections[critic_path]
    return attrs.evolve(config, core=attrs.evolve(core, policy=policy), sections=sections, role=CRITIC_ROLE)
