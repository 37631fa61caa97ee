"""The sampling seeds of generation steps, shared by the algorithms (:mod:`corerl.algorithms.batches`
re-exports :func:`step_seed`) and the asynchronous producer (:mod:`corerl.asynchronous.producer`),
which draws a step's batch with the seed the synchronous step would have used. Imports no engine.

Plugins call :func:`step_seed` too (through :mod:`corerl.sdk`), so it checks its arguments first:
a plugin's wrong argument is a :class:`~corerl.errors.PluginError` naming the plugin and the
function, not corerl's bug.
"""

from __future__ import annotations

import hashlib
import numbers

from corerl.errors import argument_error


def step_seed(seed: int, step: int, batch: int = 0) -> int:
    """The sampling seed of one step (of its ``batch``-th generation batch, where a step draws
    several): reproducible run to run, and far from the seeds of other steps (engines derive
    per-sample seeds as seed + offset, so neighbouring integers would replay the previous step's
    random draws)."""
    for name, value in (("seed", seed), ("step", step), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise argument_error("step_seed", f"{name} must be an integer, got {type(value).__name__} {value!r}",
                                 hint="pass the run's algorithm.seed and the phase's done (plain ints)")
    seed, step, batch = int(seed), int(step), int(batch)
    text = f"{seed}:{step}" if batch == 0 else f"{seed}:{step}:{batch}"
    digest = hashlib.blake2b(text.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF
