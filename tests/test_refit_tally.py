"""Weight updates are seen: each one counted, with the tensors and bytes the generation engine
read (corerl.training.weights.REFITS), whatever the stream's form."""

from __future__ import annotations

import torch

from corerl.training.weights import EngineWeights, RefitTally, counted, send_weights


class Reading:
    """A generation engine that reads every tensor it is sent (the thing under test is the count)."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def update_weights(self, weights):  # noqa: ANN001, ANN201
        self.read += [name for name, _ in weights]


class Training:
    def __init__(self, stream) -> None:  # noqa: ANN001
        self.stream = stream

    def weight_stream(self):  # noqa: ANN201
        return self.stream()


WEIGHTS = {"embed.weight": torch.zeros(10, 4), "head.weight": torch.zeros(4, 10, dtype=torch.bfloat16)}


def test_an_update_is_counted_with_the_bytes_read():
    tally = RefitTally()
    read = [name for name, _ in counted(iter(WEIGHTS.items()), tally)]
    assert read == list(WEIGHTS) and tally.metrics() == {"refit/updates": 1.0, "refit/tensors": 2.0,
                                                         "refit/bytes": 40 * 4 + 40 * 2}
    list(counted(iter(list(WEIGHTS.items())[:1]), tally))  # the next update: its own tensors and bytes
    assert tally.metrics() == {"refit/updates": 2.0, "refit/tensors": 1.0, "refit/bytes": 160.0}


def test_engine_weights_stay_engine_weights_and_a_skipped_copy_reads_nothing():
    tally = RefitTally()
    shared = counted(EngineWeights("engine", lambda: iter(WEIGHTS.items())), tally)
    assert isinstance(shared, EngineWeights) and shared.engine == "engine"  # a backend may still skip the copy
    assert tally.metrics()["refit/bytes"] == 0 and tally.updates == 1
    assert [name for name, _ in shared] == list(WEIGHTS) and tally.bytes == 240


def test_send_weights_counts_into_the_process_tally():
    from corerl.training.weights import REFITS

    before = REFITS.updates
    engine = Reading()
    send_weights(Training(lambda: iter(WEIGHTS.items())), engine)
    assert engine.read == list(WEIGHTS) and REFITS.updates == before + 1 and REFITS.bytes == 240
