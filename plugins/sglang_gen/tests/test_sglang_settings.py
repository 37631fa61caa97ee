"""The sglang backend without SGLang: NeMo RL's sglang_cfg keys acting on corerl's settings, the
refusals in one line at their keys, the engine arguments a config makes, and corerl's sampling
calls in SGLang's request and answer format (the format of sglang 0.5.23's ``Engine.generate``)."""

from __future__ import annotations

import pytest
from corerl_sglang import requests

from corerl.errors import ConfigErrors, CorerlError, EngineNotAvailable
from corerl.sdk import SamplingSettings
from corerl.testing import host_with, select_for, write_recipe

NEMO_RL = "tests/data/nemo_rl/base_grpo.yaml"


def _recipe(tmp_path, sglang_cfg=None, **cluster):
    return write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "sglang",
                                                                      "sglang_cfg": sglang_cfg or {}}},
        "cluster": {"gpus_per_node": 2, **cluster},
    })


def test_a_machine_without_a_gpu_refuses_sglang_in_one_line_at_the_backend(tmp_path):
    from corerl.distributed.devices import machine_has_gpu

    if machine_has_gpu():
        pytest.skip("this machine has a GPU: the GPU tests run the engine")
    with pytest.raises(EngineNotAvailable) as caught:
        select_for(host_with(None, "installed"), _recipe(tmp_path), [])
    line = caught.value.one_line()
    assert caught.value.key == "policy.generation.backend" and "\n" not in line
    assert "the sglang generation backend needs a GPU" in line and "policy.generation.backend=vllm" in line


def _refused(recipe, overrides=()):
    """The one refusal of a recipe (validation's chosen-phase checks raise theirs as they are)."""
    with pytest.raises(CorerlError) as caught:
        select_for(host_with(None, "installed"), recipe, list(overrides))
    (error,) = getattr(caught.value, "errors", [caught.value])
    assert not isinstance(error, EngineNotAvailable), error  # a refusal on any machine, not this one's lack
    assert "\n" not in error.one_line()
    return error


def test_generation_on_gpus_of_its_own_and_more_gpus_than_a_node_are_refused_at_their_keys(tmp_path):
    # refused whatever the machine: said before this machine's want of a GPU
    recipe = write_recipe(tmp_path / "d.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {
            "backend": "sglang", "colocated": {"enabled": False, "resources": {"gpus_per_node": 1}}}},
        "cluster": {"gpus_per_node": 2}})
    error = _refused(recipe)
    assert error.key == "policy.generation.colocated.enabled" and "colocated with training only" in error.message
    error = _refused(_recipe(tmp_path, {"tp_size": 2, "base_gpu_id": 1}))
    assert error.key == "policy.generation.sglang_cfg.tp_size"
    assert "takes 2 GPUs (tp_size x dp_size x pp_size) from GPU 1 on, and a node has 2" in error.message


def test_what_the_backend_lacks_is_said_before_this_machines_want_of_a_gpu(tmp_path):
    """A LoRA adapter (the registration says lora=False: the core's check) and a vision-language
    model are refused as such, on any machine; the GPU line comes only where nothing else stops the
    recipe (the support matrix reads these cells)."""
    error = _refused(_recipe(tmp_path), ["policy.lora.enabled=true"])
    assert error.key == "policy.generation.backend" and "'sglang' (plugin 'sglang') cannot sample with a LoRA" in \
        error.message
    error = _refused(_recipe(tmp_path), ["policy.model_name=builtin:tiny-vl", "data.task=shape_colour"])
    assert error.key == "policy.generation.backend" and "does not read images" in error.message


