"""corerl-example-environment: a template third-party environment for corerl."""

__version__ = "0.1.0"
