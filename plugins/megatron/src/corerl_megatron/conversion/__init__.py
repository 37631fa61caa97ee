"""Hugging Face <-> Megatron: name tables per family, the state-dict conversion, the converted-checkpoint store and ``corerl convert``."""
