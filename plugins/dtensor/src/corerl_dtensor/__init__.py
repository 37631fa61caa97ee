"""corerl-dtensor: the default training backend (FSDP2 + tensor parallel over DTensor)."""

__version__ = "0.1.0"
