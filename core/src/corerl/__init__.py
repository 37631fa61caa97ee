"""corerl: reinforcement-learning post-training for language models, with pluggable engines.

Plugin authors need :data:`hookimpl` and the registration classes; everything here imports
only light modules (no torch, vllm, megatron or deepspeed).
"""

from corerl.hookspecs import hookimpl
from corerl.registry import (
    GenerationBackend,
    OffloadPolicy,
    Reward,
    SequencePacker,
    Task,
    TrainingBackend,
)

__version__ = "0.1.0"

__all__ = [
    "GenerationBackend",
    "OffloadPolicy",
    "Reward",
    "SequencePacker",
    "Task",
    "TrainingBackend",
    "__version__",
    "hookimpl",
]
