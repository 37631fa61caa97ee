"""corerl-example-algorithm: a template third-party algorithm for corerl."""

__version__ = "0.1.0"
