"""NeMo RL's recipe dialect: recognised, translated key by key (acts / inert / refused), `${...}`
references resolved by OmegaConf, and runs of a GRPO and an SFT recipe in that dialect.

The recipes under tests/data/nemo_rl are written for these tests in NeMo RL's key names."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, run_corerl
from tests.refusals import refused_in_one_line

DATA = REPO / "tests" / "data" / "nemo_rl"
#: NeMo RL's examples/configs: CORERL_NEMO_RL_CONFIGS, else the copy beside this checkout (../shared/nemo-rl)
CORPUS = Path(os.environ.get("CORERL_NEMO_RL_CONFIGS") or REPO.parent / "shared" / "nemo-rl" / "examples" / "configs")
# where NeMo RL's own recipes are at hand, tests/test_nemo_rl_corpus_runs.py trains them instead
_OWN_RECIPES_RUN = pytest.mark.covered_elsewhere(CORPUS.is_dir(), reason="NeMo RL's own GRPO and SFT recipes run "
                                                                        "in tests/test_nemo_rl_corpus_runs.py")
REWARD = "def digit_count(completion, example):\n    return min(1.0, completion.count(example['output']) / 8)\n"


def _rows(path: Path, words: str) -> Path:
    rows = [{"input": words.format(d=d, i=i % 7), "output": str(d)} for i, d in enumerate(list(range(10)) * 12)]
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _validate(*args: str, cwd: Path = REPO):
    return run_corerl("validate", "--recipe-only", *args, cwd=cwd)  # the recipe alone: its Hub names are not here


def test_a_nemo_rl_recipe_validates_and_explains_every_key(tmp_path):
    result = _validate(str(DATA / "base_grpo.yaml"), "--explain", "--json")
    assert result.code == 0, result
    report = result.json()
    assert report["dialect"] == "nemo-rl"
    fates = {k["key"]: (k["fate"], k["detail"]) for k in report["keys"]}
    assert fates["grpo.num_prompts_per_step"] == ("acts", "algorithm.batch_size")
    assert fates["loss_fn.ratio_clip_max"] == ("acts", "algorithm.ratio_clip_max")
    assert fates["policy.max_total_sequence_length"] == ("acts", "policy.max_seq_length")
    assert fates["policy.scheduler"] == ("acts", "policy.scheduler (constant, warmup_steps=0 optimizer steps)")
    assert fates["grpo.val_period"] == ("acts", "eval.every_n_steps")
    assert fates["policy.megatron_cfg.tensor_model_parallel_size"] == ("inert", "policy.megatron_cfg.enabled is false")
    assert fates["logger.wandb.name"][0] == "acts"  # an interpolated string, resolved then explained
    # every leaf of the recipe has a fate: nothing dropped silently
    import yaml

    def leaves(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    recipe = yaml.safe_load((DATA / "base_grpo.yaml").read_text())
    explained = set(fates) | {"policy.scheduler"}
    missing = [k for k in leaves(recipe) if k not in explained and not k.startswith("policy.scheduler")]
    assert missing == []

    text = _validate(str(DATA / "base_grpo.yaml"), "--explain")
    assert text.code == 0 and "valid (nemo-rl dialect)" in text.out
    assert "inert (" in text.out and "  grpo.val_batch_size: the held-out rows are generated in one batch" in text.out
    assert "  grpo.max_num_epochs -> algorithm.max_epochs" in text.out


def test_interpolation_and_defaults_chains_resolve_with_overrides_first(tmp_path):
    result = _validate(str(DATA / "child_grpo.yaml"), "policy.max_total_sequence_length=20", "--explain", "--json")
    assert result.code == 0, result
    # the child halves the prompts and sets the matching global batch; ${...} saw the override
    fates = {k["key"]: k for k in result.json()["keys"]}
    assert fates["policy.sequence_packing.train_mb_tokens"]["detail"] == "policy.sequence_packing.enabled is false"
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    config = load_config(DATA / "child_grpo.yaml", ["policy.max_total_sequence_length=20"], PluginHost())
    assert config.core.algorithm.batch_size == 4 and config.core.algorithm.leave_one_out_baseline is True
    assert config.core.policy.max_seq_length == 20 and config.core.policy.generation.max_new_tokens == 20
    assert config.core.policy.logprob_micro_batch_size == 64 and config.core.algorithm.ratio_clip_max == 0.28
    assert config.core.policy.tokenizer_name == "builtin:tiny-qwen2"
    assert config.core.policy.optimizer.name == "adamw" and config.core.policy.optimizer.lr == 3e-3


def test_nemo_rl_lora_keys_act(tmp_path):
    """policy.dtensor_cfg.lora_cfg (and megatron_cfg.peft, for a megatron recipe) land in policy.lora."""
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    def child(name: str, policy: str) -> Path:
        path = tmp_path / name
        path.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\npolicy:\n{policy}")
        return path

    recipe = child("lora.yaml", "  dtensor_cfg:\n    lora_cfg:\n      enabled: true\n      target_modules: [q_proj, v_proj]\n"
                                "      exclude_modules: [k_proj]\n      match_all_linear: false\n      dim: 16\n"
                                "      alpha: 64\n      dropout: 0.0\n      dropout_position: post\n"
                                "      lora_A_init: uniform\n      use_triton: true\n")
    lora = load_config(recipe, [], PluginHost()).core.policy.lora
    assert (lora.enabled, lora.target_modules, lora.exclude_modules, lora.match_all_linear, lora.dim, lora.alpha,
            lora.lora_A_init) == (True, ["q_proj", "v_proj"], ["k_proj"], False, 16, 64, "uniform")
    assert not load_config(recipe, ["policy.dtensor_cfg.lora_cfg.enabled=false"], PluginHost()).core.policy.lora.enabled
    megatron = child("megatron_lora.yaml", "  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n"
                                           "    tensor_model_parallel_size: 1\n    pipeline_model_parallel_size: 1\n"
                                           "    peft:\n      enabled: true\n      dim: 128\n      alpha: 128\n"
                                           "      lora_A_init_method: uniform\n      lora_B_init_method: zero\n")
    lora = load_config(megatron, [], PluginHost()).core.policy.lora
    assert (lora.enabled, lora.dim, lora.alpha, lora.lora_A_init) == (True, 128, 128, "uniform")
    result = _validate(str(megatron))  # the megatron backend trains LoRA with adapters of its own
    assert result.code == 0, result
    assert load_config(megatron, [], PluginHost()).section("policy.megatron_cfg").lora_type == "lora"  # Bridge's


def test_keys_nothing_maps_are_left_out_with_one_warning_and_refused_with_strict(tmp_path):
    from corerl.config import load_config
    from corerl.errors import ConfigErrors
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "newer.yaml"  # a newer NeMo RL's keys: one in its own section, one in a shared one
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\ngrpo:\n  made_up_key: 1\npolicy:\n  made_up_knob: true\n"
                      "made_up_section:\n  a: 1\n  b: 2\n")
    config = load_config(recipe, [], PluginHost())
    unknown = {f.key: f.detail for f in config.fates if f.fate == "unknown"}
    assert unknown.keys() == {"grpo.made_up_key", "policy.made_up_knob", "made_up_section.a", "made_up_section.b"}
    assert all(str(recipe) in where for where in unknown.values()), unknown
    (block,) = [w for w in config.warnings if "corerl does not know" in w]
    assert block.startswith("4 NeMo RL key(s) corerl does not know were left out: ") and "--strict" in block
    assert config.core.algorithm.name == "grpo"  # the rest of the recipe as it was
    with pytest.raises(ConfigErrors, match="grpo.made_up_key: a NeMo RL key corerl does not know"):
        load_config(recipe, [], PluginHost(), strict=True)
    shared = tmp_path / "shared.yaml"  # a key in a section corerl has too: its own validation refuses it
    shared.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\npolicy:\n  made_up_knob: true\n")
    with pytest.raises(ConfigErrors, match="policy.made_up_knob: unknown key"):
        load_config(shared, [], PluginHost(), strict=True)
    refused_in_one_line(_validate(str(recipe), "--strict"), "grpo.made_up_key: a NeMo RL key corerl does not know",
                        key="grpo.made_up_key")
    explained = _validate(str(recipe), "--explain")
    assert explained.code == 0 and "unknown (4 keys)" in explained.out and "policy.made_up_knob (" in explained.out


@pytest.mark.parametrize("override, says", [
    ("grpo.async_grpo.enabled=true", "policy.generation.colocated.enabled: asynchronous RL generates while training "
                                     "runs"),
    ("loss_fn.kl_type=sideways", "algorithm.distillation.kl_type: expected one of 'reverse', 'forward', 'mixed'"),
    ("policy.train_global_batch_size=48", "policy.train_global_batch_size: 48 sequences per optimizer step do not "
                                          "divide the 64"),
    ("grpo.adv_estimator.name=rloo", "the 'rloo' advantage estimator is not built into corerl yet"),  # gdpo and
    # opd are (opd with its on_policy_distillation section: tests/test_nemo_rl_keys_act.py)
    ("grpo.adv_estimator.name=opd", "the opd estimator distils from the teachers of on_policy_distillation, which "
                                    "is not enabled"),
    ("policy.draft.enabled=true", "speculative decoding with a draft model is not built into corerl yet"),
    ("policy.optimizer.name=torch.optim.Adagrad", "optimizer 'torch.optim.Adagrad' is not one corerl builds"),
])
def test_what_corerl_does_not_support_is_refused_in_one_line(override, says):
    line = refused_in_one_line(_validate(str(DATA / "base_grpo.yaml"), override), says)
    assert "base_grpo.yaml" in line or "override" in line, line  # where to fix it


def test_the_global_batch_sets_the_optimizer_steps_per_grpo_step_and_scales_the_warm_up(tmp_path):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "warm.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\npolicy:\n  scheduler:\n"
                      "    - name: torch.optim.lr_scheduler.LinearLR\n      kwargs: {total_iters: 5}\n"
                      "    - name: torch.optim.lr_scheduler.ConstantLR\n      kwargs: {factor: 1.0}\n"
                      "    - milestones: [5]\n")
    config = load_config(recipe, ["policy.train_global_batch_size=16"], PluginHost())
    assert config.core.algorithm.optimizer_batch_size == 16  # 64 samples: 4 optimizer steps per GRPO step
    # NeMo RL counts warm-up in GRPO steps, corerl in optimizer steps
    assert config.core.policy.scheduler.warmup_steps == 20
    assert load_config(recipe, [], PluginHost()).core.policy.scheduler.warmup_steps == 5


def test_a_nemo_rl_recipes_max_samples_is_corerls_max_train_rows(tmp_path):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "limited.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\ndata:\n  train:\n    max_samples: 100\n")
    assert load_config(recipe, [], PluginHost()).core.data.max_train_rows == 100


@pytest.mark.parametrize("decay_iters, translated", [(15, True), (10, False)])
def test_a_warm_up_then_linear_decay_to_the_last_step_is_corerls_linear_schedule(tmp_path, decay_iters, translated):
    from corerl.config import load_config
    from corerl.errors import ConfigError
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "decay.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\ngrpo:\n  max_num_steps: 20\npolicy:\n  scheduler:\n"
                      "    - name: torch.optim.lr_scheduler.LinearLR\n"
                      "      kwargs: {start_factor: 1.0e-06, end_factor: 1.0, total_iters: 5}\n"
                      "    - name: torch.optim.lr_scheduler.LinearLR\n"
                      f"      kwargs: {{start_factor: 1.0, end_factor: 0.0, total_iters: {decay_iters}}}\n"
                      "    - milestones: [5]\n")
    if translated:
        scheduler = load_config(recipe, [], PluginHost()).core.policy.scheduler
        assert (scheduler.name, scheduler.warmup_steps) == ("linear", 5)
        return
    with pytest.raises(ConfigError) as refused:
        load_config(recipe, [], PluginHost())
    assert "ends after 5 + 10 steps, not at the run's last step (20)" in refused.value.one_line()
    assert "policy.scheduler" in refused.value.one_line()


@pytest.mark.parametrize("in_flight, recompute, mode", [(False, False, "wait"), (True, False, "continue"),
                                                        (True, True, "abort")])
def test_nemo_rl_async_grpo_keys_act(tmp_path, in_flight, recompute, mode):
    from corerl.asynchronous.settings import async_settings
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "async.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\ngrpo:\n  async_grpo:\n    enabled: true\n"
                      f"    max_trajectory_age_steps: 2\n    in_flight_weight_updates: {str(in_flight).lower()}\n"
                      f"    recompute_kv_cache_after_weight_updates: {str(recompute).lower()}\n"
                      "    max_generation_failures: 0\n")
    settings = async_settings(load_config(recipe, [], PluginHost()))
    assert (settings.enabled, settings.max_staleness, settings.in_flight, settings.max_generation_failures) == (
        True, 2, mode, 0)
    off = load_config(recipe, ["grpo.async_grpo.enabled=false"], PluginHost())
    assert not async_settings(off).enabled and async_settings(off).in_flight == "continue"  # the rest inert


def test_nemo_rl_async_rl_section_turns_the_loop_on_and_its_keys_act(tmp_path):
    from corerl.asynchronous.settings import async_settings
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "async_rl.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\ngrpo:\n  async_grpo: null\nasync_rl:\n"
                      "  sampler:\n    name: windowed\n    max_staleness_versions: 3\n"
                      "  recompute_kv_cache_after_weight_updates: true\n"
                      "  min_groups_for_streaming_train: ${grpo.num_prompts_per_step}\n"
                      "  max_inflight_prompts: 16\n  max_buffered_rollouts: 64\n"
                      "  rollout_failure:\n    max_infra_attempts_per_prompt: 5\n")
    settings = async_settings(load_config(recipe, [], PluginHost()))
    assert (settings.enabled, settings.sampler, settings.max_staleness, settings.in_flight) == (
        True, "windowed", 3, "abort")
    assert (settings.max_inflight_prompts, settings.max_buffered_rollouts) == (16, 64)
    result = _validate(str(recipe), "policy.generation.colocated.enabled=false",
                       "policy.generation.colocated.resources.gpus_per_node=1", "cluster.gpus_per_node=2",
                       "--explain", "--json")
    assert result.code == 0, result
    fates = {k["key"]: (k["fate"], k["detail"]) for k in result.json()["keys"]}
    assert fates["async_rl.sampler.name"] == ("acts", "algorithm.async.sampler")
    assert fates["async_rl.min_groups_for_streaming_train"][0] == "inert"
    assert fates["async_rl.rollout_failure.max_infra_attempts_per_prompt"][0] == "inert"
    assert fates["grpo.async_grpo"][0] == "inert"


def test_dedicated_generation_takes_its_gpus_out_of_the_cluster():
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    overrides = ["policy.generation.colocated.enabled=false", "cluster.num_nodes=4", "cluster.gpus_per_node=8",
                 "policy.generation.colocated.resources.num_nodes=1"]
    core = load_config(DATA / "base_grpo.yaml", overrides, PluginHost()).core
    resources = core.policy.generation.colocated.resources
    assert (core.cluster.num_nodes, core.cluster.gpus_per_node) == (3, 8)
    assert (resources.num_nodes, resources.gpus_per_node) == (1, 8)


def test_a_nemo_rl_dpo_recipe_naming_a_hub_dataset_reads_preference_pairs(tmp_path):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = tmp_path / "dpo_hub.yaml"  # NeMo RL's dpo.yaml names HelpSteer3 on the Hub
    recipe.write_text("dpo:\n  max_num_steps: 4\npolicy:\n  model_name: builtin:tiny-qwen2\n"
                      "data:\n  train:\n    dataset_name: HelpSteer3\n    split: train\n")
    data = load_config(recipe, [], PluginHost()).core.data
    assert (data.task, data.hub_dataset) == ("preferences", "HelpSteer3")  # pairs; the Hub refused at run start
    refused_in_one_line(run_corerl("run", str(recipe), f"run.output_dir={tmp_path}"),
                        "data.hub_dataset: 'HelpSteer3' is a Hugging Face Hub dataset", key="data.hub_dataset")


def test_a_nemo_rl_dpo_recipe_runs_on_local_pairs_and_its_held_out_accuracy_rises(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"w0 {d} :", "chosen": f"{d} {d} {d}",
                                         "rejected": " ".join([str((d + k) % 10)] * 3)}) + "\n"
                             for k in range(1, 10) for d in range(10)))
    recipe = tmp_path / "dpo.yaml"
    recipe.write_text(
        "dpo:\n  max_num_steps: 80\n  max_num_epochs: 50\n  val_period: 10\n  seed: 7\n"
        "  reference_policy_kl_penalty: 0.1\n  preference_loss_weight: 1.0\n  sft_loss_weight: 0.0\n"
        "  preference_average_log_probs: false\n  sft_average_log_probs: false\n"
        "policy:\n  model_name: builtin:tiny-qwen2\n  train_global_batch_size: 32\n  train_micro_batch_size: 64\n"
        "  max_total_sequence_length: 16\n  precision: float32\n"
        "  optimizer:\n    name: torch.optim.AdamW\n    kwargs:\n      lr: 1.0e-3\n"
        f"data:\n  train_data_path: {pairs}\n")
    explained = _validate(str(recipe), "--explain")
    assert explained.code == 0, explained
    assert "algorithm.dpo.beta" in explained.out and "algorithm.batch_size (pairs per step)" in explained.out
    result = run_corerl("run", str(recipe), f"run.output_dir={tmp_path}", "run.name=dpo", "data.held_out_size=20")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "dpo" / "summary.json").read_text())
    assert summary["algorithm"] == "dpo" and summary["task"] == "preferences" and summary["dpo_steps"] == 80
    assert summary["held_out_preference_accuracy_after"] - summary["held_out_preference_accuracy_before"] >= 0.3


def test_a_reference_that_does_not_resolve_is_one_line_with_key_and_file(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("policy:\n  model_name: m\n  max_seq_length: ${policy.no_such_key}\n")
    refused_in_one_line(_validate(str(recipe)), "cannot resolve a ${...} reference", "bad.yaml",
                        key="policy.max_seq_length")


def test_a_corerl_recipe_with_a_nemo_rl_key_points_at_the_dialect(tmp_path):
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text("policy:\n  model_name: m\n  max_total_sequence_length: 64\n")
    refused_in_one_line(_validate(str(recipe)), "policy.max_total_sequence_length: unknown key",
                        "is a NeMo RL key: run the recipe with --dialect nemo-rl", key="policy.max_total_sequence_length")


def test_a_hub_dataset_is_refused_at_run_start_naming_the_local_alternative(tmp_path):
    result = run_corerl("run", str(DATA / "base_grpo.yaml"), "data.dataset_name=OpenMathInstruct-2",
                        "data.input_key=problem", f"run.output_dir={tmp_path}")
    refused_in_one_line(result, "'OpenMathInstruct-2' is a Hugging Face Hub dataset, and nothing is downloaded",
                        "data.train.data_path=train.jsonl", key="data.hub_dataset")


@pytest.mark.slow
@_OWN_RECIPES_RUN
def test_a_nemo_rl_grpo_recipe_runs_and_its_held_out_reward_rises(tmp_path):
    train = _rows(tmp_path / "train.jsonl", "w0 {d} :")
    (tmp_path / "nemo_rewards.py").write_text(REWARD)
    result = run_corerl("run", str(DATA / "base_grpo.yaml"), f"data.train_data_path={train}",
                        "data.reward=nemo_rewards:digit_count", f"run.output_dir={tmp_path}", "run.name=grpo",
                        "logger.tensorboard_enabled=false", "loss_fn.reference_policy_kl_type=k2",
                        env=clean_env({"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                                                   os.environ.get("PYTHONPATH")]))}))
    assert result.code == 0, result
    assert "running (nemo-rl dialect)" in result.out
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["grpo_steps"] == 40 and summary["training_backend"] == "dtensor"
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.2, summary
    assert not (tmp_path / "grpo" / "tensorboard").exists()  # logger.tensorboard_enabled acts


@pytest.mark.slow
@_OWN_RECIPES_RUN
def test_a_nemo_rl_sft_recipe_runs_and_its_held_out_reward_rises(tmp_path):
    train = _rows(tmp_path / "train.jsonl", "w1 {d} w{i}")
    result = run_corerl("run", str(DATA / "sft.yaml"), f"data.train.data_path={train}", f"run.output_dir={tmp_path}",
                        "run.name=sft")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["algorithm"] == "sft" and summary["steps"] == 60
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.3, summary


def test_a_logger_corerl_lacks_is_accepted_with_a_warning_and_no_network_call():
    result = _validate(str(DATA / "base_grpo.yaml"), "logger.swanlab_enabled=true", "--json")
    assert result.code == 0, result
    (warning,) = [w for w in result.json()["warnings"] if "swanlab" in w]
    assert "logger.swanlab_enabled=True: SwanLab logging is not built into corerl yet" in warning


def test_a_chat_template_in_the_recipe_formats_the_prompts():
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    template = "{% for m in messages %}Q: {{ m['content'] }} A:{% endfor %}"
    config = load_config(DATA / "sft.yaml", [f'policy.tokenizer.chat_template="{template}"'], PluginHost())
    assert config.core.policy.chat_template == template and config.core.data.apply_chat_template is True
    assert config.core.algorithm.name == "sft" and config.core.algorithm.batch_size == 16
    fates = {f.key: f.detail for f in config.fates}
    assert fates["policy.tokenizer.chat_template"] == "policy.chat_template, data.apply_chat_template"




@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"NeMo RL's recipes are not at {CORPUS}")
def test_every_key_of_nemo_rls_own_recipes_has_a_fate():
    """Every leaf key of every recipe in NeMo RL's examples/configs: a section switched off, a rule
    of the table (acts, inert, refused, derived), or a key corerl has under the same name."""
    from corerl.config import validate_tree
    from corerl.config.dialects import nemo_rl
    from corerl.config.interpolation import resolve_references
    from corerl.config.recipes import load_recipe
    from corerl.config.tree import set_at
    from corerl.errors import ConfigError, ConfigErrors
    from corerl.plugin_manager import PluginHost

    host = PluginHost()
    known: dict[str, bool] = {}

    def corerl_knows(path: str, value) -> bool:
        if path not in known:
            tree = {"policy": {"model_name": "builtin:tiny-qwen2"}}
            set_at(tree, path, value)
            try:
                validate_tree(tree, {}, host, "probe")
                known[path] = True
            except ConfigErrors as exc:
                known[path] = not any(e.message == "unknown key" for e in exc.errors)
        return known[path]

    missing, recipes = {}, 0
    for path in sorted(CORPUS.rglob("*.yaml")):
        raw, origins = load_recipe(path, host)
        try:
            raw = resolve_references(raw, origins)
        except (ConfigError, ConfigErrors):
            pass  # an environment variable this machine lacks: the keys are judged unresolved
        if not nemo_rl.looks_like(raw):
            continue
        recipes += 1
        for key, value in nemo_rl._leaves(raw):
            if nemo_rl._switched_off(key, raw) or nemo_rl.rule_for(key) or nemo_rl.is_env_workers_key(key):
                continue
            # an evaluation recipe's generation.<key> is policy.generation.<key>
            if nemo_rl.nemo_only(nemo_rl.aliased(key)) or not corerl_knows(nemo_rl.aliased(key), value):
                missing.setdefault(key, path.relative_to(CORPUS))
    assert recipes > 250
    assert not missing, f"{len(missing)} keys have no fate: " + ", ".join(f"{k} ({f})" for k, f in list(missing.items())[:20])


# -- vision-language (VLM) recipes: the Qwen-VL image families on dtensor, the rest refused in one line --

VLM_GRPO = """\
grpo:
  deduplicate_multimodal_data: false
  debug_payload_metrics: false
