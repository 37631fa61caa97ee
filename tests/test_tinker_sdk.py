"""``corerl serve`` driven by the official ``tinker`` SDK (0.38.0): the server runs in this
process (uvicorn on a thread, a free port) over a real :class:`PeftEngine` on the built-in tiny
Qwen2, and the SDK's ServiceClient, TrainingClient and SamplingClient talk to it over HTTP.

A supervised step lowers the loss; importance sampling trains on tokens sampled through the SDK,
with their logprobs equal to the trainer's; a saved state resumes identically; two clients at once
end as each alone; bad requests come back as the SDK's errors in one line, and a request that fails
inside the engine leaves the server and the other clients running. The protocol pieces (wire
format, futures' order) are checked without a model first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK (scripts/setup.sh installs tinker==0.38.0)")
from tinker import types  # noqa: E402

from corerl.run.tinker import wire  # noqa: E402
from corerl.run.tinker.engine import ForwardOutput, SampledSequence, ServiceError  # noqa: E402
from corerl.run.tinker.futures import ERROR, JSON, FutureTable, Outcome, Scheduler  # noqa: E402

BASE = "builtin:tiny-qwen2"
ALICE, BOB = "tml-alice-secret", "tml-bob-secret"
PROMPT = [2, 5, 9, 13, 17, 21]


# ------------------------------------------------------------------------ the protocol, no model


def test_a_forward_backward_request_the_sdk_encodes_reads_back_as_the_engine_s_datums():
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]),
                        loss_fn_inputs={"target_tokens": [4, 5, 6], "weights": [0.0, 1.0, 0.5]})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum, datum], loss_fn="ppo",
                                                          loss_fn_config={"clip_low_threshold": 0.7}),
        model_id=wire.model_id("ab" * 16, 3), seq_id=7)
    message = forward_backward_request_to_proto(request)
    message.forward_only = True  # as the SDK's forward() sets it
    raw = message.SerializeToString()
    call = wire.forward_backward_call(wire.read_forward_backward(raw, None))
    assert (call.model_id, call.seq_id, call.forward_only, call.loss_fn) == (wire.model_id("ab" * 16, 3), 7, True, "ppo")
    assert call.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7)}
    assert [d.tokens for d in call.data] == [[3, 4, 5]] * 2
    assert call.data[0].inputs == {"target_tokens": [4.0, 5.0, 6.0], "weights": [0.0, 1.0, 0.5]}


def test_the_sdk_decodes_what_the_server_writes():
    from tinker.proto.response_conv import (
        deserialize_forward_backward_output,
        deserialize_sample_response,
    )

    out = deserialize_forward_backward_output(wire.forward_output_bytes(ForwardOutput(
        outputs=[{"logprobs": [-1.0, -2.0], "elementwise_loss": [0.5, 0.25]}, {"logprobs": [-3.0], "elementwise_loss": [1.0]}],
        metrics={"loss:sum": 1.75})))
    assert out.metrics == {"loss:sum": 1.75}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]
    assert out.loss_fn_outputs[0]["elementwise_loss"].tolist() == [0.5, 0.25]
    sample = deserialize_sample_response(wire.sample_response_bytes(
        [SampledSequence([7, 8, 1], [-0.5, -0.25, -1.0], "stop"), SampledSequence([9], [-2.0], "length")]))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sample.sequences] == [
        ([7, 8, 1], [-0.5, -0.25, -1.0], "stop"), ([9], [-2.0], "length")]


def test_requests_are_refused_in_one_line_naming_the_field():
    with pytest.raises(ServiceError, match=r"^create_model\.lora_config\.rank: must be at least 1, got 0$"):
        wire.lora_spec(wire.Fields({"lora_config": {"rank": 0}}, "create_model"))
    with pytest.raises(ServiceError, match=r"^load_weights\.path: 'x' is not a tinker:// path"):
        wire.parse_path("x", "load_weights.path")
    with pytest.raises(ServiceError, match=r"^asample\.prompt_logprobs: not served here"):
        wire.sample_params(wire.Fields({"prompt_logprobs": True, "sampling_params": {}}, "asample"), max_tokens_limit=8)
    params = wire.sample_params(wire.Fields({"sampling_params": {"stop": []}}, "asample"), max_tokens_limit=8)
    assert (params.max_tokens, params.stop_at_eos, params.stop_tokens) == (8, False, [])
    assert wire.sample_params(wire.Fields({"sampling_params": {}}, "asample"), max_tokens_limit=8).stop_at_eos


def test_a_model_s_requests_run_in_seq_id_order_and_a_resend_gets_the_same_future():
    async def scenario() -> list[int]:
        table = FutureTable()
        scheduler = Scheduler(table, gap_seconds=30)
        ran: list[int] = []

        def job(n: int) -> Any:
            return lambda: (ran.append(n), Outcome(JSON, {"n": n}))[1]

        scheduler.open_model("m")
        ids = {n: scheduler.ordered("t", "forward_backward", "m", n, job(n)) for n in (3, 2)}
        assert scheduler.ordered("t", "forward_backward", "m", 3, job(99)) == ids[3]  # a resend
        scheduler.start()
        await asyncio.sleep(0.2)
        assert ran == [] and await table.wait(ids[3], 0.05) is None  # held for seq 1
        ids[1] = scheduler.ordered("t", "forward_backward", "m", 1, job(1))
        results = [await table.wait(ids[n], 5) for n in (1, 2, 3)]
        assert [r.payload["n"] for r in results if r is not None] == [1, 2, 3]
        late = await table.wait(scheduler.ordered("t", "forward_backward", "m", 2, job(2)), 1)
        assert late is not None and late.payload["n"] == 2  # seq 2 again: its first future
        stale = scheduler.ordered("t", "optim_step", "m", 0, job(0))
        outcome = await table.wait(stale, 1)
        assert outcome is not None and outcome.kind == ERROR and "seq_id" in outcome.payload["error"]
        scheduler.stop()
        return ran

    assert asyncio.run(scenario()) == [1, 2, 3]


# -------------------------------------------------------------------- the server, the real SDK


class Served:
    def __init__(self, url: str, service: Any, state_dir: Path) -> None:
        self.url, self.service, self.state_dir = url, service, state_dir

    def client(self, key: str = ALICE) -> Any:
        return tinker.ServiceClient(base_url=self.url, api_key=key)


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``corerl serve``'s application over a PeftEngine on the tiny Qwen2, on a free port, two keys."""
    from corerl.environments.http_serving import BackgroundServer
    from corerl.run.tinker.peft_engine import PeftEngine
    from corerl.run.tinker.server import build_app
    from corerl.run.tinker.service import Limits, Service

    folder = tmp_path_factory.mktemp("tinker")
    engine = PeftEngine(BASE, max_adapters=12, work_dir=folder / "model")
    service = Service(engine, folder / "state", Limits(poll_seconds=5, max_sample_tokens=16))
    with pytest.MonkeyPatch.context() as patch, \
            BackgroundServer(build_app(service, [ALICE, BOB]), name="corerl-serve-test") as server:
        patch.setenv("TINKER_TELEMETRY", "0")  # the SDK's telemetry off (the server would drop it)
        yield Served(server.url, service, folder / "state")


