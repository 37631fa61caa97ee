"""The core's rules of NeMo RL's dialect, by section: the algorithm sections
(:mod:`.algorithms`), ``policy``'s shared keys (:mod:`.policy`), ``data``, ``env`` and the
evaluation recipes (:mod:`.data`), ``checkpointing``, ``logger`` and ``cluster`` (:mod:`.run`).
An engine's section (``policy.<engine>_cfg``) is not here: the plugin that registers the engine
contributes its rules (:class:`corerl.registry.DialectSection`), and
:func:`corerl.config.dialects.nemo_rl_lookup.table` lays them over these."""

from __future__ import annotations

from corerl.config.dialects.nemo_rl_keys import algorithms, data, policy, run
from corerl.config.dialects.rules import Rule

#: NeMo RL key (or ``prefix.*``) -> what corerl does with it: the shared sections' rules
RULES: dict[str, Rule] = {**algorithms.RULES, **policy.RULES, **data.RULES, **run.RULES}
#: sections whose keys are all inert while their ``enabled`` is false (True: ``enabled`` itself acts)
SWITCHED_SECTIONS: dict[str, bool] = {**policy.SWITCHED_SECTIONS, **algorithms.SWITCHED_SECTIONS,
                                      **run.SWITCHED_SECTIONS}
#: sections whose ``enabled: true`` is refused: corerl has no such feature
UNSUPPORTED_SECTIONS: dict[str, str] = {**policy.UNSUPPORTED_SECTIONS, **algorithms.UNSUPPORTED_SECTIONS}
#: mappings taken whole (their keys are not NeMo RL's own: engine arguments, environment variables)
OPAQUE_KEYS: tuple[str, ...] = policy.OPAQUE_KEYS
#: a frozen model's settings that only training or generation read (relative to its section)
FROZEN_INERT: tuple[str, ...] = (
    "optimizer", "scheduler", "generation", "train_global_batch_size", "train_micro_batch_size",
    "generation_batch_size", "max_grad_norm", "offload_optimizer_for_logprob", "activation_checkpointing_enabled",
    "make_sequence_length_divisible_by", "logprob_chunk_size", "dynamic_batching", "sequence_packing")
#: the critic's keys that mean what the policy's do, moved from policy.* to critic.* (the engine
#: sections' ``value.<section>.`` join them)
CRITIC_LAYOUTS: tuple[str, ...] = ("value.optimizer.", "value.optimizer")
