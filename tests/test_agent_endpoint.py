"""The OpenAI-compatible endpoint with a real HTTP client (the openai package), over the hf
engine on a tiny model: token-exact trajectories across calls, the token, loopback only, and
a GRPO step whose episodes are played by a plain agent loop."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from corerl.generation.contract import SamplingSettings
from tests.environment_fixtures import hf_engine

TEMPLATE = ("{% for m in messages %}<bos> {{ m['content'] }} <eos> {% endfor %}"
            "{% if add_generation_prompt %}<bos> : {% endif %}")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    from corerl.environments.endpoint import ChatEndpoint

    engine = hf_engine(tmp_path_factory.mktemp("model"))
    engine.tokenizer.chat_template = TEMPLATE
    served = ChatEndpoint(engine, engine.tokenizer, SamplingSettings(max_new_tokens=6, seed=5), max_seq_length=128)
    yield served
    served.shutdown()


def test_calls_of_an_episode_become_one_token_exact_trajectory(endpoint):
    from openai import OpenAI

    episode = endpoint.open_episode()
    api = OpenAI(base_url=endpoint.base_url(episode), api_key=endpoint.token)
    assert endpoint.base_url(episode).startswith("http://127.0.0.1:")
    assert [m.id for m in api.models.list().data] == ["corerl-policy"]
    messages = [{"role": "user", "content": "w0 3 :"}]
    first = api.chat.completions.create(model="corerl-policy", messages=messages, logprobs=True)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "tool", "content": "w5"}]
    second = api.chat.completions.create(model="corerl-policy", messages=messages, logprobs=True)
    record = endpoint.close_episode(episode)
    assert record.calls == 2 and len(record.chains) == 1  # the second call extends the first: one sequence
    chain = record.chains[0]
    tokenizer = endpoint.tokenizer
    first_lp = [t.logprob for t in first.choices[0].logprobs.content]
    second_lp = [t.logprob for t in second.choices[0].logprobs.content]
    model_lp = [lp for lp, m in zip(chain.logprobs, chain.mask, strict=True) if m]
    assert model_lp == pytest.approx(first_lp + second_lp, abs=0)
    # the environment's tokens (the template's continuation with the tool message) sit between the
    # two answers, masked; the answers' ids are the sampled ones, never re-tokenized text
    observation = endpoint.encoder.encode([{"role": "tool", "content": "w5"}],
                                          ended_with_stop=first.choices[0].finish_reason == "stop")
    n1 = len(first_lp)
    assert chain.ids[n1:n1 + len(observation)] == observation and set(chain.mask[n1:n1 + len(observation)]) == {0}
    assert chain.prompt == tokenizer.encode(tokenizer.apply_chat_template(messages[:1], tokenize=False,
                                                                           add_generation_prompt=True),
                                            add_special_tokens=False)


def test_a_call_that_does_not_extend_the_last_starts_a_new_chain(endpoint):
    from openai import OpenAI

    episode = endpoint.open_episode()
    api = OpenAI(base_url=endpoint.base_url(episode), api_key=endpoint.token)
    api.chat.completions.create(model="corerl-policy", messages=[{"role": "user", "content": "w0 3 :"}])
    api.chat.completions.create(model="corerl-policy", messages=[{"role": "user", "content": "w0 4 :"}])
    assert len(endpoint.close_episode(episode).chains) == 2


def test_the_endpoint_refuses_a_wrong_token_and_a_closed_episode(endpoint):
    import openai

    episode = endpoint.open_episode()
    wrong = openai.OpenAI(base_url=endpoint.base_url(episode), api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="corerl-policy", messages=[{"role": "user", "content": "w0"}])
    endpoint.close_episode(episode)
    gone = openai.OpenAI(base_url=endpoint.base_url(episode), api_key=endpoint.token, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        gone.chat.completions.create(model="corerl-policy", messages=[{"role": "user", "content": "w0"}])


def _raw_post(endpoint, episode, headers: str, body: bytes = b"", timeout: float = 10.0):
    """A raw HTTP request on 127.0.0.1 (the connection, and the status line of the answer)."""
    import socket

    conn = socket.create_connection(("127.0.0.1", endpoint.port), timeout=timeout)
    conn.sendall((f"POST /episodes/{episode}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Authorization: Bearer {endpoint.token}\r\nContent-Type: application/json\r\n{headers}\r\n").encode()
                 + body)
    return conn


def _status(conn) -> int:
    answer = conn.makefile("rb").readline().decode()
    conn.close()
    return int(answer.split()[1])


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(endpoint):
    episode = endpoint.open_episode()
    limit = endpoint.body_limit()
    assert limit == 64 * 1024 + 64 * 128  # sized for policy.max_seq_length (128 here)
    # 50 MB announced and not one byte of it sent: uvicorn has no timeout on reading a body (its
    # timeout_keep_alive counts only between requests), so an answer at all says the server did not
    # wait to read the body (the client's 60 s only stops a hung test, it is not a speed check)
    conn = _raw_post(endpoint, episode, f"Content-Length: {50 * 2**20}\r\n", timeout=60)
    assert _status(conn) == 413
    endpoint.close_episode(episode)


def test_the_openai_client_gets_the_413_of_a_body_it_sent_whole(endpoint):
    import openai

    episode = endpoint.open_episode()
    api = openai.OpenAI(base_url=endpoint.base_url(episode), api_key=endpoint.token, max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as refused:  # not a connection reset
        api.chat.completions.create(model="corerl-policy", messages=[{"role": "user", "content": "w1 " * 1_500_000}])
    assert refused.value.status_code == 413
    endpoint.close_episode(episode)


def test_another_episode_is_answered_while_one_renders_and_one_request_still_arrives(endpoint, monkeypatch):
    import threading

    from openai import OpenAI

    stalled_episode, busy, served = (endpoint.open_episode() for _ in range(3))
    stalled = _raw_post(endpoint, stalled_episode, f"Content-Length: {endpoint.body_limit()}\r\n",
                        b'{"messages": [')  # stops mid-body
    rendering, release = threading.Event(), threading.Event()
    render = endpoint.tokenizer.apply_chat_template

    def slow_render(messages, **kwargs):  # the busy episode's rendering takes until released
        if messages[0]["content"] == "slow":
            rendering.set()
            release.wait(30)
        return render(messages, **kwargs)

    monkeypatch.setattr(endpoint.tokenizer, "apply_chat_template", slow_render)

    def client(episode):
        return OpenAI(base_url=endpoint.base_url(episode), api_key=endpoint.token, max_retries=0, timeout=20)

    slow = threading.Thread(target=lambda: client(busy).chat.completions.create(
        model="corerl-policy", messages=[{"role": "user", "content": "slow"}]))
    slow.start()
    try:
        assert rendering.wait(20)
        answer = client(served).chat.completions.create(model="corerl-policy",
                                                        messages=[{"role": "user", "content": "w0 3 :"}])
        assert answer.choices[0].message.content is not None  # answered while the other renders
    finally:
        release.set()
        slow.join(30)
        stalled.close()
    for episode in (stalled_episode, busy, served):
        endpoint.close_episode(episode)


@pytest.mark.parametrize("body", [b"[1, 2]", b"{not json", b'"text"', b'{"messages": "hi"}', b'{"messages": [3]}'])
def test_a_body_that_is_not_a_request_object_is_refused_with_400(endpoint, body):
    episode = endpoint.open_episode()
    assert _status(_raw_post(endpoint, episode, f"Content-Length: {len(body)}\r\n", body)) == 400
    endpoint.close_episode(episode)


def test_a_burst_of_200_concurrent_calls_is_answered_not_reset(endpoint):
    """200 connections opened at once are all queued (a connection the listen backlog has no room
    for is dropped, and its client waits a second to try again, or is reset) and all answered."""
    import socket
    import threading

    episode = endpoint.open_episode()
    burst = min(200, int(open("/proc/sys/net/core/somaxconn").read()))  # the kernel caps any backlog there
    start = threading.Barrier(burst)
    statuses: list[int | str] = []

    def call() -> None:
        start.wait()
        try:
            conn = socket.create_connection(("127.0.0.1", endpoint.port), timeout=0.5)  # queued at once, or not
        except OSError as exc:
            statuses.append(type(exc).__name__)
            return
        conn.settimeout(60)  # answering 200 calls may take a while on a busy machine
        conn.sendall(f"GET /episodes/{episode}/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Authorization: Bearer {endpoint.token}\r\n\r\n".encode())
        statuses.append(_status(conn))

    callers = [threading.Thread(target=call) for _ in range(burst)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert statuses == [200] * burst, {s: statuses.count(s) for s in set(statuses)}
    endpoint.close_episode(episode)


@contextmanager
def _agent_step(tmp_path, agent):
    """A GRPO run's context whose episodes ``agent`` plays, its engines started, and its algorithm begun."""
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    host = PluginHost(env={})
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                   "max_seq_length": 64, "chat_template": TEMPLATE},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 1},
        "data": {"task": "tool_lookup", "env_name": "openai_agent"},
        "env": {"openai_agent": {"agent": agent, "timeout_s": 60, "max_failure_share": 0.5}},
        "run": {"output_dir": str(tmp_path), "name": "agent", "tensorboard": False},
    }
    config = config_from_mapping(recipe, host)
    with started_algorithm(config, host) as (context, algorithm):
        algorithm.begin()
        yield context, algorithm


def test_a_grpo_step_trains_on_what_a_plain_agent_loop_did(tmp_path):
    with _agent_step(tmp_path, "tests.agent_harness:two_turn_agent") as (context, algorithm):
        metrics = algorithm.step()
        endpoint = context.rollout().endpoint
        assert endpoint is not None and endpoint.batches < 8  # 4 episodes x 2 calls, concurrent calls batched
    assert metrics["optimizer_step"] == 1.0
    assert metrics["env/turns"] == 2.0 and metrics["env/stop/done"] == 1.0
    assert metrics["generated_tokens"] > 0


def test_a_crashing_agent_stops_the_run_past_the_failure_share(tmp_path):
    from corerl.errors import RunError

    with _agent_step(tmp_path, "tests.agent_harness:broken_agent") as (_, algorithm):
        with pytest.raises(RunError, match="environment 'openai_agent' failed 4 of 4 episodes.*the harness crashed"):
            algorithm.step()
