"""The support checks of the core's algorithms: config logic only, nothing heavy imported
(validation calls them; ``corerl validate`` stays free of torch)."""

from __future__ import annotations

from typing import Any

from corerl.errors import ConfigError


def check_sample_batches(config: Any) -> None:
    """``algorithm.optimizer_batch_size`` must divide a step's samples (GRPO and PPO)."""
    algorithm = config.core.algorithm
    samples = algorithm.batch_size * algorithm.num_generations_per_prompt
    rows = algorithm.optimizer_batch_size
    if rows is not None and samples % rows:
        raise ConfigError(f"must divide the {samples} samples of a step (algorithm.batch_size x "
                          f"num_generations_per_prompt), got {rows}", key="algorithm.optimizer_batch_size",
                          hint="pick a divisor of algorithm.batch_size x algorithm.num_generations_per_prompt")
