"""SkyRL's ``data.*`` and ``environment.*`` in corerl's configuration. Its parquet files hold
chat-message prompts (``prompt``), the environment's name (``env_class``) and the answer under
``reward_spec.ground_truth``; ``environment.env_class`` picks the environment, which corerl plays
through its SkyRL Gym adapter (environment ``skyrl_gym``, section ``env.skyrl_gym``)."""

from __future__ import annotations

from corerl.config.dialects.rules import Rule, acts, derived, inert

#: corerl's environment that plays SkyRL Gym's environments, and its settings section
GYM_ENVIRONMENT = "skyrl_gym"
GYM_SECTION = "env.skyrl_gym"


def _files(value: object) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]  # type: ignore[union-attr]


RULES: dict[str, Rule] = {
    "data.train_data": acts("data.train_files", _files, "SkyRL's layout: data.task dataset, chat-message prompts, "
                            "the answer at reward_spec.ground_truth"),
    "data.val_data": acts("data.held_out_files", _files),
    "data.dataloader.num_workers": inert("corerl reads the rows in the driver"),
    "data.dataloader.persistent_workers": inert("corerl reads the rows in the driver"),
    "environment.env_class": derived(f"data.env_name {GYM_ENVIRONMENT} and {GYM_SECTION}.env_class: the SkyRL Gym "
                                     "environment plays each episode"),
    "environment.skyrl_gym.max_env_workers": inert("corerl steps the environments in its rollout's own workers"),
    "environment.skyrl_gym.*": derived(f"the played environment's settings ({GYM_SECTION}.env_config); another "
                                       "environment's are inert"),
}