@pytest.fixture(scope="module")
def chunking_server(tinker_server: Served) -> Iterator[Served]:
    """A second server on the same engine whose small body limit makes the SDK split a batch into
    chunks (its client config caps a chunk at half the limit)."""
    from corerl.environments.http_serving import BackgroundServer
    from corerl.run.tinker.server import build_app
    from corerl.run.tinker.service import Limits, Service

    service = Service(tinker_server.service.engine, tinker_server.state_dir.parent / "state-small",
                      Limits(poll_seconds=5, max_body_bytes=8192))
    with BackgroundServer(build_app(service, [ALICE]), name="corerl-serve-test-small") as server:
        yield Served(server.url, service, tinker_server.state_dir.parent / "state-small")


def _datum(tokens: list[int], weights: list[float] | None = None) -> Any:
    """Next-token prediction on ``tokens``: input tokens[:-1], targets tokens[1:]."""
    inputs: dict[str, Any] = {"target_tokens": tokens[1:]}
    if weights is not None:
        inputs["weights"] = weights
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


BATCH = [[2, 7, 11, 13, 7, 11, 13, 7], [2, 30, 31, 32, 33, 34]]


def _supervised(client: Any, seed: int, steps: int, lr: float = 5e-3) -> tuple[list[float], list[float]]:
    """``steps`` cross-entropy steps on BATCH from a fresh rank-4 adapter: the losses, then the
    logprobs after the last step."""
    training = client.create_lora_training_client(BASE, rank=4, seed=seed).result()
    data = [_datum(row, [1.0] * (len(row) - 1)) for row in BATCH]
    losses = []
    for _ in range(steps):
        result = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(result.result().metrics["loss:sum"])
        step.result()
    after = training.forward(data, "cross_entropy").result()
    return losses, [x for o in after.loss_fn_outputs for x in o["logprobs"].tolist()]


