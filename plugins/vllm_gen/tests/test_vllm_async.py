"""vLLM as asynchronous GRPO's generation engine: the generation worker (corerl.asynchronous.worker)
around the real vllm backend, with the engine in the worker's process as in the worker's Ray actor,
taking an update between two engine steps (continue), ending the call at it (abort), or loading it
when the call is over (wait). One engine for the module; each test starts from the original weights."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from corerl.asynchronous.worker import GenerationWorker
from corerl.config import config_from_mapping
from corerl.generation.contract import SamplingSettings
from corerl.plugin_manager import PluginHost

VOCAB = 128
SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=10, seed=5, ignore_eos=True)  # every sample 10 tokens
UNIFORM = -math.log(VOCAB)


class UpdateArrivesAt(GenerationWorker):
    """The worker, with version 1's weights arriving once every sample has ``at`` tokens (only the
    arrival's timing is arranged: the weights go through the worker's own path)."""

    at = 4
    arriving: list[tuple[str, torch.Tensor]] = []

    widest = 0  # the most samples one engine step has run (the streaming loop's)
    held: Any = None  # a threading.Event: once two samples step, set, and the loop waits for the next call

    def _between_tokens(self, generated: int | Sequence[int]) -> bool:
        least = generated if isinstance(generated, int) else min(generated)
        if least == self.at:
            with self.handover:
                self.pending = (1, self.arriving)
        return super()._between_tokens(generated)

    def _stepped(self, running: list[Any]) -> None:  # the streaming loop's step (the engine in this process)
        import time

        counts = [c for call in running for c in call.requests.counts()]
        self.widest = max(self.widest, len(counts))
        if self.held is not None and not self.held.is_set() and len(counts) >= 2:  # the next call joins first
            self.held.set()
            guard = time.monotonic() + 60  # a guard against a hang only
            while not self.incoming and time.monotonic() < guard:
                time.sleep(0.001)
        if counts and min(counts) == self.at:
            with self.handover:
                self.pending = (1, self.arriving)


def weights(model_dir: str, flat: bool) -> list[tuple[str, torch.Tensor]]:
    """The model's weights; ``flat``: the embedding and output layer zeroed, so that every next
    token has probability 1/vocab."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return [(name, torch.zeros_like(t) if flat and ("lm_head" in name or "embed_tokens" in name) else t.clone())
            for name, t in model.state_dict().items()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("vllm-async"), hidden_size=128, num_heads=4, num_kv_heads=2,
                                num_layers=2, vocab_size=VOCAB))  # head_dim 32: vLLM's CPU kernels


@pytest.fixture(scope="module")
def engine_worker(model_dir: str) -> Iterator[UpdateArrivesAt]:
    host = PluginHost(env={})
    config = config_from_mapping({"policy": {"model_name": model_dir, "max_seq_length": 64, "generation": {
        "backend": "vllm", "vllm_cfg": {"host": "driver", "cpu_kvcache_space_gib": 0.05, "tensor_parallel_size": 2}}}},
        host)
    # the engine binds its two workers' threads in this process's environment: put it back after, so that
    # a run this process starts later (a subprocess inherits it) does not take the two-list binding
    names = ("VLLM_CPU_OMP_THREADS_BIND", "_CORERL_SET_VLLM_CPU_OMP_THREADS_BIND")
    before = {name: os.environ.get(name) for name in names}
    worker = UpdateArrivesAt(host.generation_backends.get("vllm"), config, threads=None, in_flight="continue")
    try:
        worker.load_hf(model_dir)
        worker.arriving = weights(model_dir, flat=True)
        yield worker
    finally:
        worker.shutdown()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def worker(engine_worker: UpdateArrivesAt, model_dir: str) -> Any:
    """The module's worker on the original weights at version 0, an arrival at 4 tokens."""
    engine_worker.backend.update_weights(weights(model_dir, flat=False))
    engine_worker.version, engine_worker.at, engine_worker.pending, engine_worker.widest = 0, 4, None, 0
    engine_worker.held = None
    return engine_worker


