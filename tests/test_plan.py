"""``corerl plan``: the memory models against measured per-rank state, the decision tree on the
guide's three examples (configs made in code, no download), the command line, and
``corerl validate``'s fit warning."""

from __future__ import annotations

import json

import pytest

from corerl.planning.memory import GIB, PlanRequest
from corerl.planning.planner import decision_rule, installed_models, make_plan
from corerl.planning.shape import ModelShape
from corerl.plugin_manager import PluginHost
from tests.conftest import EXAMPLES, REPO, run_corerl
from tests.refusals import refused_in_one_line

# Qwen2.5 configs as their config.json files give them (the sizes only)
QWEN25 = {
    "1.5B": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True},
    "32B": {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
            "intermediate_size": 27648, "vocab_size": 152064, "tie_word_embeddings": False},
    "72B": {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "intermediate_size": 29568, "vocab_size": 152064, "tie_word_embeddings": False},
}


def _qwen(size: str, folder=None) -> ModelShape:
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768,
              **QWEN25[size]}
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
    return ModelShape.from_hf_config(config, name=f"Qwen2.5-{size}")


def test_the_shape_counts_the_parameters_a_checkpoint_holds(tmp_path):
    from safetensors.torch import load_file

    from corerl.models.tiny import build_tiny_model

    for family, tied in (("qwen2", True), ("llama", False)):
        folder = build_tiny_model(tmp_path / family, family=family, hidden_size=64, num_layers=3, tie_word_embeddings=tied)
        weights = load_file(str(folder / "model.safetensors"))
        unique = {t.data_ptr(): t.numel() for t in weights.values()}
        assert ModelShape.from_folder(folder).parameters == sum(unique.values()), family
    assert abs(_qwen("1.5B").parameters / 1e9 - 1.54) < 0.01  # the published sizes
    assert abs(_qwen("32B").parameters / 1e9 - 32.76) < 0.01 and abs(_qwen("72B").parameters / 1e9 - 72.71) < 0.01


def _measured():
    """bench/memory.py's committed measurement: per-rank state bytes of each layout at world 1 and 2."""
    data = json.loads((REPO / "bench" / "results" / "memory.json").read_text())
    return data, {row["layout"]: row["ranks"] for row in data["rows"]}


LAYOUTS = {  # bench/memory.py's layouts, as recipe overrides (megatron: TP over the world)
    "dtensor FSDP2": ("dtensor", []),
    "deepspeed ZeRO-1": ("deepspeed", ["policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=1"]),
    "deepspeed ZeRO-2": ("deepspeed", ["policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=2"]),
    "deepspeed ZeRO-3": ("deepspeed", ["policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=3"]),
    "megatron TP=2": ("megatron", ["policy.megatron_cfg.enabled=true"]),
}


def estimate_for(backend: str, overrides: list[str], world: int, model: str, tmp_path, host):
    """The memory model's estimate of the largest rank of bench/memory.py's recipe for ``backend``."""
    from corerl.config import load_config
    from corerl.planning.command import request_of
    from corerl.testing import write_recipe

    recipe = write_recipe(tmp_path / f"{backend}-{world}.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 4,
                   "training_backend": backend, "optimizer": {"name": "adamw", "lr": 1e-4}}})
    extra = [f"cluster.gpus_per_node={world}"]
    if backend == "megatron":
        extra.append(f"policy.megatron_cfg.tensor_model_parallel_size={world}")
    config = load_config(recipe, [*overrides, *extra], host)
    model_ = host.memory_models.get(backend).create()
    request = request_of(config)
    return model_.estimate(request, model_.layout_of(config, request))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("world", [1, 2])
def test_estimates_match_the_measured_per_rank_state_within_10_percent(layout, world, tmp_path):
    from corerl.models.tiny import build_tiny_model

    data, measured = _measured()
    model = str(build_tiny_model(tmp_path / "model", hidden_size=data["hidden"], num_layers=data["layers"]))
    backend, overrides = LAYOUTS[layout]
    ours = estimate_for(backend, overrides, world, model, tmp_path, PluginHost())
    largest = max(measured[layout][str(world)], key=lambda r: r["parameters"] + r["gradients"] + r["optimizer"])
    for kind in ("parameters", "gradients", "optimizer"):
        assert abs(getattr(ours, kind) - largest[kind]) <= 0.10 * largest[kind], (kind, getattr(ours, kind), largest)


def test_a_live_dtensor_rank_holds_what_the_estimate_says(tmp_path):
    from corerl.config import load_config
    from corerl.models.tiny import build_tiny_model
    from corerl.testing import write_recipe
    from corerl.testing.conformance import conformance_batch, conformance_loss

    host = PluginHost()
    model = str(build_tiny_model(tmp_path / "model", hidden_size=96, num_layers=3))
    ours = estimate_for("dtensor", [], 1, model, tmp_path, host)
    recipe = write_recipe(tmp_path / "live.yaml", {"policy": {"model_name": model, "precision": "float32",
                                                              "optimizer": {"name": "adamw", "lr": 1e-4}}})
    backend = host.training_backends.get("dtensor").create(config=load_config(recipe, [], host))
    try:
        backend.load_hf(model)
        backend.train_step(conformance_batch(rows=4, length=16, vocab=128), conformance_loss)
        (rank,) = backend.state_bytes()
    finally:
        backend.shutdown()
    assert (ours.parameters, ours.gradients, ours.optimizer) == (rank["parameters"], rank["gradients"],
                                                                  rank["optimizer"])