def test_a_supervised_step_lowers_the_loss_on_the_same_batch(tinker_server: Served):
    with tinker_server.client() as client:
        training = client.create_lora_training_client(BASE, rank=4, seed=1).result()
        info = training.get_info()
        assert (info.model_data.model_name, info.lora_rank) == (BASE, 4)
        # the tokenizer the server points the SDK at: the base model's own folder
        assert training.get_tokenizer().name_or_path == str(tinker_server.service.engine.model_path)
        data = [_datum(row, [1.0] * (len(row) - 1)) for row in BATCH]
        before = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=1e-2))  # submitted before waiting, as the SDK allows
        first = before.result()
        assert step.result().metrics is not None
        logprobs = [o["logprobs"].tolist() for o in first.loss_fn_outputs]
        assert [len(lp) for lp in logprobs] == [len(row) - 1 for row in BATCH]
        assert first.metrics["loss:sum"] == pytest.approx(-sum(sum(lp) for lp in logprobs), rel=1e-5)
        after = training.forward(data, "cross_entropy").result().metrics["loss:sum"]
        assert after < first.metrics["loss:sum"] - 0.05
    # leaving the `with` finishes the session: its adapter is freed from the engine
    deadline = time.monotonic() + 10
    while _held(tinker_server, training.model_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _held(tinker_server, training.model_id)
    assert training.model_id not in tinker_server.service.models


def _held(served: Served, model_id: str) -> bool:
    """Whether the engine still holds ``model_id``'s adapter."""
    try:
        served.service.engine.info(model_id)
    except ServiceError:
        return False
    return True


def test_importance_sampling_trains_on_tokens_sampled_through_the_sdk(tinker_server: Served):
    with tinker_server.client() as client:
        training = client.create_lora_training_client(BASE, rank=4, seed=2).result()
        training.forward_backward([_datum(BATCH[0], [1.0] * (len(BATCH[0]) - 1))], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # weights away from the base's
        sampler = training.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=[])
        sampled = sampler.sample(types.ModelInput.from_ints(PROMPT), num_samples=4, sampling_params=params).result()
        assert len(sampled.sequences) == 4
        data, advantages = [], [1.0, -1.0, 0.5, -0.5]
        for sequence, advantage in zip(sampled.sequences, advantages, strict=True):
            assert len(sequence.tokens) == 6 and len(sequence.logprobs) == 6 and sequence.stop_reason == "length"
            tokens = PROMPT + sequence.tokens
            pad = len(PROMPT) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                "target_tokens": tokens[1:], "logprobs": [0.0] * pad + sequence.logprobs,
                "advantages": [0.0] * pad + [advantage] * len(sequence.tokens)}))
        result = training.forward_backward(data, "importance_sampling")
        step = training.optim_step(types.AdamParams(learning_rate=1e-2))
        out = result.result()
        step.result()
        for sequence, output in zip(sampled.sequences, out.loss_fn_outputs, strict=True):  # the trainer's logprobs: the sampler's
            assert output["logprobs"].tolist()[len(PROMPT) - 1:] == pytest.approx(sequence.logprobs, abs=1e-4)
        # the same weights give ratio 1: the loss is -sum(advantages) over the sampled tokens
        assert out.metrics["loss:sum"] == pytest.approx(-6 * sum(advantages), abs=1e-3)
        named = training.save_weights_for_sampler("after-is").result().path
        assert named == f"tinker://{training.model_id}/sampler_weights/after-is"
        greedy = types.SamplingParams(max_tokens=5, temperature=0.0)
        from_path = client.create_sampling_client(model_path=named).result().sample(
            types.ModelInput.from_ints(PROMPT), 1, greedy).result().sequences[0].tokens
        live = training.save_weights_and_get_sampling_client().result().sample(
            types.ModelInput.from_ints(PROMPT), 1, greedy).result().sequences[0].tokens
        assert from_path == live and len(live) >= 1
        base = client.create_sampling_client(base_model=BASE).result()  # no adapter: the base model's weights
        assert base.get_base_model() == BASE
        assert len(base.sample(types.ModelInput.from_ints(PROMPT), 2, greedy).result().sequences) == 2