policy:
  model_name: Qwen/Qwen2.5-VL-3B-Instruct
  is_vlm: true
  dtensor_cfg:
    automodel_kwargs:
      freeze_config:
        freeze_vision_tower: false
        freeze_audio_tower: true
        freeze_language_model: false
  generation:
    vllm_cfg:
      limit_mm_per_prompt:
        image: 2
    vllm_kwargs:
      mm_processor_cache_gb: 0
data:
  dataset_name: clevr-cogent
  default:
    processor: vlm_hf_data_processor
"""


def _vlm_recipe(tmp_path: Path, text: str = VLM_GRPO) -> Path:
    path = tmp_path / "vlm_grpo.yaml"
    path.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\n{text}")
    return path


def _validated_in_process(capsys, *args: str) -> tuple[int, str]:
    """``corerl validate --recipe-only`` in this process: its exit code and stderr."""
    from corerl.cli import main

    code = main(["validate", "--recipe-only", *args])
    return code, capsys.readouterr().err


def test_a_qwen_vl_grpo_recipe_validates_with_its_vision_keys_acting(tmp_path, capsys):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = _vlm_recipe(tmp_path)
    config = load_config(recipe, [], PluginHost())
    core = config.core
    assert core.policy.model_name == "Qwen/Qwen2.5-VL-3B-Instruct" and core.policy.freeze_vision_tower is False
    assert core.data.hub_dataset == "clevr-cogent"  # a Hub dataset: refused only at run start, as the text ones
    engine = config.section("policy.generation.vllm_cfg").engine_args
    assert engine == {"mm_processor_cache_gb": 0, "limit_mm_per_prompt": {"image": 2}}
    fates = {f.key: (f.fate, f.detail) for f in config.fates}
    assert fates["policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_vision_tower"] == (
        "acts", "policy.freeze_vision_tower")
    for key in ("policy.is_vlm", "grpo.deduplicate_multimodal_data", "grpo.debug_payload_metrics",
                "data.default.processor", "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_audio_tower"):
        assert fates[key][0] == "inert", (key, fates[key])
    assert "the same samples and loss" in fates["grpo.deduplicate_multimodal_data"][1]
    code, err = _validated_in_process(capsys, str(recipe))
    assert code == 0, err


@pytest.mark.parametrize("override, says", [
    ("policy.model_name=Qwen/Qwen2.5-Omni-3B", "policy.model_name: Qwen/Qwen2.5-Omni-3B: audio, video and omni models "
                                               "are not built into corerl yet"),
    ("policy.model_name=google/gemma-4-E4B-it", "policy.model_name: google/gemma-4-E4B-it: corerl trains the "
                                                "vision-language families Qwen2-VL, Qwen2.5-VL and Qwen3-VL"),
    ("policy.model_name=Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen3-VL's mixture-of-experts models (qwen3_vl_moe) are "
                                                         "not built into corerl yet"),
    ("data.dataset_name=avqa", "data.dataset_name: 'avqa' is an audio or audio-visual dataset"),
    ("policy.generation.vllm_cfg.limit_mm_per_prompt.audio=1", "policy.generation.vllm_cfg.limit_mm_per_prompt.audio: "
                                                               "audio and video inputs are not built into corerl yet"),
    ("policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_language_model=true",
     "freeze_config.freeze_language_model: True is not supported: corerl trains the language model"),
])
def test_what_a_vlm_recipe_needs_beyond_the_qwen_vl_image_families_is_refused_in_one_line(tmp_path, capsys, override,
                                                                                           says):
    refused_in_one_line(_validated_in_process(capsys, str(_vlm_recipe(tmp_path)), override), says)


def test_megatron_takes_a_qwen2_5_vl_recipe_and_refuses_a_qwen3_vl_one_in_one_line(tmp_path, capsys):
    """megatron trains Qwen2.5-VL and Qwen2-VL (corerl_megatron.training.vision); a Qwen3-VL Hub name
    is refused at the megatron switch."""
    recipe = str(_vlm_recipe(tmp_path))
    code, err = _validated_in_process(capsys, recipe, "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false",
                                      "policy.megatron_cfg.tensor_model_parallel_size=1")
    assert code == 0, err
    refused_in_one_line(_validated_in_process(capsys, recipe, "policy.megatron_cfg.enabled=true",
                                              "policy.model_name=Qwen/Qwen3-VL-8B-Instruct"),
                        "policy.megatron_cfg.enabled: megatron trains the vision-language models Qwen2.5-VL and Qwen2-VL")


def test_a_text_recipe_on_a_multimodal_checkpoint_is_not_taken_for_a_vlm_recipe(tmp_path, capsys):
    """Automodel's freeze_config alone is no VLM mark: NeMo RL's Gemma 4 text recipes freeze the towers."""
    recipe = tmp_path / "text.yaml"
    recipe.write_text(f"defaults: {DATA / 'base_grpo.yaml'}\npolicy:\n  model_name: google/gemma-4-E2B-it\n"
                      "  dtensor_cfg:\n    automodel_kwargs:\n      freeze_config:\n        freeze_vision_tower: true\n")
    code, err = _validated_in_process(capsys, str(recipe))
    assert code == 0, err


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"NeMo RL's recipes are not at {CORPUS}")
def test_nemo_rls_own_vlm_recipes_validate_where_nothing_else_blocks_them(capsys):
    """The Qwen2.5-VL SFT and GRPO recipes validate (the GRPO one plays corerl's clevr_cogent, NeMo
    RL's clevr-cogent reward environment: tests/test_vlm_rewards.py); on megatron only for this
    machine's want of a GPU; with audio-visual inputs a recipe is refused in one line."""
    assert _validated_in_process(capsys, str(CORPUS / "sft_vlm_3B.yaml"))[0] == 0
    code, err = _validated_in_process(capsys, str(CORPUS / "vlm_grpo_3B.yaml"))
    assert code == 0, err
    # on megatron, refused here only for the distributed optimizer's GPU (exit 1: this machine, not the recipe)
    code, err = _validated_in_process(capsys, str(CORPUS / "vlm_grpo_3B_megatron.yaml"))
    assert code == 1 and "use_distributed_optimizer needs a GPU" in err and err.count("\n") == 1, err
    code, err = _validated_in_process(capsys, str(CORPUS / "sft_avlm.yaml"))
    assert code == 2 and "audio and video inputs are not built into corerl yet" in err, err