@pytest.mark.parametrize("size, gpus, nodes, backend, generation, tp, least_pp", [
    ("1.5B", 1, 1, "dtensor", "vLLM TP=1", 1, 1),
    ("32B", 8, 1, "dtensor", "vLLM TP=8", 1, 1),
    ("72B", 8, 4, "megatron", "megatron", 8, 2),  # the model must be cut: tensor parallel within a node, pipeline across
])
def test_the_recommendation_follows_the_decision_tree(size, gpus, nodes, backend, generation, tp, least_pp):
    request = PlanRequest(_qwen(size), gpus_per_node=gpus, nodes=nodes, gpu_memory=80 * GIB, seq_length=4096,
                          micro_batch=1)
    plan = make_plan(request, installed_models(PluginHost()))
    best = plan.recommended
    assert best is not None and best.fits and best.follows_rule, plan.why
    assert (best.layout.backend, best.generation_label) == (backend, generation)
    assert best.peak <= 78 * GIB and plan.rule.why in plan.why
    layout = best.layout  # every case's layout, not the 72B one's alone
    assert layout.tp == tp and layout.pp >= least_pp and layout.tp * layout.pp * layout.dp == gpus * nodes, layout


def test_the_tree_sends_a_mid_size_model_on_several_nodes_to_megatron_with_vllm():
    rule = decision_rule(PlanRequest(_qwen("32B"), gpus_per_node=8, nodes=2))
    assert (rule.backend, rule.generation) == ("megatron", "vllm")


def test_dedicated_vllm_gpus_are_a_candidate_on_one_node():
    plan = make_plan(PlanRequest(_qwen("1.5B"), gpus_per_node=4, gpu_memory=80 * GIB), installed_models(PluginHost()))
    dedicated = [c for c in plan.candidates if c.dedicated]
    fsdp = [c for c in dedicated if c.layout.backend == "dtensor"]
    assert fsdp and all(c.layout.dp == 4 - c.generation_tp for c in fsdp), [(c.layout.name, c.layout.dp) for c in dedicated]
    overrides = dedicated[0].overrides()
    assert "policy.generation.colocated.enabled=false" in overrides
    assert f"policy.generation.colocated.resources.gpus_per_node={dedicated[0].generation_tp}" in overrides
    assert plan.recommended is not None and not plan.recommended.dedicated  # colocated is simpler and fits


def test_a_model_too_big_for_the_hardware_gets_no_recommendation_and_says_why():
    plan = make_plan(PlanRequest(_qwen("72B"), gpus_per_node=1, gpu_memory=24 * GIB), installed_models(PluginHost()))
    assert plan.recommended is None and "nothing fits in 22 GiB" in plan.why and "add GPUs" in plan.why


def test_corerl_plan_on_a_model_folder_and_on_a_recipe(tmp_path):
    _qwen("32B", tmp_path / "qwen32")
    result = run_corerl("plan", str(tmp_path / "qwen32"), "policy.max_seq_length=4096",
                        "policy.train_micro_batch_size=1", "--gpus", "8", "--json")
    assert result.code == 0, result
    plan = json.loads(result.out)
    assert plan["recommended"]["backend"] == "dtensor" and plan["recommended"]["fits"]
    assert "policy.generation.vllm_cfg.tensor_parallel_size=8" in plan["recommended"]["overrides"]
    assert len(plan["candidates"]) > 10 and {c["backend"] for c in plan["candidates"]} == {"dtensor", "deepspeed",
                                                                                          "megatron"}
    shown = run_corerl("plan", str(EXAMPLES / "grpo_megatron_72b.yaml"), f"policy.model_name={tmp_path / 'qwen32'}")
    assert shown.code == 0 and "recommended" in shown.out and "corerl run" in shown.out, shown
    assert "decision tree: 32.8B parameters (10-70B) on 8 nodes: megatron + vLLM" in shown.out
    missing = run_corerl("plan", str(tmp_path / "nowhere"))
    refused_in_one_line(missing, "neither a recipe file nor a Hugging Face checkpoint folder")


def test_validate_warns_when_the_recipe_is_predicted_not_to_fit(tmp_path):
    _qwen("32B", tmp_path / "qwen32")
    args = ["validate", "--recipe-only", str(EXAMPLES / "grpo_megatron_72b.yaml"), f"policy.model_name={tmp_path / 'qwen32'}"]
    fits = run_corerl(*args, "cluster.gpu_memory_gib=80")
    assert fits.code == 0 and "predicted" not in fits.out, fits
    small = run_corerl(*args, "cluster.gpu_memory_gib=10")
    said = small.out
    assert small.code == 0 and "is predicted to need" in said and "`corerl plan RECIPE`" in said, small


