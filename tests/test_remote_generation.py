"""External generation servers: SkyRL's ``run_engines_locally=false`` with its servers' URLs selects
corerl's ``remote`` generation backend (``policy.generation.remote``); validation never contacts a
server; an unreachable or malformed server address is refused in one line when the run starts.
The server itself, against the same engine in process: tests/test_generation_server.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from corerl.config import load_config
from corerl.config.selection import select
from corerl.config.tree import value_at
from corerl.errors import ConfigError, ConfigErrors, EngineNotAvailable
from corerl.generation.remote import RemoteGenerationBackend
from corerl.plugin_manager import process_host
from corerl.recipes import DEMO_RECIPE
from tests.test_skyrl_keys import _run as _translate  # main_base's translation of dotted keys

SKYRL = Path(__file__).resolve().parents[2] / "shared" / "skyrl"
_E = "generator.inference_engine."


def test_external_servers_select_the_remote_backend_and_their_engine_keys_are_the_servers():
    result = _translate(**{_E + "run_engines_locally": False, _E + "external_proxy_url": "http://10.0.0.1:8000",
                           _E + "external_server_urls": ["http://10.0.0.2:8001", "http://10.0.0.3:8001"],
                           _E + "tensor_parallel_size": 4, "trainer.placement.colocate_all": False})
    tree, fates = result.tree, {f.key: f for f in result.fates}
    assert value_at(tree, "policy.generation.backend") == "remote"
    assert value_at(tree, "policy.generation.remote.urls") == ["http://10.0.0.2:8001", "http://10.0.0.3:8001"]
    assert value_at(tree, "policy.generation.remote.proxy_url") == "http://10.0.0.1:8000"
    for key in ("run_engines_locally", "external_proxy_url", "external_server_urls"):
        assert fates[_E + key].fate == "acts", fates[_E + key]
    # the run's GPUs all train: no dedicated generation pool is asked of the cluster
    assert value_at(tree, "policy.generation.colocated.enabled") is True
    assert value_at(tree, "policy.generation.colocated.resources.gpus_per_node") is None
    assert fates["trainer.placement.colocate_all"].fate == "inert"


def test_server_addresses_without_run_engines_locally_false_change_nothing():
    result = _translate(**{_E + "external_server_urls": ["http://10.0.0.2:8001"]})
    assert value_at(result.tree, "policy.generation.backend") != "remote"
    assert value_at(result.tree, "policy.generation.remote") is None
    assert {f.key: f.fate for f in result.fates}[_E + "external_server_urls"] == "inert"


def test_run_engines_locally_false_without_a_server_is_refused_in_one_line():
    with pytest.raises(ConfigErrors) as caught:
        _translate(**{_E + "run_engines_locally": False})
    (error,) = caught.value.errors
    assert error.key == _E + "run_engines_locally" and "external_server_urls" in error.hint
    assert "\n" not in str(error)


@pytest.mark.skipif(not (SKYRL / "examples").is_dir(), reason="SkyRL's corpus is not beside the checkout")
def test_skyrls_remote_script_validates_without_its_servers_up():
    """run_remote.sh names servers at 127.0.0.1:8000/8001 that are not running: validation is static."""
    host = process_host()
    script = SKYRL / "examples/train/remote_inference_server/run_remote.sh"
    config = load_config(str(script), [], host, environ={"HOME": "/tmp"})
    selection = select(config, host)
    assert selection.generation_backend.id == "remote"
    remote = config.section("policy.generation.remote")
    assert remote.urls == ["http://127.0.0.1:8001"] and remote.proxy_url == "http://127.0.0.1:8000"


def _config(*overrides: str) -> Any:
    host = process_host()
    config = load_config(DEMO_RECIPE, ["policy.generation.backend=remote", *overrides], host)
    select(config, host)
    return config


def test_a_remote_backend_with_no_server_is_refused_by_validation():
    with pytest.raises(ConfigError) as caught:
        _config()
    assert caught.value.key == "policy.generation.remote.urls" and "corerl serve-generation" in str(caught.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_one_line_naming_it_and_how_to_start_one(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    url = f"http://127.0.0.1:{_closed_port()}"
    backend = RemoteGenerationBackend(_config(f"policy.generation.remote.urls=[{url}]"))
    with pytest.raises(EngineNotAvailable) as caught:
        backend.load_hf(str(tmp_path))
    line = str(caught.value)
    assert caught.value.key == "policy.generation.remote.urls" and url in line and "unreachable" in line
    assert "corerl serve-generation" in line and "\n" not in line


def test_an_address_that_is_not_a_url_is_refused_when_the_run_starts(tmp_path: Path):
    backend = RemoteGenerationBackend(_config("policy.generation.remote.proxy_url=/placeholder/proxy",
                                              "policy.generation.remote.urls=[http://127.0.0.1:1]"))
    with pytest.raises(ConfigError) as caught:
        backend.load_hf(str(tmp_path))
    assert caught.value.key == "policy.generation.remote.proxy_url" and "/placeholder/proxy" in str(caught.value)


@pytest.mark.skipif(not (SKYRL / "examples").is_dir(), reason="SkyRL's corpus is not beside the checkout")
def test_skyrls_server_script_is_read_as_its_keys_for_serve_generation():
    """run_vllm_server.sh starts skyrl.train.entrypoints.serve: corerl serve-generation reads its keys
    (the model, the inference engine's) as main_base's, the engine in the server's own process."""
    from corerl.run.generation_server import load_serving_config

    host = process_host()
    script = SKYRL / "examples/train/remote_inference_server/run_vllm_server.sh"
    config = load_serving_config(str(script), ["trainer.policy.model.path=/models/qwen"], None, host)
    assert config.core.policy.model_name == "/models/qwen"
    assert config.core.policy.generation.colocated.enabled is True
    if "vllm" in host.generation_backends:
        assert select(config, host).generation_backend.id == "vllm"
        assert config.section("policy.generation.vllm_cfg").tensor_parallel_size == 4


def test_asynchronous_rl_keeps_the_servers_client_in_a_worker_of_its_own():
    keys = {_E + "run_engines_locally": False, _E + "external_server_urls": ["http://10.0.0.2:8001"],
            "trainer.placement.colocate_all": False, "trainer.fully_async.enabled": True}
    result = _translate("fully_async", **keys)
    assert value_at(result.tree, "algorithm.async.enabled") is True
    assert value_at(result.tree, "policy.generation.backend") == "remote"
    assert value_at(result.tree, "policy.generation.colocated.enabled") is False
    assert value_at(result.tree, "policy.generation.colocated.resources.gpus_per_node") == 1


def test_the_fingerprint_tells_two_trainings_of_one_architecture_apart(tmp_path: Path):
    import shutil

    from corerl.generation.remote import model_fingerprint
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model

    shape = BUILTIN_MODELS["builtin:tiny-qwen2"]
    first = build_tiny_model(tmp_path / "first", seed=0, **shape)
    other = build_tiny_model(tmp_path / "other", seed=1, **shape)
    copy = shutil.copytree(first, tmp_path / "copy")
    assert model_fingerprint(str(first)) == model_fingerprint(str(copy))
    assert model_fingerprint(str(first)) != model_fingerprint(str(other))


def test_an_answer_from_weights_older_than_the_last_refit_is_refused_in_one_line():
    from corerl.errors import RunError

    backend = RemoteGenerationBackend(_config("policy.generation.remote.urls=[http://127.0.0.1:1]"))
    backend.expected = {"known": 3}
    backend._check_version("http://127.0.0.1:1", {"server_id": "known", "version": 3})
    with pytest.raises(RunError, match="version 2, not the last refit's \\(3\\)"):
        backend._check_version("http://127.0.0.1:1", {"server_id": "known", "version": 2})
    with pytest.raises(RunError, match="does not send weights to") as caught:
        backend._check_version("http://proxy:1", {"server_id": "elsewhere", "version": 3})
    assert caught.value.key == "policy.generation.remote.urls" and "\n" not in str(caught.value)
