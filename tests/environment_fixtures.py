"""Environments for the actor-pool tests (importable by Ray's workers as ``tests.environment_fixtures``),
and the hf generation engine on a tiny model that the rollout and endpoint tests drive."""

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


def hf_engine(folder):
    """The hf generation backend, loaded with a tiny model built in ``folder``."""
    from corerl.config import config_from_mapping
    from corerl.generation.hf import HFGenerationBackend
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost

    model = build_tiny_model(folder, hidden_size=64, num_layers=2, vocab_size=128)
    config = config_from_mapping({"policy": {"model_name": str(model), "generation": {"backend": "hf"}}},
                                 PluginHost(discover=False, env={}))
    backend = HFGenerationBackend(config)
    backend.load_hf(str(model))
    return backend