def test_continue_loads_the_new_weights_between_two_engine_steps_and_stamps_them(worker):
    worker.in_flight = "continue"
    groups, aborted = worker.generate([[1, 2, 3], [4, 5]], SAMPLING, 2)
    assert not aborted and worker.version == 1
    for s in (s for g in groups for s in g):
        assert len(s.completion_ids) == 10  # the update does not end the request
        assert s.versions == (0,) * 4 + (1,) * 6
        # tokens from the fifth on come from the new (flat) weights: probability 1/vocab each
        assert all(abs(lp - UNIFORM) < 1e-4 for lp in s.logprobs[4:]), s.logprobs
        assert any(abs(lp - UNIFORM) > 1e-3 for lp in s.logprobs[:4])


def test_abort_ends_the_call_at_the_update_and_the_next_call_runs_on_the_new_weights(worker):
    worker.in_flight = "abort"
    groups, aborted = worker.generate([[1, 2, 3]], SAMPLING, 2)
    assert aborted
    assert all(len(s.completion_ids) == 4 and s.finish_reason == "length" and set(s.versions) == {0}
               for s in groups[0])
    worker.at = -1  # no further arrival
    again, aborted = worker.generate([[1, 2, 3]], SAMPLING, 1)
    assert not aborted and worker.version == 1 and set(again[0][0].versions) == {1}
    assert all(abs(lp - UNIFORM) < 1e-4 for lp in again[0][0].logprobs)


def test_wait_generates_without_the_hook_and_an_idle_worker_loads_an_update_at_once(worker, model_dir):
    worker.in_flight = "wait"
    assert worker.update_weights(weights(model_dir, flat=True), 3) == 3  # idle: loaded at once
    groups, aborted = worker.generate([[1, 2]], SAMPLING, 1)
    assert not aborted and set(groups[0][0].versions) == {3}
    assert all(abs(lp - UNIFORM) < 1e-4 for lp in groups[0][0].logprobs)


def test_the_stepped_engine_samples_what_vllms_own_generate_samples(worker):
    """The hook's stepping loop (one request a sample) draws the tokens ``LLM.generate`` draws."""
    worker.in_flight, worker.at = "continue", -1
    stepped, _ = worker.generate([[1, 2, 3], [4, 5]], SAMPLING, 2)
    plain = worker.backend.generate([[1, 2, 3], [4, 5]], SAMPLING, 2)
    assert [[s.completion_ids for s in g] for g in stepped] == [[s.completion_ids for s in g] for g in plain]
    for g_stepped, g_plain in zip(stepped, plain, strict=True):
        for a, b in zip(g_stepped, g_plain, strict=True):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


def test_calls_from_several_threads_share_the_engine_and_each_returns_when_its_own_requests_finish(worker):
    """Requests stream in as calls arrive and out as they finish: a short call that arrives while a
    long one runs joins the same engine steps, comes back first, and samples what it samples alone."""
    import threading

    import attrs

    assert worker.stream is not None  # the engine lives in this process
    worker.in_flight, worker.at = "continue", -1
    long_sampling = attrs.evolve(SAMPLING, max_new_tokens=60, request_seeds=(21, 22))
    short_sampling = attrs.evolve(SAMPLING, max_new_tokens=3, request_seeds=(23,))
    short_alone, _ = worker.generate([[7, 8]], short_sampling, 1)
    finished: list[str] = []  # the calls in the order they returned
    results: dict[str, Any] = {}

    def call(name: str, prompts: list[list[int]], sampling: SamplingSettings) -> None:
        results[name] = worker.generate(prompts, sampling, 1)
        finished.append(name)

    # the engine loop holds after the long call's first step until the short call has arrived: it
    # joins at the long call's second step, whatever the machine's load (no sleep, no clock)
    worker.held = threading.Event()
    long_call = threading.Thread(target=call, args=("long", [[1, 2, 3], [4, 5]], long_sampling))
    long_call.start()
    assert worker.held.wait(600), "the long call's two requests never stepped"  # a guard against a hang only
    call("short", [[7, 8]], short_sampling)
    long_running = "long" not in results  # its 60 tokens take far more engine steps than the short call's 3
    long_call.join(timeout=600)  # a guard against a hang only
    assert long_running and finished == ["short", "long"], (long_running, finished)
    assert worker.widest == 3  # one engine step ran the short call's request beside the long call's two
    assert all(len(s.completion_ids) == 60 for g in results["long"][0] for s in g)
    assert results["short"][0][0][0].completion_ids == short_alone[0][0].completion_ids
