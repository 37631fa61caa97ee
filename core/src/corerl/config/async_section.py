"""The ``algorithm.async`` section (light: validation imports it without torch or Ray).

The core's own section, structured with the recipe (:func:`corerl.config.owned_sections`): it
lives with the config so that the config and the layers below read it without importing
:mod:`corerl.asynchronous`; :mod:`corerl.asynchronous.settings` re-exports it."""

from __future__ import annotations

from typing import Literal

import attrs

from corerl.config.fields import setting

SECTION = "algorithm.async"

#: how a training step takes its batch from the rollout buffer
SAMPLERS = ("in_order", "ready_first", "windowed")
#: what an in-flight weight update does to the requests the generation group is working on
IN_FLIGHT = ("continue", "abort", "wait")


@attrs.define(kw_only=True)
class AsyncSettings:
    """``algorithm.async``: generation runs continuously on a group of its own and training takes
    its batches from a rollout buffer, at most ``max_staleness`` policy versions behind (NeMo RL's
    ``grpo.async_grpo`` and ``async_rl`` sections map here)."""

    enabled: bool = setting(False, help="generate on a dedicated group while training runs (needs "
                                        "policy.generation.colocated.enabled=false)")
    max_staleness: int = setting(1, min=0, help="the most policy versions a trajectory may be behind the weights "
                                                "it trains (0: on-policy, the same steps as a synchronous run)")
    sampler: Literal["in_order", "ready_first", "windowed"] = setting(
        "in_order", help="in_order: prompt batches in the order they were drawn; ready_first: the groups that "
                         "finished first; windowed: the freshest groups within max_staleness, the rest dropped")
    in_flight: Literal["continue", "abort", "wait"] = setting(
        "continue", help="a weight update while requests are generated: continue (they go on with the new weights "
                         "from the next token), abort (they stop and resume from their tokens under the new "
                         "weights: partial rollouts), wait (the update lands when the requests in progress end)")
    max_inflight_prompts: int | None = setting(None, min=1, help="prompts being generated at once; unset: "
                                                                "algorithm.batch_size (one batch at a time)")
    max_buffered_rollouts: int | None = setting(None, min=1, help="finished prompt groups waiting in the buffer "
                                                                  "before generation pauses; unset: no bound "
                                                                  "beyond max_staleness")
    max_generation_failures: int = setting(3, min=0, help="generation worker deaths tolerated (each restarted, its "
                                                          "prompts requeued) before the run stops")
    simulate_training: bool = setting(False, help="a benchmark of the generation side: each training step sleeps "
                                                  "simulate_training_seconds instead of training (the weights never "
                                                  "change; each step's metrics say simulated=1 and carry no loss), "
                                                  "and each refit only advances the version, generation paused "
                                                  "simulate_refit_seconds")
    simulate_training_seconds: float = setting(30.0, min=0, help="with simulate_training: the seconds each "
                                                                 "simulated training step sleeps")
    simulate_refit_seconds: float = setting(0.0, min=0, help="with simulate_training: the seconds generation "
                                                             "stays paused at each simulated refit (as in_flight "
                                                             "says), standing in for the weights' transfer")
    generation_threads: int | None = setting(None, min=1, help="CPU threads of the generation worker on a machine "
                                                               "without GPUs; unset: half the cores (training keeps "
                                                               "the rest)")


def async_settings(config: object) -> AsyncSettings:
    """The run's ``algorithm.async`` section (its defaults when the recipe has none)."""
    section = config.section(SECTION)  # type: ignore[attr-defined]
    return section if isinstance(section, AsyncSettings) else AsyncSettings()
