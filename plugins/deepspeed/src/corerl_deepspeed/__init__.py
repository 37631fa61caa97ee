"""corerl-deepspeed: training on DeepSpeed ZeRO stages 1-3."""

__version__ = "0.1.0"
