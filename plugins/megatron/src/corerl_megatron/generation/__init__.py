"""The ``megatron`` generation backend: decoding with the training ranks' own model."""
