"""Environments for the actor-pool tests (importable by Ray's workers as ``tests.environment_fixtures``)."""

from __future__ import annotations

import os
import time

from corerl.environments.contract import Turn


class Crashy:
    """Row kinds: ``die`` kills the actor's process, ``hang`` sleeps past any timeout, anything else
    answers with the process id (so a test sees which actor answered, and that one was restarted)."""

    def __init__(self, context) -> None:
        self.started = time.time()

    def step(self, episode):
        kind = episode.row["kind"]
        if kind == "die":
            os._exit(1)
        if kind == "hang":
            time.sleep(60)
        return Turn(reward=1.0, done=True, state={"pid": os.getpid()})
