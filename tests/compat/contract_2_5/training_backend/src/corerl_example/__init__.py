"""corerl-example-backend: a template third-party training backend for corerl."""

__version__ = "0.1.0"
