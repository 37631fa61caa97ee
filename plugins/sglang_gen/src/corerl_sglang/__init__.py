"""corerl's SGLang generation backend (``policy.generation.backend: sglang``)."""