def test_a_batch_the_sdk_sends_in_chunks_first_chunk_last_trains_as_one_request(tinker_server: Served,
                                                                                 chunking_server: Served):
    rows = [[2, 3 + i % 50, 60 + i % 40, 7, 11, 13, 17, 19] for i in range(120)]
    data = [_datum(row, [1.0] * (len(row) - 1)) for row in rows]
    results, requests = {}, {}
    for served in (tinker_server, chunking_server):
        before = served.service.table.created["forward_backward"]
        with served.client() as client:
            training = client.create_lora_training_client(BASE, rank=4, seed=8).result()
            fb = training.forward_backward(data, "cross_entropy")
            step = training.optim_step(types.AdamParams(learning_rate=1e-2))
            loss = fb.result().metrics["loss:sum"]
            step.result()
            after = training.forward(data[:3], "cross_entropy").result()
            results[served.url] = loss, [x for o in after.loss_fn_outputs for x in o["logprobs"].tolist()]
        requests[served.url] = served.service.table.created["forward_backward"] - before
    whole, chunked = results[tinker_server.url], results[chunking_server.url]
    assert chunked[0] == pytest.approx(whole[0], rel=1e-5)
    assert chunked[1] == pytest.approx(whole[1], abs=1e-5)
    # the SDK did split it: the small server took several forward_backward requests for the one call
    assert (requests[tinker_server.url], requests[chunking_server.url] > 2) == (1, True), requests


def _adapter(served: Served, path: str) -> dict[str, Any]:
    """The adapter tensors saved under ``path`` (alice's), as the server finds them."""
    from safetensors.torch import load_file

    from corerl.run.tinker.peft_engine import ADAPTER_FILE
    from corerl.run.tinker.service import tenant_of

    _, folder, _ = served.service.saved(tenant_of(ALICE), path, "test", "weights")
    return load_file(str(folder / "engine" / ADAPTER_FILE))


