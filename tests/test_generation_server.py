"""``corerl serve-generation`` in a subprocess against the same engine in process: the remote
backend's greedy tokens equal the in-process hf engine's (logprobs within 1e-5), before and after a refit
sent in several chunks; every answer carries the server's weight version."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corerl.config import load_config
from corerl.config.selection import select
from corerl.generation.contract import SamplingSettings
from corerl.plugin_manager import process_host
from corerl.recipes import DEMO_RECIPE

PROMPTS = [[2, 5, 9, 13], [2, 7], [2, 11, 4, 6, 8, 10, 12]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A tiny model built in code, served by ``corerl serve-generation`` (hf) on a free port."""
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model

    folder = tmp_path_factory.mktemp("served")
    model = str(build_tiny_model(folder / "model", **BUILTIN_MODELS["builtin:tiny-qwen2"]))
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(folder / "server.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen([sys.executable, "-m", "corerl.cli", "serve-generation", str(DEMO_RECIPE),
                               f"policy.model_name={model}", "policy.generation.backend=hf",
                               "--port", url.rsplit(":", 1)[1]], stdout=log, stderr=subprocess.STDOUT)
    try:
        from corerl.generation.remote import call

        deadline = time.monotonic() + 120
        while True:
            try:
                call(url, "/info", timeout=5)
                break
            except Exception:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((folder / "server.log").read_text()) from None
                time.sleep(0.3)
        yield url, model
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _engines(url: str, model: str) -> tuple[Any, Any]:
    from corerl.generation.hf import HFGenerationBackend
    from corerl.generation.remote import RemoteGenerationBackend

    host = process_host()
    config = load_config(DEMO_RECIPE, [f"policy.model_name={model}", "policy.generation.backend=remote",
                                       f"policy.generation.remote.urls=[{url}]",
                                       "policy.generation.remote.weight_chunk_mb=1"], host)
    assert select(config, host).generation_backend.id == "remote"
    remote, local = RemoteGenerationBackend(config), HFGenerationBackend(config)
    remote.load_hf(model)
    local.load_hf(model)
    return remote, local


def _same_samples(served: list[list[Any]], local: list[list[Any]]) -> bool:
    """Token ids and finish reasons exactly, logprobs within 1e-5: the server is another process,
    whose torch may split a matmul's sums over another number of threads than the test's."""
    import math

    if [[(s.prompt_ids, s.completion_ids, s.finish_reason) for s in g] for g in served] != \
            [[(s.prompt_ids, s.completion_ids, s.finish_reason) for s in g] for g in local]:
        return False
    return all(math.isclose(a, b, rel_tol=0, abs_tol=1e-5)
               for gs, gl in zip(served, local, strict=True) for ss, sl in zip(gs, gl, strict=True)
               for a, b in zip(ss.logprobs, sl.logprobs, strict=True))


def test_the_server_samples_as_the_engine_in_process_before_and_after_a_refit(served: tuple[str, str]):
    import torch

    url, model = served
    remote, local = _engines(url, model)
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=8)
    seeded = SamplingSettings(temperature=1.0, max_new_tokens=8, request_seeds=(11, 12, 13))
    before = local.generate(PROMPTS, greedy)
    assert _same_samples(remote.generate(PROMPTS, greedy), before)
    assert _same_samples(remote.generate(PROMPTS, seeded, n=2), local.generate(PROMPTS, seeded, n=2))

    (server,) = remote.expected
    version = remote.expected[server]
    generator = torch.Generator().manual_seed(0)
    weights = [(name, tensor + 0.05 * torch.randn(tensor.shape, generator=generator))
               for name, tensor in local.model.state_dict().items()]
    local.update_weights(weights)
    remote.update_weights(weights)  # 1 MiB chunks: the tiny model's weights go in several
    assert remote.expected[server] == version + 1
    after = local.generate(PROMPTS, greedy)
    assert after != before
    assert _same_samples(remote.generate(PROMPTS, greedy), after)


