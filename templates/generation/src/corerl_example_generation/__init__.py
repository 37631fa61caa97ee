"""A template corerl generation backend (``example_sampler``): see README.md."""
