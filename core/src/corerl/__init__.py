"""corerl: reinforcement-learning post-training for language models, with pluggable engines.

Users need :func:`train`, :class:`GRPOTrainer`, :class:`PPOTrainer`, :class:`SFTTrainer` and
:class:`DPOTrainer`; plugin authors need :data:`hookimpl` and the registration classes, the same
names :mod:`corerl.sdk` exports (both take them from :mod:`corerl.component_kinds`). Everything
here imports only light modules (no torch, vllm, megatron or deepspeed).
"""

from corerl.import_paths import install_moved_module_finder

install_moved_module_finder()  # the modules' old paths (issue 74) import, with a DeprecationWarning

from corerl import component_kinds  # noqa: E402
from corerl.api import DPOTrainer, GRPOTrainer, PPOTrainer, SFTTrainer, train  # noqa: E402
from corerl.component_kinds import *  # noqa: E402, F403  (registering: hookimpl, CONTRACT_VERSION, the registration classes)
from corerl.config import presets  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DPOTrainer",
    "PPOTrainer",
    "GRPOTrainer",
    "SFTTrainer",
    "train",
    "__version__",
    "presets",
]
# the one list of registering names, which corerl.sdk exports too
__all__ += component_kinds.__all__
