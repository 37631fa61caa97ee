"""The algorithms (GRPO first), written only against the backend contracts."""