def test_engine_args_may_not_repeat_what_the_plugin_sets(tmp_path):
    recipe = _recipe(tmp_path, {"engine_args": {"tp_size": 2, "trust_remote_code": True, "chunked_prefill_size": 64,
                                                "enable_deterministic_inference": False}}, num_nodes=2)
    with pytest.raises(ConfigErrors) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    keys = sorted(error.key for error in caught.value.errors)
    assert keys == ["policy.generation.sglang_cfg.engine_args.enable_deterministic_inference",
                    "policy.generation.sglang_cfg.engine_args.tp_size",
                    "policy.generation.sglang_cfg.engine_args.trust_remote_code"]
    # every setting of the section that is a server argument: engine_args may not slip past its checks
    recipe = _recipe(tmp_path, {"engine_args": {"base_gpu_id": 3, "disable_cuda_graph": True}}, num_nodes=2)
    with pytest.raises(ConfigErrors) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    assert sorted(error.key for error in caught.value.errors) == [
        "policy.generation.sglang_cfg.engine_args.base_gpu_id",
        "policy.generation.sglang_cfg.engine_args.disable_cuda_graph"]


def test_the_engine_arguments_follow_the_config(tmp_path):
    from corerl_sglang.engine import engine_arguments

    recipe = _recipe(tmp_path, {"tp_size": 2, "mem_fraction_static": 0.5, "disable_cuda_graph": True,
                                "engine_args": {"chunked_prefill_size": 64}}, num_nodes=2)
    config, _ = select_for(host_with(None, "installed"), recipe, ["policy.max_seq_length=96", "algorithm.seed=7",
                                                                  "policy.precision=bfloat16"])
    assert engine_arguments(config, "/models/m") == {
        "model_path": "/models/m", "tokenizer_path": "/models/m", "dtype": "bfloat16",
        "context_length": 98,  # SGLang ends a request 2 tokens before its context length
        "random_seed": 7, "enable_memory_saver": True, "enable_deterministic_inference": True, "log_level": "error",
        "tp_size": 2, "dp_size": 1, "pp_size": 1, "ep_size": 1, "base_gpu_id": 0, "mem_fraction_static": 0.5,
        "max_running_requests": None, "disable_cuda_graph": True, "disable_prefill_cuda_graph": False,
        "enable_weights_cpu_backup": True, "chunked_prefill_size": 64,
    }


def _translated(tmp_path, text: str):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost
    from tests.conftest import REPO

    path = tmp_path / "nemo.yaml"
    path.write_text(f"defaults: {REPO / NEMO_RL}\ncluster:\n  num_nodes: 2\n  gpus_per_node: 4\n{text}")
    return load_config(path, [], PluginHost())


SGLANG_RECIPE = """
policy:
  model_name: builtin:tiny-qwen2
  generation:
    backend: sglang
    sglang_cfg:
      model_path: ${policy.model_name}
      dtype: ${policy.precision}
      context_length: 512
      tp_size: 2
      random_seed: 3
      mem_fraction_static: 0.45
      disable_piecewise_cuda_graph: true
      sglang_server_config:
        needs_offload: true
        cpu_weight_backup: false
        num_gpus: 4
        num_gpus_per_engine: ${policy.generation.sglang_cfg.tp_size}
      sglang_router_config:
        use_external_router: false
"""


def test_nemo_rl_sglang_cfg_keys_act_on_corerls_sglang_settings(tmp_path):
    config = _translated(tmp_path, SGLANG_RECIPE)
    settings = config.section("policy.generation.sglang_cfg")
    assert config.core.policy.generation.backend == "sglang"
    assert (settings.tp_size, settings.random_seed, settings.mem_fraction_static, settings.context_length) == (
        2, 3, 0.45, 512)
    assert settings.disable_prefill_cuda_graph is True and settings.enable_weights_cpu_backup is False
    fates = {fate.key: fate.fate for fate in config.fates}
    assert fates["policy.generation.sglang_cfg.model_path"] == "inert"  # restates policy.model_name
    assert fates["policy.generation.sglang_cfg.sglang_server_config.num_gpus_per_engine"] == "inert"