def test_an_asynchronous_plan_gives_generation_gpus_of_its_own():
    models = installed_models(PluginHost())
    one_node = make_plan(PlanRequest(_qwen("1.5B"), gpus_per_node=4, gpu_memory=80 * GIB, asynchronous=True), models)
    assert one_node.candidates and all(c.dedicated for c in one_node.candidates)
    best = one_node.recommended
    assert best is not None and best.fits
    assert f"policy.generation.colocated.resources.gpus_per_node={best.generation_tp}" in best.overrides()
    assert best.layout.backend != "dtensor" or best.layout.dp == 4 - best.generation_tp  # training on the rest
    nodes = make_plan(PlanRequest(_qwen("32B"), gpus_per_node=8, nodes=3, gpu_memory=80 * GIB, asynchronous=True),
                      models)
    assert nodes.recommended is not None and nodes.recommended.dedicated_nodes == 1
    assert nodes.recommended.as_dict()["dedicated_generation_gpus"] == 8
    assert "policy.generation.colocated.resources.num_nodes=1" in nodes.recommended.overrides()
    alone = make_plan(PlanRequest(_qwen("1.5B"), gpus_per_node=1, gpu_memory=80 * GIB, asynchronous=True), models)
    assert alone.recommended is None and "needs GPUs of its own for generation" in alone.why


def test_a_lora_recipe_is_planned_without_a_reference_model():
    from corerl.config import config_from_mapping
    from corerl.planning.command import needs_reference

    host = PluginHost(env={})
    recipe = {"policy": {"model_name": "builtin:tiny-qwen2"}, "algorithm": {"kl_penalty": 0.05}}
    assert needs_reference(config_from_mapping(recipe, host))
    recipe["policy"]["lora"] = {"enabled": True}  # the reference is the policy with its adapter off
    assert not needs_reference(config_from_mapping(recipe, host))


# CUDA peaks of the second training step at world size 1 on an H200 (torch 2.11, bench/plan_accuracy.py
# --hidden 1024 --layers 8; bench/results/gpu/plan_accuracy.json and plan_accuracy-h200.log)
@pytest.mark.parametrize(("layout", "peak_mib"), [
    ("dtensor FSDP2", 1301.8), ("deepspeed ZeRO-1", 3498.4), ("deepspeed ZeRO-2", 3704.8),
    ("deepspeed ZeRO-3", 3992.4), ("megatron TP=2", 1507.1)])
def test_the_training_estimate_is_within_15_percent_of_the_cuda_peak_measured(layout, peak_mib, tmp_path):
    from corerl.models.tiny import build_tiny_model

    model = str(build_tiny_model(tmp_path / "model", hidden_size=1024, num_layers=8))
    backend, overrides = LAYOUTS[layout]
    ours = estimate_for(backend, [*overrides, "policy.max_seq_length=32"], 1, model, tmp_path, PluginHost())
    training = ours.state + ours.activations + ours.buffers
    assert abs(training / 2**20 - peak_mib) <= 0.15 * peak_mib, (training / 2**20, peak_mib)


def test_a_vision_language_model_is_planned_on_dtensor_and_on_megatron_in_one_stage():
    """The rule picks dtensor for a VLM at any size; dtensor's layouts keep tensor parallelism off (it
    refuses it for a VLM), megatron's keep one pipeline stage and the default engine (the tower's
    features reach the first stage only; megatron generation reads no images)."""
    import attrs

    request = PlanRequest(attrs.evolve(_qwen("72B"), vision=True), gpus_per_node=8, nodes=4, gpu_memory=80 * GIB)
    plan = make_plan(request, installed_models(PluginHost()))
    assert (plan.rule.backend, plan.rule.generation) == ("dtensor", "vllm")
    dtensor = [c for c in plan.candidates if c.layout.backend == "dtensor"]
    megatron = [c for c in plan.candidates if c.layout.backend == "megatron"]
    assert dtensor and all(c.layout.tp == 1 for c in dtensor)
    assert megatron and all(c.layout.pp == 1 and "generation.backend" not in " ".join(c.layout.overrides)
                            for c in megatron)


def test_long_sequences_are_planned_with_context_parallelism_where_only_it_fits():
    """Qwen2.5-1.5B on 8 x 80 GiB: at 4K tokens plain FSDP2, at 32K with activation checkpointing;
    at 64K and 128K only splitting each sequence fits (a rank keeps seq_length / cp positions),
    the smallest context-parallel size that does."""
    recommended = {}
    for tokens in (4096, 32768, 65536, 131072):
        request = PlanRequest(_qwen("1.5B"), gpus_per_node=8, gpu_memory=80 * GIB, seq_length=tokens, micro_batch=1)
        plan = make_plan(request, installed_models(PluginHost()))
        assert plan.recommended is not None, plan.why
        recommended[tokens] = (plan.recommended.layout.backend, plan.recommended.layout.cp,
                               plan.recommended.layout.activation_checkpointing)
    assert recommended == {4096: ("dtensor", 1, False), 32768: ("dtensor", 1, True), 65536: ("dtensor", 2, True),
                           131072: ("dtensor", 4, True)}
    assert "policy.dtensor_cfg.context_parallel_size=4" in plan.recommended.overrides()
