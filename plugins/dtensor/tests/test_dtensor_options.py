"""dtensor options beyond the conformance layouts: precision, CPU offload, custom plans, refusals."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from corerl.config import load_config
from corerl.config.selection import select
from corerl.errors import ConfigError
from corerl.models.facts import model_shape
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.testing.conformance import conformance_batch, conformance_loss
from corerl.testing.reference import hf_logprobs
from corerl_dtensor.backend import DTensorBackend
from corerl_dtensor.support import check_supported


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("model")))


def make_config(model_dir, tmp_path, *overrides):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "train_micro_batch_size": 2}})
    return load_config(recipe, list(overrides), PluginHost(env={}))


@pytest.mark.parametrize(
    ("override", "error", "key"),
    [
        ("policy.dtensor_cfg.context_parallel_size=2\npolicy.dtensor_cfg.sequence_parallel=true", ConfigError,
         "policy.dtensor_cfg.context_parallel_size"),
        ("policy.dtensor_cfg.sequence_parallel=true\npolicy.dtensor_cfg.custom_parallel_plan=corerl_dtensor.plans:mlp_only",
         ConfigError, "policy.dtensor_cfg.sequence_parallel"),
        ("policy.dtensor_cfg.fsdp_version=1", ConfigError, "policy.dtensor_cfg.fsdp_version"),
        ("policy.precision=float16", ConfigError, "policy.precision"),
        ("policy.dtensor_cfg.tensor_parallel_size=1\npolicy.dtensor_cfg.dp_replicate_size=2\npolicy.dtensor_cfg.fsdp_version=1",
         ConfigError, "policy.dtensor_cfg.dp_replicate_size"),
        ("policy.dtensor_cfg.tensor_parallel_size=1\npolicy.dtensor_cfg.dp_replicate_size=2\n"
         "policy.dtensor_cfg.expert_parallel_size=2", ConfigError, "policy.dtensor_cfg.dp_replicate_size"),
        ("policy.model_name=builtin:tiny-vl", ConfigError, "policy.dtensor_cfg.tensor_parallel_size"),
    ],
)
def test_unsupported_options_are_refused_in_one_line_before_any_worker_starts(model_dir, tmp_path, override, error, key):
    extra = ["cluster.gpus_per_node=4", "policy.dtensor_cfg.tensor_parallel_size=2"]
    config = make_config(model_dir, tmp_path, *extra, *override.split("\n"))
    with pytest.raises(error) as caught:  # the one validation phase, which validate and run share
        select(config, PluginHost(env={}))
    assert caught.value.key == key and "\n" not in str(caught.value)


CP = "policy.dtensor_cfg.context_parallel_size"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["policy.sequence_packing.enabled=true"], "packed rows"),
        (["cluster.gpus_per_node=4", "policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.sequence_parallel=true"],
         "sequence parallelism"),
        (["cluster.gpus_per_node=4", "policy.dtensor_cfg.dp_replicate_size=2"], "hybrid sharding"),
        (["policy.dtensor_cfg.fsdp_version=1"], "FSDP1"),
        (["policy.model_name=builtin:tiny-moe", "policy.dtensor_cfg.expert_parallel_size=2"], "expert parallelism"),
        (["policy.model_name=builtin:tiny-vl"], "vision-language"),
    ],
)
def test_what_context_parallelism_does_not_take_yet_is_refused_in_one_line(model_dir, tmp_path, overrides, says):
    config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=2", f"{CP}=2", *overrides)
    with pytest.raises(ConfigError) as caught:
        check_supported(config)
    assert caught.value.key == CP and says in str(caught.value) and "\n" not in str(caught.value)


def test_top_k_distillation_takes_context_parallelism(model_dir, tmp_path):
    # the teacher's top-k and the student's candidates are answered per rank and gathered
    # (corerl_dtensor.context_parallel; checked against plain PyTorch by TestContextParallel2)
    config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=2", f"{CP}=2", "algorithm.name=distillation",
                         "algorithm.distillation.teacher_model=builtin:tiny-qwen2", "algorithm.distillation.kl_type=forward")
    assert check_supported(config) is None


def test_a_mixture_of_experts_model_takes_context_parallelism(model_dir, tmp_path):
    # its router's terms are gathered over the ring (corerl.training.moe_router.RouterHooks.split_rows)
    moe = ["cluster.gpus_per_node=2", f"{CP}=2", "policy.model_name=builtin:tiny-moe"]
    config = make_config(model_dir, tmp_path, *moe)
    assert model_shape(config).is_moe and config.section("policy.dtensor_cfg").context_parallel_size == 2
    assert check_supported(config) is None
    assert select(config, PluginHost(env={})).training_backend.id == "dtensor"
    # the same model with its experts split over the ranks as well is refused, in one line naming the key
    with pytest.raises(ConfigError) as caught:
        check_supported(make_config(model_dir, tmp_path, *moe, "policy.dtensor_cfg.expert_parallel_size=2"))
    assert caught.value.key == CP and "expert parallelism" in str(caught.value) and "\n" not in str(caught.value)


def test_a_context_parallel_size_that_does_not_divide_the_world_is_named_in_one_line(model_dir, tmp_path):
    with pytest.raises(ConfigError) as caught:
        make_config(model_dir, tmp_path, "cluster.gpus_per_node=2", f"{CP}=3")
    assert caught.value.key == CP and "must divide the world size" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("replicate", [3, 4])
def test_dp_replicate_size_must_divide_the_data_parallel_ranks(model_dir, tmp_path, replicate):
    with pytest.raises(ConfigError) as caught:  # world 4 / TP 2: 2 data-parallel ranks
        make_config(model_dir, tmp_path, "cluster.gpus_per_node=4", "policy.dtensor_cfg.tensor_parallel_size=2",
                    f"policy.dtensor_cfg.dp_replicate_size={replicate}")
    assert caught.value.key == "policy.dtensor_cfg.dp_replicate_size" and "\n" not in str(caught.value)
    assert "must divide the data-parallel ranks" in str(caught.value)
    config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=4", "policy.dtensor_cfg.dp_replicate_size=2",
                         "policy.dtensor_cfg.tensor_parallel_size=2")
    check_supported(config)  # 2 replicas x 1 shard: taken


def test_memory_model_divides_the_state_by_the_shard_size_with_hybrid_sharding(model_dir, tmp_path):
    from corerl.planning.command import request_of

    host = PluginHost(env={})
    model = host.memory_models.get("dtensor").create()
    estimates, layouts = {}, {}
    for replicate in (1, 2, 4):  # world 4: FSDP over 4, 2 x 2 and 4 x 1 (replicated)
        config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=4", "policy.optimizer.name=adamw",
                             f"policy.dtensor_cfg.dp_replicate_size={replicate}")
        request = request_of(config)
        layouts[replicate] = model.layout_of(config, request)
        estimates[replicate] = model.estimate(request, layouts[replicate])
    assert "dp_replicate_size" not in " ".join(layouts[1].overrides) and layouts[1].name.startswith("FSDP2")
    assert "policy.dtensor_cfg.dp_replicate_size=2" in layouts[2].overrides and layouts[2].name.startswith("HSDP 2x2")
    assert all(layout.dp == 4 for layout in layouts.values())
    for kind in ("parameters", "gradients", "optimizer"):
        full = getattr(estimates[1], kind)
        assert abs(getattr(estimates[2], kind) - 2 * full) <= 2 and abs(getattr(estimates[4], kind) - 4 * full) <= 4
    assert estimates[2].activations == estimates[1].activations  # one micro-batch per rank either way


def test_bfloat16_with_cpu_offload_trains_at_dp2_close_to_float32(model_dir, tmp_path):
    batch = conformance_batch()
    single = DTensorBackend(make_config(model_dir, tmp_path))
    single.load_hf(model_dir)
    reference = single.train_step(batch, conformance_loss).loss
    config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=2", "policy.precision=bfloat16",
                         "policy.dtensor_cfg.cpu_offload=true")
    backend = DTensorBackend(config)
    try:
        backend.load_hf(model_dir)
        losses = [backend.train_step(batch, conformance_loss).loss for _ in range(2)]
        weights = dict(backend.weight_stream())
    finally:
        backend.shutdown()
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - reference) < 0.05 and losses[0] != reference  # bf16 compute, not fp32
    assert all(w.dtype == torch.float32 for w in weights.values())  # fp32 master weights


def test_custom_parallel_plan_by_import_path(model_dir, tmp_path):
    config = make_config(model_dir, tmp_path, "cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2",
                         "policy.dtensor_cfg.custom_parallel_plan=corerl_dtensor.plans:mlp_only")
    backend = DTensorBackend(config)
    try:
        backend.load_hf(model_dir)
        batch = conformance_batch()
        ours = backend.logprobs(batch)
    finally:
        backend.shutdown()
    reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
    assert float((ours - reference).abs().max()) <= 1e-5


def test_fp8_training_multiplies_the_decoder_in_float8_and_leaves_the_head_and_weights(tmp_path):
    """``fp8_training`` (torchao's float8 training, through torch._scaled_mm on this CPU): the
    decoder's linear layers become Float8Linear, the LM head does not; the logprobs move off a
    float32 forward by FP8's rounding and stay near it, a step trains, and the weights keep their
    names and dtype (what a refit or checkpoint reads)."""
    from corerl.testing.reference import at_loss_positions, max_diff
    from corerl_dtensor.float8 import float8_layers

    model_dir = str(build_tiny_model(tmp_path / "m", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                     intermediate_size=128, vocab_size=128, tie_word_embeddings=False))
    batch = conformance_batch()
    backend = DTensorBackend(make_config(model_dir, tmp_path, "policy.dtensor_cfg.fp8_training=true"))
    try:
        backend.load_hf(model_dir)
        model = backend.group.worker.model  # world size 1: the worker runs in this process
        ours = backend.logprobs(batch)
        result = backend.train_step(batch, conformance_loss)
        weights = dict(backend.weight_stream())
    finally:
        backend.shutdown()
    reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
    gap = max_diff(at_loss_positions(ours, batch), reference)
    print(f"\nfloat8 training: logprobs vs a float32 forward, max |difference| {gap:.3g}")
    assert 1e-4 < gap < 0.5 and math.isfinite(result.loss)
    plain = dict(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict())
    assert sorted(weights) == sorted(plain) and all(w.dtype == torch.float32 for w in weights.values())
    assert float8_layers(model) == 2 * 7 and type(model.lm_head).__name__ == "Linear"  # 7 a decoder layer, no head


@pytest.mark.parametrize("overrides, says", [
    (["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"], "tensor parallelism"),
    (["policy.lora.enabled=true"], "PEFT's adapters"),
    (["cluster.gpus_per_node=2", "policy.dtensor_cfg.fsdp_version=1"], "FSDP1"),
])
def test_fp8_training_is_refused_with_what_it_does_not_combine_with(model_dir, tmp_path, overrides, says):
    config = make_config(model_dir, tmp_path, "policy.dtensor_cfg.fp8_training=true", *overrides)
    with pytest.raises(ConfigError) as caught:
        check_supported(config)
    assert caught.value.key == "policy.dtensor_cfg.fp8_training" and says in str(caught.value)
