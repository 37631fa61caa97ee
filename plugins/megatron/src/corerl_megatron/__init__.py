"""corerl-megatron: training and generation on megatron-core."""

__version__ = "0.1.0"
