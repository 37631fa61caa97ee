"""The asynchronous producer in-process (a scripted rollout stands in for generation, which is
not under test): a batch held back by the staleness bound starts as soon as the trainer's push
wakes it, not at the next poll, and the batches the bound lets start generate at once. And the
dedicated engine's push (its worker, the transport, replaced by a recorder): it returns before
the worker has taken the weights, the version counts once it has, and hand-overs stay in order."""

from __future__ import annotations

import threading
import time

import torch

from corerl.asynchronous import producer as producer_module
from corerl.asynchronous.buffer import RolloutBuffer
from corerl.asynchronous.engine import DedicatedGeneration
from corerl.asynchronous.producer import RolloutProducer
from corerl.asynchronous.settings import AsyncSettings, async_settings
from corerl.config import config_from_mapping
from corerl.environments.rollout import Rollout
from corerl.generation.contract import Sample
from corerl.plugin_manager import PluginHost

BATCH = 2


def config(**asynchronous):
    return config_from_mapping({
        "policy": {"model_name": "builtin:tiny-qwen2",
                   "generation": {"colocated": {"enabled": False, "resources": {"gpus_per_node": 1}}}},
        "algorithm": {"batch_size": BATCH, "num_generations_per_prompt": 1, "async": {"enabled": True, **asynchronous}},
    }, PluginHost(discover=False, env={}))


class Task:
    """Prompts drawn in order, one number each."""

    def __init__(self):
        self.drawn = 0

    def state(self):
        return self.drawn

    def sample(self, count):
        prompts = [[self.drawn + i] for i in range(count)]
        self.drawn += count
        return prompts, [None] * count


class Scripted:
    """A rollout that records when each batch started and holds it ``seconds`` (a tool's wait);
    its tokens are stamped with ``version()``."""

    def __init__(self, version, seconds=0.0):
        self.version, self.seconds, self.started, self.running, self.most = version, seconds, [], 0, 0
        self.lock = threading.Lock()

    def run(self, prompts, items, sampling, n, max_seq_length):
        with self.lock:
            self.started.append((prompts[0][0] // BATCH, time.perf_counter()))
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        samples = [[Sample(prompt_ids=tuple(p), completion_ids=(1,), logprobs=(0.0,), finish_reason="stop",
                           versions=(self.version(),))]
                   for p in prompts]
        return Rollout(samples, [[0.0] for _ in prompts])


def producer(rollout, version, **asynchronous):
    settings_config = config(**asynchronous)
    settings = async_settings(settings_config)
    buffer = RolloutBuffer(settings.sampler, settings.max_staleness)
    return RolloutProducer(rollout, Task(), settings_config, settings, buffer, version), buffer


def test_a_push_wakes_the_batch_the_new_version_lets_start(monkeypatch):
    monkeypatch.setattr(producer_module, "POLL_S", 60.0)  # without the wake, batch 1 would wait a minute
    version = [0]
    rollout = Scripted(lambda: version[0])
    made, buffer = producer(rollout, lambda: version[0], max_staleness=0)
    made.start()
    try:
        groups = buffer.take(BATCH, 0, timeout=10)
        time.sleep(0.2)
        assert [b for b, _ in rollout.started] == [0]  # staleness 0: batch 1 waits for version 1
        made.settle([g.key for g in groups])
        version[0] = 1
        pushed = time.perf_counter()
        made.wake()
        buffer.take(BATCH, 1, timeout=10)
        assert [b for b, _ in rollout.started] == [0, 1] and rollout.started[1][1] - pushed < 10
    finally:
        made.stop()


def test_the_batches_the_bound_lets_start_wait_on_their_tools_together():
    """``max_inflight_prompts`` of three batches, staleness 2: three rollouts held 0.5 s each
    overlap, so all three batches are ready after about one wait, not three."""
    rollout = Scripted(lambda: 0, seconds=0.5)
    made, buffer = producer(rollout, lambda: 0, max_staleness=2, max_inflight_prompts=3 * BATCH)
    start = time.perf_counter()
    made.start()
    try:
        for _ in range(3):
            buffer.take(BATCH, 0, timeout=10)
        assert rollout.most == 3 and time.perf_counter() - start < 1.4
        time.sleep(0.2)
        assert len(rollout.started) == 3  # the bound holds batch 3 until version 1
    finally:
        made.stop()


class Busy(Scripted):
    """A rollout that works ``seconds`` of CPU in this process (decoding, an environment's Python)."""

    def run(self, prompts, items, sampling, n, max_seq_length):
        # this thread's CPU, not the process's: other threads' work must not cut the rollout short
        start = time.thread_time()
        while time.thread_time() - start < self.seconds:
            sum(range(1000))
        return Scripted(self.version).run(prompts, items, sampling, n, max_seq_length)


def test_each_batch_reports_the_cpu_this_process_spent_generating_it():
    """``time/generation_driver_cpu``: a rollout busy 0.3 s of CPU here reports about that; one that
    only waits 0.3 s (its tools elsewhere) reports next to none."""
    for rollout, low, high in ((Busy(lambda: 0, seconds=0.3), 0.28, 1.0), (Scripted(lambda: 0, seconds=0.3), 0.0, 0.1)):
        made, buffer = producer(rollout, lambda: 0, max_staleness=0)
        made.start()
        try:
            groups = buffer.take(BATCH, 0, timeout=10)
        finally:
            made.stop()
        cpu = groups[0].metrics["time/generation_driver_cpu"]
        assert low <= cpu <= high and groups[0].metrics["time/generation"] >= 0.3


class Recorder:
    """The worker's side of a hand-over: takes each version once ``gate`` opens, in the order sent."""

    def __init__(self):
        self.gate, self.taken = threading.Event(), []

    def update_weights(self, weights, version):
        assert self.gate.wait(10)
        self.taken.append((version, float(weights[0][1][0])))
        return version

    def sync(self):
        return self.taken[-1][0]


class Recorded(DedicatedGeneration):
    def _start(self):
        self.actor, self.pid = Recorder(), 0

    def _call(self, method, *args):
        return getattr(self.actor, method)(*args)

    def _shutdown_actor(self):
        self.actor = None


def test_a_push_returns_before_the_worker_takes_the_weights_and_the_version_counts_once_it_has():
    engine = Recorded(None, None, AsyncSettings(enabled=True, in_flight="wait"))
    told = []
    engine.on_version = lambda: told.append(engine.version)
    try:
        start = time.perf_counter()
        engine.push([("w", torch.tensor([1.0]))], 1)
        assert time.perf_counter() - start < 5 and engine.version == 0 and not told  # the worker has not taken it
        engine.actor.gate.set()
        engine.settle()
        assert engine.version == 1 and told == [1]
        for version in (2, 3):  # each push waits for the one before it (its file is rewritten)
            engine.push([("w", torch.tensor([float(version)]))], version)
        engine.update_weights([("w", torch.tensor([4.0]))])  # the contract's refit: in use on return
        assert engine.actor.taken == [(1, 1.0), (2, 2.0), (3, 3.0), (3, 4.0)] and engine.version == 3
        assert told == [1, 2, 3, 3]
    finally:
        engine.shutdown()
