"""corerl-plain-gen: a plain transformers generation backend."""