def test_save_and_load_state_resume_identically(tinker_server: Served):
    data = [_datum(row, [1.0] * (len(row) - 1)) for row in BATCH]
    adam = types.AdamParams(learning_rate=1e-2)
    with tinker_server.client() as client:
        first = client.create_lora_training_client(BASE, rank=4, seed=3).result()
        first.forward_backward(data, "cross_entropy")
        first.optim_step(adam).result()
        saved = first.save_state("step-1").result().path
        assert saved == f"tinker://{first.model_id}/weights/step-1"
        loss = first.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
        first.optim_step(adam).result()
        ended = first.save_state("step-2").result().path

    with tinker_server.client() as client:  # a new session, the same key: resumes from the saved state
        resumed = client.create_training_client_from_state_with_optimizer(saved).result()
        assert resumed.get_info().lora_rank == 4
        assert resumed.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] == loss
        resumed.optim_step(adam).result()
        again = resumed.save_state("step-2").result().path
        # loading into an existing client (the SDK's deprecated TrainingClient.load_state) rewinds it
        with pytest.warns(Warning):
            resumed.load_state_with_optimizer(saved).result()
        assert resumed.forward(data, "cross_entropy").result().metrics["loss:sum"] == loss
        fresh = client.create_training_client_from_state(saved).result()  # weights only: a new Adam
        fresh.forward_backward(data, "cross_entropy")
        fresh.optim_step(adam).result()
        no_optimizer = fresh.save_state("step-2").result().path
    expected, got, other = (_adapter(tinker_server, p) for p in (ended, again, no_optimizer))
    assert set(got) == set(expected)
    assert all((got[k] == expected[k]).all() for k in expected)
    assert any(not (other[k] == expected[k]).all() for k in expected)  # the optimizer state mattered


