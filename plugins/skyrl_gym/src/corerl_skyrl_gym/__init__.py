"""corerl-skyrl-gym: SkyRL's skyrl-gym environments played in corerl's multi-turn rollout."""

__version__ = "0.1.0"
