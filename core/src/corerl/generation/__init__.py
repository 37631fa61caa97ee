"""The generation-backend contract and the core's own transformers backend (``hf``)."""
