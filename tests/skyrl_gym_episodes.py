"""Playing corerl-skyrl-gym's own environments in its tests: an environment registered as its SkyRL
entry point registers it, and an episode played turn by turn until it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import skyrl_gym

from corerl.config.dialects.skyrl import entry_points
from corerl.sdk import EnvironmentContext, EpisodeView
from corerl_skyrl_gym.environment import SkyRLGymEnvironment
from corerl_skyrl_gym.plugin import SkyRLGymSettings


def registered_as_its_entry_point(env_id: str, entry: str) -> Iterator[SkyRLGymEnvironment]:
    """The adapter with ``env_id`` registered as SkyRL's entry point of that id registers it (which
    must be ``entry``); deregistered after (a fixture's body: ``yield from``)."""
    (target, registered), = entry_points.by_id(env_id).implies
    assert (target, registered) == (f"env.skyrl_gym.register.{env_id}", entry)
    made = SkyRLGymEnvironment(EnvironmentContext(SkyRLGymSettings(register={env_id: registered}), seed=0))
    yield made
    skyrl_gym.envs.registration.deregister(env_id)


def play(environment: Any, row: dict[str, Any], responses: list[str]) -> list[Any]:
    """The episode's turns, each answered with the state of the one before, until one ends it."""
    turns, state = [], None
    for number in range(1, len(responses) + 1):
        turn = environment.step(EpisodeView(row=row, turn=number, responses=tuple(responses[:number]), state=state))
        turns.append(turn)
        state = turn.state
        if turn.done:
            break
    return turns
