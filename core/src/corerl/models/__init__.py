"""Models corerl can build in code (no hub downloads)."""
