"""One validation phase: every refusal a backend makes at start-up is made by `corerl validate`
too (selection calls each registration's ``check_supported``), with the same exit status and
the same line as `corerl run`."""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, run_corerl

MEGATRON = ["policy.megatron_cfg.enabled=true"]
DEEPSPEED = ["policy.deepspeed_cfg.enabled=true"]
HF = ["policy.generation.backend=hf"]
#: a Llama with head_dim 16 and 256 positions, as a user's own small checkpoint: the fixture builds it in
#: pytest's temporary folder (a fixed path in /tmp was raced on by two workers) and puts its path here
USER_MODEL = "{user_model}"
#: a tiny GLM-4.5 MoE (a sigmoid router with a per-expert bias), built the same way
GLM_MODEL = "{glm_model}"
#: a tiny gpt-oss, built the same way
GPT_OSS_MODEL = "{gpt_oss_model}"
#: a tiny Qwen3-VL, built the same way
QWEN3_VL_MODEL = "{qwen3_vl_model}"
# every refusal a registration's check (or the core's model check) makes, with the overrides that reach it
REFUSALS = [
    ["policy.dtensor_cfg.context_parallel_size=2", "policy.sequence_packing.enabled=true", "cluster.gpus_per_node=2", *HF],
    ["policy.dtensor_cfg.sequence_parallel=true", "policy.dtensor_cfg.custom_parallel_plan=my.plans:plan",
     "policy.dtensor_cfg.tensor_parallel_size=2", "cluster.gpus_per_node=2", *HF],
    ["policy.dtensor_cfg.fsdp_version=1", "policy.dtensor_cfg.tensor_parallel_size=2", "cluster.gpus_per_node=2", *HF],
    ["policy.dtensor_cfg.tensor_parallel_size=4", "cluster.gpus_per_node=4", *HF],
    ["policy.dtensor_cfg.dp_replicate_size=2", "policy.dtensor_cfg.fsdp_version=1", "cluster.gpus_per_node=2", *HF],
    ["policy.precision=float16", *HF],
    [*MEGATRON, "policy.megatron_cfg.apply_rope_fusion=true", *HF],
    [*MEGATRON, "policy.dynamic_batching.enabled=true", *HF],
    [*MEGATRON, "policy.sequence_packing.enabled=true", "policy.moe.router_replay=r2", "policy.model_name=builtin:tiny-moe",
     *HF],
    [*MEGATRON, "policy.lora.enabled=true", "policy.model_name=builtin:tiny-moe", *HF],
    [*MEGATRON, "policy.lora.enabled=true", "policy.lora.dropout=0.1", "policy.megatron_cfg.tensor_model_parallel_size=2",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.lora.enabled=true", "policy.lora.match_all_linear=false",
     "policy.lora.target_modules=[q_proj,lm_head]", *HF],
    [*MEGATRON, "policy.lora.enabled=true", "policy.megatron_cfg.lora_type=lora", "policy.lora.match_all_linear=false",
     "policy.lora.target_modules=[q_proj]", *HF],
    ["policy.lora.enabled=true", "policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.sequence_parallel=true",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.tensor_model_parallel_size=2", "policy.megatron_cfg.sequence_parallel=true",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "algorithm.name=ppo", "critic.megatron_cfg.enabled=true",
     "critic.megatron_cfg.tensor_model_parallel_size=2", "critic.megatron_cfg.sequence_parallel=true",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.context_parallel_size=2", "policy.precision=bfloat16", "cluster.gpus_per_node=2",
     *HF],
    [*MEGATRON, "policy.megatron_cfg.context_parallel_size=2", "policy.sequence_packing.enabled=true",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.expert_model_parallel_size=2", "cluster.gpus_per_node=2", *HF],
    # mixtures of experts (builtin:tiny-moe: 8 experts, top-2)
    [*MEGATRON, "policy.megatron_cfg.expert_model_parallel_size=2", "policy.model_name=builtin:tiny-moe",
     "cluster.gpus_per_node=3", *HF],
    ["policy.dtensor_cfg.expert_parallel_size=3", "policy.model_name=builtin:tiny-moe", "cluster.gpus_per_node=3", *HF],
    ["policy.moe.router_replay=r2", *HF],
    ["policy.hf_config_overrides.num_experts_per_tok=9", "policy.model_name=builtin:tiny-moe", *HF],
    ["policy.moe.router_replay=r3", "policy.model_name=builtin:tiny-moe"],
    [*MEGATRON, "policy.moe.router_replay=r3", "policy.megatron_cfg.activation_checkpointing=true",
     "policy.megatron_cfg.pipeline_model_parallel_size=2", "cluster.gpus_per_node=2", "policy.model_name=builtin:tiny-moe",
     *HF],
    [*MEGATRON, "policy.moe.router_replay=r3", "policy.megatron_cfg.mtp_num_layers=1", "policy.model_name=builtin:tiny-moe",
     *HF],
    ["policy.lora.enabled=true", "policy.model_name=builtin:tiny-moe"],
    ["policy.dtensor_cfg.tensor_parallel_size=2", "policy.model_name=builtin:tiny-moe", "cluster.gpus_per_node=2", *HF],
    ["policy.dtensor_cfg.expert_parallel_size=2", "policy.dtensor_cfg.fsdp_version=1", "policy.model_name=builtin:tiny-moe",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.expert_tensor_parallel_size=2", "policy.model_name=builtin:tiny-moe",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.tensor_model_parallel_size=2", "policy.model_name=builtin:tiny-moe",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, "policy.megatron_cfg.moe_enable_deepep=true", "policy.model_name=builtin:tiny-moe", *HF],
    [*MEGATRON, "policy.megatron_cfg.converter_type=NemotronHForCausalLM", *HF],
    [*MEGATRON, f"policy.model_name={GLM_MODEL}", "policy.hf_config_overrides.norm_topk_prob=false", *HF],
    [*MEGATRON, f"policy.model_name={GLM_MODEL}", "policy.hf_config_overrides.n_group=2",
     "policy.hf_config_overrides.topk_group=2", *HF],
    [*MEGATRON, "policy.moe.load_balancing_type=aux_loss", "policy.moe.aux_loss_coeff=0.01", "cluster.gpus_per_node=2",
     "policy.megatron_cfg.pipeline_model_parallel_size=2", "policy.model_name=builtin:tiny-moe", *HF],
    ["policy.moe.aux_loss_coeff=0.01", "policy.model_name=builtin:tiny-moe", *HF],
    ["policy.moe.expert_bias=true", "policy.model_name=builtin:tiny-moe", *HF],
    ["policy.moe.expert_bias=false", f"policy.model_name={GLM_MODEL}", *HF],
    ["policy.moe.expert_bias_update_rate=0.001", f"policy.model_name={GLM_MODEL}", *HF],
    [*DEEPSPEED, "policy.moe.z_loss_coeff=0.001", f"policy.model_name={GLM_MODEL}", *HF],
    [*MEGATRON, "policy.moe.router_replay=r2", "policy.megatron_cfg.activation_checkpointing=true",
     "policy.model_name=builtin:tiny-moe", *HF],
    [*MEGATRON, "policy.megatron_cfg.tensor_model_parallel_size=4", "cluster.gpus_per_node=4", *HF],
    [*MEGATRON, "policy.megatron_cfg.pipeline_model_parallel_size=2",
     "policy.megatron_cfg.num_layers_in_first_pipeline_stage=2", "cluster.gpus_per_node=2", *HF],
    # vision-language models (builtin:tiny-vl, a Qwen2.5-VL)
    [*MEGATRON, "policy.model_name=builtin:tiny-vl", "policy.megatron_cfg.pipeline_model_parallel_size=2",
     "cluster.gpus_per_node=2", *HF],
    [*MEGATRON, f"policy.model_name={QWEN3_VL_MODEL}", *HF],
    [*MEGATRON, "policy.model_name=builtin:tiny-vl", "policy.generation.backend=megatron"],
    ["policy.dtensor_cfg.tensor_parallel_size=2", "policy.model_name=builtin:tiny-vl", "cluster.gpus_per_node=2", *HF],
    ["policy.sequence_packing.enabled=true", "policy.model_name=builtin:tiny-vl", "data.task=shape_colour", *HF],
    ["algorithm.name=ppo", "policy.model_name=builtin:tiny-vl", "data.task=shape_colour", *HF],
    ["policy.generation.backend=vllm", "policy.model_name=builtin:tiny-vl", "data.task=shape_colour"],
    [*DEEPSPEED, "policy.precision=float16", *HF],
    [*DEEPSPEED, "policy.deepspeed_cfg.offload_optimizer=nvme", "policy.deepspeed_cfg.nvme_path=/tmp", *HF],
    ["policy.generation.vllm_cfg.tensor_parallel_size=4", "cluster.gpus_per_node=4"],
    [f"policy.model_name={USER_MODEL}", "policy.max_seq_length=256", "policy.generation.vllm_cfg.cpu_kvcache_space_gib=1"],
    ["policy.lora.enabled=true", "policy.lora.match_all_linear=false", "policy.lora.target_modules=[q_proj,lm_head]"],
    ["policy.lora.enabled=true", "policy.lora.dim=1024"],
    ["policy.generation.backend=vllm", "policy.generation.vllm_cfg.engine_args.quantization=fp8"],
    [f"policy.model_name={USER_MODEL}", "policy.max_seq_length=1024", *HF],
    ["algorithm.optimizer_batch_size=5", *HF],
    ["algorithm.name=ppo", "algorithm.dynamic_sampling.enabled=true", *HF],
    ["algorithm.dynamic_sampling.enabled=true", "algorithm.async.enabled=true", "policy.generation.colocated.enabled=false",
     "policy.generation.colocated.resources.gpus_per_node=1", *HF],
    ["algorithm.name=sft", "algorithm.reward_scaling.enabled=true", *HF],
    ["algorithm.use_cispo=true", "algorithm.ratio_clip_c=3", *HF],
    ["algorithm.policy_loss=sapo", "algorithm.use_cispo=true", *HF],
    ["algorithm.policy_loss=rollout_is", "algorithm.sequence_level_ratios=true", *HF],
    ["algorithm.policy_loss=clip_cov", "algorithm.clip_cov_lb=6", *HF],
    ["algorithm.name=sft", "algorithm.policy_loss=kl_cov", *HF],
    ["algorithm.step_wise_trajectories=true", "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=0.1", *HF],
    ["algorithm.step_wise_trajectories=true", "algorithm.name=ppo", *HF],
    ["algorithm.advantage_estimator=maxrl", "algorithm.leave_one_out_baseline=true", *HF],
    ["algorithm.use_kl_in_reward=true", "algorithm.advantage_estimator=reinforce_plus_plus", *HF],
    ["algorithm.token_level_loss=false", "algorithm.loss_aggregation=constant_length", *HF],
    ["algorithm.advantage_estimator=gdpo", *HF],
    ["algorithm.advantage_estimator=gdpo", "data.env_name=math_multi_reward", "algorithm.use_kl_in_reward=true",
     "algorithm.kl_penalty=0.1", *HF],
    ["policy.generation.backend=vllm", "policy.generation.vllm_cfg.kv_cache_dtype=fp8", f"policy.model_name={USER_MODEL}"],
    ["policy.generation.backend=vllm", f"policy.model_name={GPT_OSS_MODEL}"],
    ["policy.generation.backend=sglang", "policy.generation.colocated.enabled=false",
     "policy.generation.colocated.resources.gpus_per_node=1"],
    ["policy.generation.backend=sglang", "policy.generation.sglang_cfg.tp_size=2"],
    ["policy.generation.backend=sglang", "policy.model_name=builtin:tiny-vl", "data.task=shape_colour"],
    ["policy.generation.backend=sglang"],
]
# reached only on a machine with a GPU or for another cluster (the CPU refusal of the same option comes first here)
GPU_ONLY = {"check_generation_supported", "check_fp8_training", "check_transformer_engine", "check_split_engine",
            "check_installed"}
CHECKED = ["plugins/dtensor/src/corerl_dtensor/support.py", "plugins/megatron/src/corerl_megatron/support.py",
           "plugins/deepspeed/src/corerl_deepspeed/support.py", "plugins/vllm_gen/src/corerl_vllm/support.py",
           "plugins/sglang_gen/src/corerl_sglang/support.py",
           "core/src/corerl/models/facts.py", "core/src/corerl/algorithms/checks.py",
           "core/src/corerl/algorithms/step_wise.py"]


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    from corerl.models.tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("user-llama")
    build_tiny_model(folder, family="llama", hidden_size=64, num_heads=4, num_kv_heads=2, max_positions=256)
    return str(folder)


@pytest.fixture(scope="module")
def glm_model(tmp_path_factory):
    from corerl.models.tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("user-glm")
    build_tiny_model(folder, family="glm4_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     num_experts=4, max_positions=256)
    return str(folder)


@pytest.fixture(scope="module")
def models(user_model, glm_model, tmp_path_factory):
    """The placeholders' models (the gpt-oss one a transformers model saved as it is)."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from corerl.models.tiny import build_tiny_model, build_tokenizer
    from tests.gpt_oss_checkpoint import SHAPE

    folder = tmp_path_factory.mktemp("user-gpt-oss")
    torch.manual_seed(0)
    GptOssForCausalLM(GptOssConfig(**{**SHAPE, "max_position_embeddings": 256})).save_pretrained(folder)
    build_tokenizer(SHAPE["vocab_size"]).save_pretrained(folder)
    qwen3_vl = tmp_path_factory.mktemp("user-qwen3-vl")
    build_tiny_model(qwen3_vl, family="qwen3_vl")
    return {USER_MODEL: user_model, GLM_MODEL: glm_model, GPT_OSS_MODEL: str(folder), QWEN3_VL_MODEL: str(qwen3_vl)}


def _with_model(overrides: list[str], models: dict[str, str]) -> list[str]:
    out = []
    for override in overrides:
        for placeholder, model in models.items():
            override = override.replace(placeholder, model)
        out.append(override)
    return out


def _raise_sites() -> set[tuple[str, int]]:
    """Every ``raise`` of a user-facing refusal in the checked modules (outside GPU-only checks)."""
    sites = set()
    for relative in CHECKED:
        tree = ast.parse((REPO / relative).read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in GPU_ONLY):
            sites |= {(relative, node.lineno) for node in ast.walk(function) if isinstance(node, ast.Raise)}
    return sites


def test_every_refusal_of_every_check_is_reached_by_a_case_and_said_in_one_line(models):
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.errors import ConfigErrors, CorerlError
    from corerl.plugin_manager import PluginHost

    host = PluginHost(env={})
    reached = set()
    for overrides in REFUSALS:
        config = load_config(REPO / "core/src/corerl/recipes/demo.yaml", _with_model(overrides, models), host)
        with pytest.raises(CorerlError) as refused:
            select(config, host)
        # a check's refusal comes as ConfigErrors (with its origin); each error keeps its own traceback
        (error,) = refused.value.errors if isinstance(refused.value, ConfigErrors) else [refused.value]
        assert error.key and "\n" not in str(refused.value), (overrides, refused.value)
        frames = traceback.extract_tb(error.__traceback__)
        site = next((str(Path(f.filename).relative_to(REPO)), f.lineno) for f in reversed(frames)
                    if f.filename.startswith(str(REPO)) and str(Path(f.filename).relative_to(REPO)) in CHECKED)
        reached.add(site)
    assert sorted(_raise_sites() - reached) == [], f"refusals no case reaches: {sorted(_raise_sites() - reached)}"


CASES = [(overrides[0].split("=")[0], overrides) for overrides in REFUSALS]


@pytest.mark.slow
@pytest.mark.parametrize("first, overrides", CASES, ids=[" ".join(o) for _, o in CASES])
def test_validate_refuses_what_run_refuses_at_start_up(tmp_path, models, first, overrides):
    overrides = _with_model(overrides, models)
    validate = run_corerl("validate", "core/src/corerl/recipes/demo.yaml", *overrides)
    # no cluster named: GPU-only options are judged by this machine, as validate judges them
    run = run_corerl("run", *overrides, f"run.output_dir={tmp_path}", env=clean_env(shared_ray=False))
    assert validate.code in (1, 2) and validate.code == run.code, (validate, run)
    (said,) = validate.err.strip().splitlines()
    assert run.err.strip().splitlines() == [said], (validate, run)
    assert "Traceback" not in validate.err + run.err and list(tmp_path.iterdir()) == []