@pytest.mark.parametrize("change, key", [
    ("      model_path: /elsewhere\n", "policy.generation.sglang_cfg.model_path"),
    ("      sglang_server_config:\n        num_gpus_per_engine: 4\n",
     "policy.generation.sglang_cfg.sglang_server_config.num_gpus_per_engine"),
    ("      sglang_router_config:\n        use_external_router: true\n",
     "policy.generation.sglang_cfg.sglang_router_config.use_external_router"),
], ids=["another-model", "another-engine-size", "external-router"])
def test_nemo_rl_sglang_cfg_saying_otherwise_is_refused_at_its_key(tmp_path, change, key):
    text = ("\npolicy:\n  model_name: builtin:tiny-qwen2\n  generation:\n    backend: sglang\n    sglang_cfg:\n"
            "      tp_size: 2\n" + change)
    with pytest.raises(ConfigErrors) as caught:
        _translated(tmp_path, text)
    assert key in [error.key for error in caught.value.errors], caught.value


def test_each_sample_is_a_request_of_its_own_with_its_seed():
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, max_new_tokens=5, stop_token_ids=(3,),
                                stop_strings=("\n\n",), request_seeds=(100, 200))
    ids, params = requests.expand([[1, 2], [4]], sampling, 2)
    assert ids == [[1, 2], [1, 2], [4], [4]]
    assert [p["sampling_seed"] for p in params] == [100, 101, 200, 201]
    assert params[0] == {"max_new_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "ignore_eos": False,
                         "no_stop_trim": True, "stop_token_ids": [3], "stop": ["\n\n"], "sampling_seed": 100}
    called = requests.expand([[1], [2]], SamplingSettings(seed=5, top_k=4, ignore_eos=True, stop_token_ids=(3,)), 2)[1]
    assert [p["sampling_seed"] for p in called] == [5, 6, 7, 8] and called[0]["top_k"] == 4
    assert "stop_token_ids" not in called[0]  # ignore_eos: no token ends a completion
    # SGLang's seeded sampler gives a request without a seed a fixed one: each gets a fresh seed instead
    unseeded = [p["sampling_seed"] for p in requests.expand([[1]], SamplingSettings(), 4)[1]]
    assert len(set(unseeded)) == 4
    assert "sampling_seed" not in requests.expand([[1]], sampling, 1, seeded=False)[1][0]  # the unseeded sampler


def _answer(ids, logprobs, reason):
    return {"output_ids": ids, "meta_info": {"finish_reason": reason,
                                             "output_token_logprobs": [(lp, t, None) for lp, t in zip(logprobs, ids, strict=True)]}}


def test_sglangs_answers_come_back_as_samples_grouped_by_prompt():
    outputs = [_answer([5, 3], [-0.5, -0.1], {"type": "stop", "matched": 3}),
               _answer([6, 7], [-1.0, -2.0], {"type": "length", "length": 2}),
               _answer([8], [-0.25], {"type": "stop", "matched": 8})]
    groups = requests.group([[1], [2, 2], [4]], outputs, 1)
    assert [[s.completion_ids for s in g] for g in groups] == [[(5, 3)], [(6, 7)], [(8,)]]
    assert groups[0][0].logprobs == (-0.5, -0.1) and groups[0][0].prompt_ids == (1,)
    assert [g[0].finish_reason for g in groups] == ["stop", "length", "stop"]
    with pytest.raises(RuntimeError, match="SGLang aborted a request: out of memory"):
        requests.group([[1]], [_answer([5], [-1.0], {"type": "abort", "message": "out of memory"})], 1)
    with pytest.raises(RuntimeError, match="answered 1 of 2 requests"):
        requests.group([[1]], outputs[:1], 2)
    mismatched = _answer([5], [-1.0], {"type": "length"})
    mismatched["meta_info"]["output_token_logprobs"] = [(-1.0, 9, None)]
    with pytest.raises(RuntimeError, match="logprobs are of other tokens"):
        requests.to_sample([1], mismatched)


def test_a_refit_goes_over_in_buckets_of_about_the_limit():
    import torch

    weights = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("big", torch.zeros(16)), ("c", torch.zeros(2))]
    groups = [[name for name, _ in bucket] for bucket in requests.buckets(weights, 32)]
    assert groups == [["a", "b"], ["big"], ["c"]]  # 16 + 16 bytes fit; 64 goes alone