def test_two_concurrent_clients_each_with_an_adapter_end_as_each_alone(tinker_server: Served):
    def run(seed: int, into: dict[int, Any]) -> None:
        with tinker_server.client() as client:
            into[seed] = _supervised(client, seed, steps=3)

    together: dict[int, Any] = {}
    threads = [threading.Thread(target=run, args=(seed, together)) for seed in (11, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    alone: dict[int, Any] = {}
    for seed in (11, 12):
        run(seed, alone)
    assert set(together) == {11, 12}
    for seed in (11, 12):
        assert together[seed][0] == pytest.approx(alone[seed][0], rel=1e-6)
        assert together[seed][1] == pytest.approx(alone[seed][1], abs=1e-6)
    assert together[11][0][-1] != pytest.approx(together[12][0][-1], rel=1e-6)  # two adapters, not one


def test_a_silent_session_ends_and_frees_its_adapters(tinker_server: Served):
    service = tinker_server.service
    with tinker_server.client() as client:
        training = client.create_lora_training_client(BASE, rank=4, seed=9).result()
        assert _held(tinker_server, training.model_id)
        ended = service.reap(now=time.monotonic() + service.limits.session_timeout + 1)  # as if it went silent
        assert training.model_id.split(":")[0] in ended
        deadline = time.monotonic() + 10
        while _held(tinker_server, training.model_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _held(tinker_server, training.model_id)
        with pytest.raises(tinker.RequestFailedError) as gone:
            training.forward([_datum(BATCH[0])], "cross_entropy").result()
        assert f"forward.model_id: no training model '{training.model_id}' for this API key" in _one_line(gone.value)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_bad_requests_come_back_as_the_sdk_s_errors_in_one_line(tinker_server: Served):
    import httpx

    with tinker_server.client() as alice, tinker_server.client(BOB) as bob:
        with pytest.raises(tinker.RequestFailedError) as unknown:
            alice.create_lora_training_client("no-such/model", rank=4).result()
        assert unknown.value.category == "user"
        assert "create_model.base_model: 'no-such/model' is not served here" in _one_line(unknown.value)

        training = alice.create_lora_training_client(BASE, rank=4, seed=4).result()
        data = [_datum(BATCH[0], [1.0] * (len(BATCH[0]) - 1))]
        with pytest.raises(tinker.RequestFailedError) as loss:
            training.forward_backward(data, "dro").result()
        assert loss.value.category == "user" and "loss_fn 'dro' is not supported" in _one_line(loss.value)
        with pytest.raises(tinker.RequestFailedError) as rank:
            alice.create_lora_training_client(BASE, rank=100000).result()
        assert "rank" in _one_line(rank.value)

        saved = training.save_state("mine").result().path
        sampler_path = training.save_weights_for_sampler("mine").result().path
        with pytest.raises(tinker.RequestFailedError) as theirs:
            bob.create_training_client_from_state(saved).result()
        assert theirs.value.category == "user" and "is not this client's" in _one_line(theirs.value)
        with pytest.raises(tinker.BadRequestError) as sampling:
            bob.create_sampling_client(model_path=sampler_path).result()
        assert "is not this client's" in _one_line(sampling.value)

        # and alice's client still trains after all of that
        training.forward_backward(data, "cross_entropy").result()
        training.optim_step(types.AdamParams()).result()

    missing = httpx.post(f"{tinker_server.url}/api/v1/create_session", json={})
    assert missing.status_code == 401
    assert missing.json() == {"error": "no X-API-Key header; set TINKER_API_KEY to a key the server was started with "
                                       "(corerl serve --api-key-env)", "category": "user"}
    with pytest.raises(tinker.AuthenticationError) as wrong:
        tinker.ServiceClient(base_url=tinker_server.url, api_key="tml-not-a-key-it-knows").create_lora_training_client(
            BASE, rank=4).result()
    assert "not one this server accepts" in _one_line(wrong.value)
    huge = httpx.post(f"{tinker_server.url}/api/v1/telemetry", content=b"x" * (65 * 2**20),
                      headers={"X-API-Key": ALICE})
    assert huge.status_code == 413 and "limit" in huge.json()["error"]


def test_a_request_failing_inside_the_engine_fails_alone(tinker_server: Served, monkeypatch: pytest.MonkeyPatch):
    """A bug in one request (here the engine's optim_step raising for one model) fails that future
    with the SDK's "server" error in one line; the server and the other client go on."""
    engine = tinker_server.service.engine
    original = engine.optim_step
    with tinker_server.client() as alice, tinker_server.client(BOB) as bob:
        broken = alice.create_lora_training_client(BASE, rank=4, seed=5).result()
        healthy = bob.create_lora_training_client(BASE, rank=4, seed=6).result()

        def optim_step(model_id: str, adam: Any) -> Any:
            if model_id == broken.model_id:
                raise RuntimeError("boom\nsecond line")
            return original(model_id, adam)

        monkeypatch.setattr(engine, "optim_step", optim_step)
        data = [_datum(BATCH[1], [1.0] * (len(BATCH[1]) - 1))]
        broken.forward_backward(data, "cross_entropy")
        with pytest.raises(tinker.RequestFailedError) as failed:
            broken.optim_step(types.AdamParams()).result()
        assert failed.value.category == "server"
        assert "the server failed this request: RuntimeError: boom for" in _one_line(failed.value)
        healthy.forward_backward(data, "cross_entropy").result()
        assert healthy.optim_step(types.AdamParams()).result() is not None
        assert broken.forward(data, "cross_entropy").result().metrics["loss:sum"] > 0


# ------------------------------------------------------------------------------------- the command


def test_corerl_serve_refuses_to_start_without_an_api_key_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]):
    from corerl.cli import main

    monkeypatch.delenv("CORERL_SERVE_API_KEY", raising=False)
    assert main(["serve", "--base-model", BASE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("corerl: error: corerl serve needs an API key and $CORERL_SERVE_API_KEY is unset or empty")
    assert "\n" not in err
    monkeypatch.setenv("MY_KEYS", "tml-one, secret-two")
    assert main(["serve", "--base-model", BASE, "--api-key-env", "MY_KEYS"]) == 2
    assert "does not start with tml-" in capsys.readouterr().err
    monkeypatch.setenv("MY_KEYS", "tml-one")
    assert main(["serve", "--api-key-env", "MY_KEYS"]) == 2
    assert "needs a base model: give a RECIPE (its policy.model_name) or --base-model" in capsys.readouterr().err


def test_corerl_serve_takes_the_base_model_from_the_recipe_and_binds_loopback_by_default():
    import argparse

    from corerl.recipes import DEMO_RECIPE
    from corerl.run.tinker.command import add_arguments, base_model_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(DEMO_RECIPE), "policy.model_name=builtin:tiny-qwen2-small"])
    assert args.host == "127.0.0.1"
    assert base_model_of(args) == ("builtin:tiny-qwen2-small", "float32")
    assert base_model_of(parser.parse_args([str(DEMO_RECIPE), "--base-model", BASE, "--precision", "bfloat16"])) == (
        BASE, "bfloat16")
