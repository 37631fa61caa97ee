"""corerl: reinforcement-learning post-training for language models, with pluggable engines.

Users need :func:`train`, :class:`GRPOTrainer`, :class:`PPOTrainer`, :class:`SFTTrainer` and
:class:`DPOTrainer`; plugin authors need :data:`hookimpl` and the registration classes. Everything here imports only light modules
(no torch, vllm, megatron or deepspeed).
"""

from corerl import presets
from corerl.api import DPOTrainer, GRPOTrainer, PPOTrainer, SFTTrainer, train
from corerl.hookspecs import hookimpl
from corerl.registry import (
    Algorithm,
    Command,
    Environment,
    GenerationBackend,
    MemoryModel,
    OffloadPolicy,
    Preset,
    Reward,
    SequencePacker,
    Task,
    Tool,
    ToolCallParser,
    TrainingBackend,
)

__version__ = "0.1.0"

__all__ = [
    "DPOTrainer",
    "PPOTrainer",
    "GRPOTrainer",
    "SFTTrainer",
    "train",
    "Algorithm",
    "Command",
    "Environment",
    "GenerationBackend",
    "MemoryModel",
    "OffloadPolicy",
    "Preset",
    "Reward",
    "SequencePacker",
    "Task",
    "Tool",
    "ToolCallParser",
    "TrainingBackend",
    "__version__",
    "presets",
    "hookimpl",
]