def test_a_server_on_another_checkpoint_is_refused_in_one_line(served: tuple[str, str], tmp_path: Path):
    from corerl.errors import ConfigError
    from corerl.generation.remote import RemoteGenerationBackend
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model

    url, _ = served
    other = str(build_tiny_model(tmp_path / "other", seed=1, **BUILTIN_MODELS["builtin:tiny-qwen2"]))
    host = process_host()
    config = load_config(DEMO_RECIPE, [f"policy.model_name={other}", "policy.generation.backend=remote",
                                       f"policy.generation.remote.urls=[{url}]"], host)
    with pytest.raises(ConfigError, match="another checkpoint than the policy's") as caught:
        RemoteGenerationBackend(config).load_hf(other)
    assert caught.value.key == "policy.generation.remote.urls" and url in str(caught.value)


def test_one_grpo_step_samples_through_the_server_and_refits_it(served: tuple[str, str], tmp_path: Path):
    """``corerl run``'s GRPO over the remote backend: the server (refitted by the test above) goes
    back to the checkpoint's weights when the run starts, samples the step, takes its refit."""
    import json

    from corerl.api import Trainer
    from corerl.generation.remote import call

    url, model = served
    if call(url, "/info")["checkpoint"]:  # the test above ran apart: refit the server as an earlier run would
        _engines(url, model)[0].update_weights(_engines(url, model)[1].model.state_dict().items())
    start = call(url, "/info")
    result = Trainer.from_recipe(DEMO_RECIPE, f"policy.model_name={model}", "policy.generation.backend=remote",
                                 f"policy.generation.remote.urls=[{url}]", "sft.enabled=false", "algorithm.max_steps=1",
                                 "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
                                 "eval.every_n_steps=0", "eval.at_start=false", "checkpointing.enabled=false",
                                 f"run.output_dir={tmp_path}").train()
    after = call(url, "/info")
    assert after["version"] >= start["version"] + 2  # the reset to the checkpoint, then at least the step's refit
    assert not after["checkpoint"]
    (step,) = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
               if "reward/mean" in line]
    assert step["step"] == 1


def test_a_paused_server_holds_generation_requests_until_resumed(served: tuple[str, str]):
    from concurrent.futures import ThreadPoolExecutor

    from corerl.generation.remote import call

    url, _ = served
    body = {"prompts": [[2, 5]], "n": 1, "sampling": {"temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True}}
    call(url, "/pause", {})
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(call, url, "/generate", body)
            time.sleep(1.0)
            assert not pending.done() and call(url, "/info")["paused"]
            call(url, "/resume", {})
            assert len(pending.result(timeout=60)["samples"][0][0]["completion_ids"]) == 2
    finally:
        call(url, "/resume", {})


def test_a_proxy_passes_requests_on_and_the_servers_take_the_refits(served: tuple[str, str], tmp_path: Path):
    """``--proxy-for``: SkyRL's external_proxy_url in front of its external_server_urls."""
    from corerl.errors import ConfigError
    from corerl.generation.remote import RemoteGenerationBackend, call

    url, model = served
    proxy = f"http://127.0.0.1:{_free_port()}"
    process = subprocess.Popen([sys.executable, "-m", "corerl.cli", "serve-generation", "--proxy-for", url,
                                "--port", proxy.rsplit(":", 1)[1]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert call(proxy, "/info", timeout=5) == {"proxy": True, "servers": [url]}
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        host = process_host()
        common = [f"policy.model_name={model}", "policy.generation.backend=remote",
                  f"policy.generation.remote.proxy_url={proxy}"]
        through = RemoteGenerationBackend(load_config(DEMO_RECIPE, [*common, f"policy.generation.remote.urls=[{url}]"],
                                                      host))
        through.load_hf(model)
        direct, _ = _engines(url, model)
        greedy = SamplingSettings(temperature=0.0, max_new_tokens=6)
        assert through.generate(PROMPTS, greedy) == direct.generate(PROMPTS, greedy)
        alone = RemoteGenerationBackend(load_config(DEMO_RECIPE, common, host))
        with pytest.raises(ConfigError, match="a proxy takes no weights"):
            alone.load_hf(model)
    finally:
        process.terminate()
        process.wait(timeout=30)
