"""``algorithm.max_epochs``: the run's steps once the training data is read.

An epoch is one pass over the task's training rows (its ``train_rows``): ``ceil(rows /
algorithm.batch_size)`` steps. With ``max_epochs`` set the run stops after that many epochs or
at ``algorithm.max_steps``, whichever comes first (NeMo RL's ``min(max_num_epochs x
len(dataloader), max_num_steps)``); ``max_steps`` unset means the epochs alone decide. The
count is written into ``algorithm.max_steps`` before any engine starts, so what reads it later
(the run loop, each backend's learning-rate schedule) sees the run's real length.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from corerl.errors import ConfigError

log = logging.getLogger(__name__)


def limit_to_epochs(config: Any, task: Any) -> None:
    """Set ``algorithm.max_steps`` from ``algorithm.max_epochs`` and the task's training rows
    (nothing where ``max_epochs`` is unset); a task without a fixed training set is refused."""
    algorithm = config.core.algorithm
    if algorithm.max_epochs is None:
        return
    rows = getattr(task, "train_rows", None)
    if not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"task {config.core.data.task!r} has no fixed training set to count epochs over (it "
                          "makes up its prompts)", key="algorithm.max_epochs",
                          hint="set algorithm.max_steps instead, or use a task that reads data files (data.task=dataset)")
    per_epoch = math.ceil(rows / algorithm.batch_size)
    steps = algorithm.max_epochs * per_epoch
    if algorithm.max_steps is None or steps < algorithm.max_steps:
        log.info("algorithm.max_epochs=%d: %d training rows, %d a step: %d steps", algorithm.max_epochs, rows,
                 algorithm.batch_size, steps)
        algorithm.max_steps = steps
