"""SkyRL's keys, shown by the corerl config they build: each key family changes what runs; the
refusals are one line each; a key SkyRL does not have gets a did-you-mean naming its script line;
``trainer.strategy`` picks the training backend through the installed plugins' sections; and every
key of every corpus script gets a fate (issue 75)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest

from corerl.config.dialects.skyrl import lookup, script
from corerl.config.dialects.skyrl.translate import translate
from corerl.config.tree import value_at
from corerl.errors import ConfigError, ConfigErrors
from tests.refusals import refused_in_one_line

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "skyrl" / "examples"


def _tree(overrides: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def _run(entry_point: str = "main_base", strict: bool = False, **overrides: Any):
    keys = {key.replace("__", "."): value for key, value in overrides.items()}
    return translate(_tree(keys), {key: "run.sh:1" for key in keys}, strict, None, entry_point)


def _get(entry_point: str = "main_base", **overrides: Any) -> dict[str, Any]:
    return _run(entry_point, **overrides).tree


def test_batch_sizes_set_prompts_samples_and_optimizer_steps():
    tree = _get(trainer__train_batch_size=16, trainer__policy_mini_batch_size=4, generator__n_samples_per_prompt=8,
                trainer__micro_train_batch_size_per_gpu=2, trainer__update_epochs_per_batch=2)
    assert value_at(tree, "algorithm.batch_size") == 16
    assert value_at(tree, "algorithm.num_generations_per_prompt") == 8
    assert value_at(tree, "algorithm.optimizer_batch_size") == 32  # 4 prompts x 8 samples: 4 optimizer steps
    assert value_at(tree, "policy.train_micro_batch_size") == 2
    assert value_at(tree, "algorithm.optimization_passes") == 2
    with pytest.raises(ConfigErrors, match="do not divide"):
        _run(trainer__train_batch_size=16, trainer__policy_mini_batch_size=5)


def test_unset_keys_take_skyrls_defaults():
    tree = _get(trainer__train_batch_size=8, trainer__policy_mini_batch_size=8)
    assert value_at(tree, "algorithm.num_generations_per_prompt") == 5
    assert value_at(tree, "algorithm.kl_penalty") == 0.001  # use_kl_loss with kl_loss_coef
    assert value_at(tree, "policy.max_seq_length") == 512 + 1024
    assert value_at(tree, "policy.precision") == "bfloat16"  # trainer.bf16's default
    assert value_at(_get(trainer__bf16=False), "policy.precision") == "float32"


def test_estimators_and_losses_choose_the_algorithm():
    assert value_at(_get(trainer__algorithm__advantage_estimator="gae"), "algorithm.name") == "ppo"
    rloo = _get(trainer__algorithm__advantage_estimator="rloo")
    assert value_at(rloo, "algorithm.leave_one_out_baseline") is True
    assert value_at(rloo, "algorithm.scale_rewards_by_std") is False
    assert value_at(_get(trainer__algorithm__advantage_estimator="reinforce++"),
                    "algorithm.advantage_estimator") == "reinforce_plus_plus"
    assert value_at(_get(trainer__algorithm__policy_loss_type="gspo"), "algorithm.sequence_level_ratios") is True
    assert value_at(_get(trainer__algorithm__policy_loss_type="dual_clip", trainer__algorithm__clip_ratio_c=5.0),
                    "algorithm.ratio_clip_c") == 5.0
    cispo = _get(trainer__algorithm__policy_loss_type="cispo", trainer__algorithm__cispo__cispo_eps_clip_high=4.0)
    assert value_at(cispo, "algorithm.use_cispo") is True and value_at(cispo, "algorithm.ratio_clip_max") == 4.0
    assert value_at(_get(trainer__algorithm__grpo_norm_by_std=False), "algorithm.scale_rewards_by_std") is False
    assert value_at(_get("on_policy_distillation", trainer__ref__model__path="teacher"),
                    "algorithm.distillation.teacher_model") == "teacher"
    assert value_at(_get("fully_async", trainer__fully_async__max_staleness_steps=3), "algorithm.async.max_staleness") == 3


def test_the_other_policy_losses_and_their_own_keys():
    rollout_is = _get("fully_async", trainer__algorithm__policy_loss_type="rollout_is",
                      trainer__algorithm__eps_clip_high=0.28)
    assert value_at(rollout_is, "algorithm.policy_loss") == "rollout_is"
    assert value_at(rollout_is, "algorithm.ratio_clip_max") == 0.28  # its range's upper bound
    sapo = _get(trainer__algorithm__policy_loss_type="sapo", trainer__algorithm__sapo__tau_pos=1.5,
                trainer__algorithm__sapo__tau_neg=2.0)
    assert (value_at(sapo, "algorithm.policy_loss"), value_at(sapo, "algorithm.sapo_tau_pos"),
            value_at(sapo, "algorithm.sapo_tau_neg")) == ("sapo", 1.5, 2.0)
    clip_cov = _get(trainer__algorithm__policy_loss_type="clip_cov", trainer__algorithm__clip_cov__clip_ratio=0.01,
                    trainer__algorithm__clip_cov__clip_cov_lb=0.5, trainer__algorithm__clip_cov__clip_cov_ub=4.0)
    assert [value_at(clip_cov, f"algorithm.{key}") for key in ("policy_loss", "clip_cov_ratio", "clip_cov_lb",
                                                                "clip_cov_ub")] == ["clip_cov", 0.01, 0.5, 4.0]
    kl_cov = _get(trainer__algorithm__policy_loss_type="kl_cov", trainer__algorithm__kl_cov__kl_cov_frac=0.1,
                  trainer__algorithm__kl_cov__ppo_kl_coef=2.0)
    assert [value_at(kl_cov, f"algorithm.{key}") for key in ("policy_loss", "kl_cov_ratio", "kl_cov_coef")] == [
        "kl_cov", 0.1, 2.0]
    # a loss's own keys are inert with another loss, and SkyRL's defaults of them are corerl's
    result = _run(trainer__algorithm__policy_loss_type="regular", trainer__algorithm__sapo__tau_pos=3.0)
    assert value_at(result.tree, "algorithm.sapo_tau_pos") is None
    assert any(fate.key == "trainer.algorithm.sapo.tau_pos" and fate.fate == "inert" for fate in result.fates)
    from corerl.config.schema import AlgorithmConfig

    defaults = AlgorithmConfig()
    assert (defaults.sapo_tau_pos, defaults.sapo_tau_neg, defaults.clip_cov_ratio, defaults.clip_cov_lb,
            defaults.clip_cov_ub, defaults.kl_cov_ratio, defaults.kl_cov_coef) == (1.0, 1.05, 0.0002, 1.0, 5.0, 0.2, 1.0)


@pytest.mark.parametrize("loss", ["rollout_is", "sapo", "clip_cov", "kl_cov"])
def test_a_script_with_another_policy_loss_validates(capsys, tmp_path, loss):
    code, err = _validate(capsys, tmp_path, "trainer.policy.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                          f"trainer.algorithm.policy_loss_type={loss}",
                          "trainer.algorithm.clip_ratio_c=3.0")  # dual clip's: inert with these losses
    assert code == 0, err


def test_kl_clipping_and_loss_reduction():
    assert value_at(_get(trainer__algorithm__use_kl_loss=False), "algorithm.kl_penalty") == 0.0
    assert value_at(_get(trainer__algorithm__kl_loss_coef=0.05), "algorithm.kl_penalty") == 0.05
    reward = _get(trainer__algorithm__use_kl_loss=False, trainer__algorithm__use_kl_in_reward=True)
    assert value_at(reward, "algorithm.use_kl_in_reward") is True and value_at(reward, "algorithm.kl_penalty") == 0.001
    clip = _get(trainer__algorithm__eps_clip_low=0.1, trainer__algorithm__eps_clip_high=0.28)
    assert (value_at(clip, "algorithm.ratio_clip_min"), value_at(clip, "algorithm.ratio_clip_max")) == (0.1, 0.28)
    drgrpo = _get(trainer__algorithm__loss_reduction="seq_mean_token_sum_norm", trainer__algorithm__max_seq_len=2048)
    assert value_at(drgrpo, "algorithm.loss_aggregation") == "constant_length"
    assert value_at(drgrpo, "algorithm.loss_aggregation_length") == 2048
    assert value_at(_get(trainer__algorithm__loss_reduction="sequence_mean"),
                    "algorithm.loss_aggregation") == "sequence_mean"
    tis = _get(trainer__algorithm__off_policy_correction__tis_ratio_type="token",
               trainer__algorithm__off_policy_correction__token_tis_ratio_clip_high=3.0)
    assert value_at(tis, "algorithm.importance_sampling_correction") is True
    assert value_at(tis, "algorithm.importance_weight_cap") == 3.0


def test_sequence_level_tis_weighs_each_sequence_by_its_capped_ratio_product():
    sequence = _get(trainer__algorithm__off_policy_correction__tis_ratio_type="sequence")
    assert value_at(sequence, "algorithm.importance_sampling_type") == "seq-tis"
    assert value_at(sequence, "algorithm.importance_weight_cap") == 5.0  # SkyRL's default clip
    capped = _get(trainer__algorithm__off_policy_correction__tis_ratio_type="sequence",
                  trainer__algorithm__off_policy_correction__sequence_tis_ratio_clip_high=8.0)
    assert value_at(capped, "algorithm.importance_weight_cap") == 8.0
    with pytest.raises(ConfigErrors, match="sequence-level TIS together with a geometric sequence mask"):
        _run(trainer__algorithm__off_policy_correction__sequence_mask_metric="geometric",
             trainer__algorithm__off_policy_correction__tis_ratio_type="sequence")


def test_dapo_dynamic_sampling_and_overlong_buffer():
    tree = _get("dapo", trainer__algorithm__dynamic_sampling__type="filter",
                trainer__algorithm__dynamic_sampling__max_sample_batches=7, trainer__algorithm__overlong_buffer_len=512,
                trainer__algorithm__overlong_buffer_penalty_factor=0.5, generator__apply_overlong_filtering=True,
                generator__sampling_params__max_generate_length=4096)
    assert value_at(tree, "algorithm.dynamic_sampling.enabled") is True
    assert value_at(tree, "algorithm.dynamic_sampling.max_generation_batches") == 7
    assert value_at(tree, "algorithm.overlong_penalty") == {"enabled": True, "buffer_length": 512, "penalty": 0.5,
                                                            "max_response_length": 4096}
    assert value_at(tree, "algorithm.overlong_filtering") is True


def test_model_optimizer_sampling_evaluation_and_checkpoints():
    tree = _get(trainer__policy__model__path="Qwen/Qwen2.5-0.5B", trainer__policy__optimizer_config__lr=3e-6,
                trainer__policy__optimizer_config__num_warmup_steps=5,
                trainer__policy__optimizer_config__scheduler="cosine", trainer__policy__model__lora__rank=16,
                generator__sampling_params__temperature=0.7, generator__sampling_params__top_k=-1,
                generator__max_turns=3, trainer__eval_interval=4, trainer__eval_before_train=False,
                generator__eval_n_samples_per_prompt=2, trainer__ckpt_interval=20, trainer__max_ckpts_to_keep=3,
                trainer__max_training_steps=30, trainer__placement__policy_num_gpus_per_node=2)
    assert value_at(tree, "policy.model_name") == "Qwen/Qwen2.5-0.5B"
    assert value_at(tree, "policy.optimizer.lr") == 3e-6
    assert value_at(tree, "policy.scheduler") == {"warmup_steps": 5, "name": "cosine"}
    assert value_at(tree, "policy.generation.temperature") == 0.7 and value_at(tree, "policy.generation.top_k") is None
    assert value_at(tree, "algorithm.max_rollout_turns") == 3
    assert value_at(tree, "eval") == {"every_n_steps": 4, "at_start": False, "num_samples": 2}
    assert value_at(tree, "checkpointing") == {"enabled": True, "save_period": 20, "keep_last": 3}
    assert value_at(tree, "algorithm.max_steps") == 30
    assert value_at(tree, "cluster.gpus_per_node") == 2


def test_data_and_environment_in_skyrls_layout():
    tree = _get(data__train_data=["/d/train.parquet"], data__val_data="/d/val.parquet",
                environment__env_class="text2sql", environment__skyrl_gym__text2sql__db_path="/db",
                environment__skyrl_gym__search__topk=3)
    assert value_at(tree, "data") == {
        "train_files": ["/d/train.parquet"], "held_out_files": ["/d/val.parquet"], "env_name": "skyrl_gym",
        "task": "dataset", "prompt_key": "prompt", "answer_key": "reward_spec.ground_truth",
        "apply_chat_template": True}
    assert value_at(tree, "env.skyrl_gym") == {"env_class": "text2sql", "env_config": {"db_path": "/db"}}


def test_sft_entry_points_keys_at_the_top_level():
    tree = _get("sft", model__path="Qwen/Qwen3-0.6B", optimizer_config__lr=1e-5, batch_size=8, num_steps=5,
                max_length=1024, train_datasets=["/d/sft.parquet"], strategy="fsdp2")
    assert value_at(tree, "algorithm") == {"name": "sft", "batch_size": 8, "max_steps": 5}
    assert value_at(tree, "policy.model_name") == "Qwen/Qwen3-0.6B" and value_at(tree, "policy.optimizer.lr") == 1e-5
    assert value_at(tree, "policy.max_seq_length") == 1024
    assert value_at(tree, "data.train_files") == ["/d/sft.parquet"]
    assert value_at(tree, "policy.dtensor_cfg.enabled") is True


def test_the_strategy_switch_picks_the_backend_through_the_plugins_sections():
    sections = {reg.id for reg, _ in lookup.table().sections}
    if "skyrl.dtensor" in sections:
        fsdp = _run(trainer__strategy="fsdp2", trainer__policy__fsdp_config__cpu_offload=True,
                    trainer__policy__megatron_config__tensor_model_parallel_size=2)
        assert value_at(fsdp.tree, "policy.dtensor_cfg") == {"enabled": True, "cpu_offload": True}
        assert "megatron_cfg" not in fsdp.tree["policy"]  # the other engine's section is inert
    if "skyrl.megatron" in sections:
        megatron = _get(trainer__strategy="megatron", trainer__policy__megatron_config__tensor_model_parallel_size=2)
        # SkyRL's default adapter layout rides along (Megatron-Bridge's fused LoRA; read only with LoRA on)
        assert value_at(megatron, "policy.megatron_cfg") == {"enabled": True, "tensor_model_parallel_size": 2,
                                                             "lora_type": "lora"}
    if "skyrl.vllm" in sections:
        vllm = _get(generator__inference_engine__backend="vllm",
                    generator__inference_engine__gpu_memory_utilization=0.5)
        assert value_at(vllm, "policy.generation.backend") == "vllm"
        assert value_at(vllm, "policy.generation.vllm_cfg.gpu_memory_utilization") == 0.5
    with pytest.raises(ConfigErrors, match="no installed plugin runs it") as caught:
        _run(trainer__strategy="horovod")
    assert caught.value.errors[0].key == "trainer.strategy"


def _validate(capsys: pytest.CaptureFixture[str], tmp_path: Path, *overrides: str) -> tuple[int, str]:
    from corerl.cli import main

    launch = tmp_path / "run.sh"
    launch.write_text("#!/bin/bash\npython -m skyrl.train.entrypoints.main_base \\\n  "
                      + " \\\n  ".join(overrides) + "\n")
    code = main(["validate", "--recipe-only", str(launch)])
    return code, capsys.readouterr().err


def test_a_key_skyrl_does_not_have_is_one_line_with_a_did_you_mean(capsys, tmp_path):
    line = refused_in_one_line(_validate(capsys, tmp_path, "trainer.strategy=fsdp2", "trainer.polcy.model.path=x"),
                               "SkyRL has no such key", "did you mean trainer.policy.model.path?", "run.sh:4",
                               key="trainer.polcy.model.path")
    assert "trainer.polcy" in line


@pytest.mark.parametrize(("override", "says"), [
    ("trainer.algorithm.policy_loss_type=dppo", "'dppo' policy loss is not built into corerl"),
    ("trainer.algorithm.advantage_estimator=simple_baseline", "'simple_baseline' advantage estimator"),
    ("trainer.algorithm.use_entropy_loss=true", "entropy bonus"),
    ("trainer.resume_path=/ckpt", "resuming from a given checkpoint folder"),
])
def test_refusals_are_one_line_naming_the_key_and_the_feature(capsys, tmp_path, override, says):
    refused_in_one_line(_validate(capsys, tmp_path, override), says, key=override.split("=")[0])


def test_a_skyrl_key_without_a_rule_is_unknown_and_strict_refuses_it(monkeypatch):
    from corerl.config.dialects.skyrl import keys

    # a key SkyRL has, left without a rule (a copy: deleting from RULES itself and putting it back
    # at teardown would move the key to the end, and the generated table with it)
    monkeypatch.setattr(keys, "RULES", {k: v for k, v in keys.RULES.items() if k != "trainer.project_name"})
    lookup._TABLES.clear()
    try:
        result = _run(trainer__project_name="p")
        assert [(f.key, f.fate) for f in result.fates if f.key == "trainer.project_name"] == [
            ("trainer.project_name", "unknown")]
        with pytest.raises(ConfigErrors, match="a SkyRL key corerl does not know"):
            _run(strict=True, trainer__project_name="p")
    finally:
        lookup._TABLES.clear()


def test_the_table_covers_every_key_skyrls_configuration_has():
    rl = [key for key in lookup.known_keys("main_base") if lookup.rule_for(key, "main_base") is None
          and key not in lookup.table().switch_keys() and not any(k.startswith(key + ".") for k in
                                                                    lookup.known_keys("main_base"))]
    assert rl == []
    sft = [key for key in lookup.known_keys("sft") if lookup.rule_for(key, "sft") is None
           and key not in lookup.table().switch_keys() and not any(k.startswith(key + ".") for k in
                                                                     lookup.known_keys("sft"))]
    assert sft == []


@pytest.mark.skipif(not CORPUS.is_dir(), reason="SkyRL's corpus (../shared/skyrl) is not here")
def test_every_key_of_every_corpus_script_has_a_fate():
    scripts = sorted(glob.glob(str(CORPUS / "**" / "*.sh"), recursive=True))
    read, translated = 0, 0
    for path in scripts:
        try:
            launch = script.read(path, environ={"HOME": "/home/u"})
        except ConfigError:
            continue  # not a training script (data, servers), or a shell form the reader refuses
        read += 1
        raw, origins = launch.tree()
        try:
            result = translate(raw, origins, True, None, launch.entry_point.id)
        except ConfigErrors as errors:
            assert all("no such key" not in error.message and "does not know" not in error.message
                       for error in errors.errors), (path, errors)
            continue
        translated += 1
        fated = {fate.key for fate in result.fates}
        missing = [key for key, _ in lookup.leaves(raw) if key not in fated]
        assert missing == [], (path, missing)
    assert read >= 100 and translated >= 40, (read, translated)


def test_importance_sampling_masks_splits_and_sharding():
    geometric = _get(trainer__algorithm__off_policy_correction__sequence_mask_metric="geometric",
                     trainer__algorithm__off_policy_correction__geo_mask_low=0.98)
    assert value_at(geometric, "algorithm.importance_sampling_type") == "seq-mask"  # a mask, no weight, as SkyRL's
    assert (value_at(geometric, "algorithm.importance_weight_min"),
            value_at(geometric, "algorithm.importance_weight_cap")) == (0.98, 1.01)
    with pytest.raises(ConfigErrors, match="together with a geometric sequence mask"):
        _run(trainer__algorithm__off_policy_correction__sequence_mask_metric="geometric",
             trainer__algorithm__off_policy_correction__tis_ratio_type="token")
    assert value_at(_get("sft", train_datasets=["/d"], train_dataset_splits=["train[:100]"]),
                    "data.max_train_rows") == 100
    if "skyrl.dtensor" in {reg.id for reg, _ in lookup.table().sections}:
        _run(trainer__strategy="fsdp2", trainer__placement__policy_num_gpus_per_node=4,
             trainer__policy__fsdp_config__fsdp_size=4)  # every worker: FSDP's own sharding
        with pytest.raises(ConfigErrors, match="hybrid sharding"):  # a group that does not divide the workers
            _run(trainer__strategy="fsdp2", trainer__placement__policy_num_gpus_per_node=4,
                 trainer__policy__fsdp_config__fsdp_size=3)


def test_an_entry_point_adding_code_corerl_lacks_is_refused_and_async_schedules_act():
    with pytest.raises(ConfigErrors, match="adds the recursive language model"):
        _run("rlm")
    assert value_at(_get("generate"), "eval.only") is True  # main_generate: the model evaluated as it is
    assert value_at(_get("async"), "algorithm.async") == {"enabled": True, "max_staleness": 1}
    assert value_at(_get("dapo_fully_async"), "algorithm.async.enabled") is True


def test_the_simulated_trainers_keys_act_in_the_fully_asynchronous_schedule_and_are_refused_elsewhere():
    """fully_async_sim's trainer sleeps instead of training: corerl's algorithm.async.simulate_training
    (tests/test_async_lora_sim.py shows it acting)."""
    sim = "trainer__fully_async__simulate_"
    tree = _get("fully_async_sim", **{sim + "training": True, sim + "training_step_seconds": 5,
                                      sim + "weight_sync_seconds": 1})
    assert value_at(tree, "algorithm.async") == {"enabled": True, "simulate_training": True,
                                                 "simulate_training_seconds": 5.0, "simulate_refit_seconds": 1.0}
    defaults = _get("fully_async_sim", **{sim + "training": True})  # SkyRL's defaults: 30 s a step, no pause
    assert value_at(defaults, "algorithm.async.simulate_training_seconds") == 30.0
    assert value_at(defaults, "algorithm.async.simulate_refit_seconds") == 0.0
    off = _run("fully_async", **{sim + "training": False, sim + "training_step_seconds": 5})
    assert "simulate_training" not in value_at(off.tree, "algorithm.async")
    assert {f.key: f.fate for f in off.fates if f.key.startswith("trainer.fully_async.simulate")} == {
        "trainer.fully_async.simulate_training": "inert", "trainer.fully_async.simulate_training_step_seconds": "inert"}
    with pytest.raises(ConfigErrors, match="simulated trainer runs only"):
        _run("async", **{sim + "training": True})


def test_checkpoint_folder_conversation_turns_and_dedicated_generation():
    assert value_at(_get(trainer__ckpt_path="/ckpts/run"), "run.output_dir") == "/ckpts/run"
    assert "run" not in _get("sft", ckpt_path="")  # empty: corerl's default output folder
    assert [f.fate for f in _run(generator__use_conversation_multi_turn=False).fates
            if f.key == "generator.use_conversation_multi_turn"] == ["inert"]  # one turn: nothing to place
    several = _run(generator__use_conversation_multi_turn=False, generator__max_turns=3, environment__env_class="search")
    assert value_at(several.tree, "env.skyrl_gym.conversation_format") is False  # observations as text in the response
    assert [f.fate for f in several.fates if f.key == "generator.use_conversation_multi_turn"] == ["acts"]
    assert "conversation_format" not in value_at(_get(generator__use_conversation_multi_turn=True, generator__max_turns=3,
                                                      environment__env_class="search"), "env.skyrl_gym")
    dedicated = _get(trainer__placement__colocate_all=False, generator__inference_engine__num_engines=2,
                     generator__inference_engine__tensor_parallel_size=2)
    assert value_at(dedicated, "policy.generation.colocated") == {
        "enabled": False, "resources": {"gpus_per_node": 4, "num_nodes": 1}}
    fully_async = _run("fully_async", trainer__eval_interval=5)
    assert "eval" not in fully_async.tree and [f.fate for f in fully_async.fates
                                               if f.key == "trainer.eval_interval"] == ["inert"]


def test_on_policy_distillation_takes_skyrls_no_op_estimator_as_the_teachers_reverse_kl():
    result = _run("on_policy_distillation", trainer__ref__model__path="teacher",
                  trainer__algorithm__advantage_estimator="no_op",
                  trainer__algorithm__policy_loss_type="importance_sampling",
                  trainer__algorithm__use_kl_in_reward=True, trainer__algorithm__use_kl_loss=False)
    assert value_at(result.tree, "algorithm.name") == "distillation"
    assert value_at(result.tree, "algorithm.distillation") == {"kl_type": "reverse", "teacher_model": "teacher"}
    assert "use_kl_in_reward" not in result.tree["algorithm"] and "kl_penalty" not in result.tree["algorithm"]
    with pytest.raises(ConfigErrors, match="with on-policy distillation is not built into corerl"):
        _run("on_policy_distillation", trainer__algorithm__advantage_estimator="grpo")


def _sections() -> set[str]:
    return {reg.id for reg, _ in lookup.table().sections}


@pytest.mark.skipif(not {"skyrl.vllm", "skyrl.megatron"} <= _sections(), reason="megatron and vllm plugins needed")
def test_mtp_trains_the_checkpoint_s_heads_on_megatron_and_vllm_drafts_with_them():
    """trainer.mtp: the heads (plugins/megatron/tests/test_megatron_mtp.py shows them trained, decoupled)
    and vLLM's speculative decoding with them (method mtp, num_speculative_tokens deep)."""
    mtp = _get(trainer__strategy="megatron", trainer__mtp__enabled=True, trainer__mtp__num_speculative_tokens=3,
               trainer__mtp__loss_weight=0.5, trainer__policy__megatron_config__mtp_loss_topk=256,
               trainer__policy__megatron_config__mtp_loss_chunk_size=512)
    assert {k: v for k, v in value_at(mtp, "policy.megatron_cfg").items() if k.startswith("mtp")} == {
        "mtp_num_layers": None, "mtp_loss_scaling_factor": 0.5, "mtp_loss_topk": 256, "mtp_loss_chunk_size": 512}
    assert value_at(mtp, "policy.generation.vllm_cfg.speculative_config") == {"method": "mtp",
                                                                              "num_speculative_tokens": 3}
    # a head count and the engine's own speculative config, given, are taken as they are
    given = _get(trainer__strategy="megatron", trainer__mtp__enabled=True,
                 trainer__policy__megatron_config__mtp_num_layers=1,
                 generator__inference_engine__speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert value_at(given, "policy.megatron_cfg.mtp_num_layers") == 1
    assert value_at(given, "policy.generation.vllm_cfg.speculative_config") == {"method": "mtp",
                                                                                "num_speculative_tokens": 2}
    off = _run(trainer__strategy="megatron", trainer__mtp__enabled=False, trainer__mtp__num_speculative_tokens=3,
               trainer__policy__megatron_config__mtp_loss_weight=0.3)
    assert "mtp_num_layers" not in value_at(off.tree, "policy.megatron_cfg")  # corerl's default: no heads
    assert value_at(off.tree, "policy.generation.vllm_cfg") is None
    assert {f.key: f.fate for f in off.fates if "mtp" in f.key} == dict.fromkeys(
        ("trainer.mtp.enabled", "trainer.mtp.num_speculative_tokens",
         "trainer.policy.megatron_config.mtp_loss_weight"), "inert")
    with pytest.raises(ConfigErrors, match="trained by the megatron backend only") as caught:
        _run(trainer__strategy="fsdp2", trainer__mtp__enabled=True)
    assert caught.value.errors[0].key == "trainer.mtp.enabled"


@pytest.mark.skipif("skyrl.vllm" not in _sections(), reason="the vllm plugin is not installed")
def test_engine_init_kwargs_reach_vllm_as_given_and_those_corerl_sets_are_refused():
    result = _run(generator__inference_engine__max_num_seqs=64, generator__inference_engine__engine_init_kwargs={
        "gdn_prefill_backend": "triton", "kernel_config": {"moe_backend": "triton"}, "max_num_seqs": 32,
        "max_model_len": 4096})
    assert value_at(result.tree, "policy.generation.vllm_cfg") == {"max_model_len": 4096, "engine_args": {
        "max_num_seqs": 32, "gdn_prefill_backend": "triton", "kernel_config": {"moe_backend": "triton"}}}
    # SkyRL applies engine_init_kwargs last: the engine's own max_num_seqs is overridden
    assert [f.fate for f in result.fates if f.key == "generator.inference_engine.max_num_seqs"] == ["inert"]
    for argument, names in (("seed", "trainer.seed"), ("tensor_parallel_size",
                                                       "generator.inference_engine.tensor_parallel_size"),
                            ("hf_overrides", "trainer.policy.model_config_kwargs")):
        with pytest.raises(ConfigErrors, match=f"corerl sets itself, from {names}") as caught:
            _run(generator__inference_engine__engine_init_kwargs={argument: 1})
        assert caught.value.errors[0].key == f"generator.inference_engine.engine_init_kwargs.{argument}"
    # expert parallelism over the engine's own ranks: corerl splits the experts by tensor parallelism there
    moe = _run(generator__inference_engine__tensor_parallel_size=4, generator__inference_engine__expert_parallel_size=4)
    assert value_at(moe.tree, "policy.generation.vllm_cfg.tensor_parallel_size") == 4
    assert any("generator.inference_engine.expert_parallel_size=4" in warning for warning in moe.warnings)


@pytest.mark.skipif("skyrl.dtensor" not in _sections(), reason="the dtensor plugin is not installed")
def test_ulysses_sequence_parallelism_is_context_parallelism_and_fsdp_size_hybrid_sharding():
    hybrid = _get(trainer__strategy="fsdp2", trainer__placement__policy_num_nodes=2,
                  trainer__placement__policy_num_gpus_per_node=8, trainer__policy__fsdp_config__fsdp_size=8,
                  trainer__ref__fsdp_config__fsdp_size=8)
    assert value_at(hybrid, "policy.dtensor_cfg") == {"enabled": True, "dp_replicate_size": 2}  # 2 groups of 8
    assert value_at(_get(trainer__placement__policy_num_gpus_per_node=8, trainer__policy__sequence_parallel_size=4),
                    "policy.dtensor_cfg.context_parallel_size") == 4
    sft = _get("sft", strategy="fsdp2", sequence_parallel_size=2, placement__num_gpus_per_node=4)
    assert value_at(sft, "policy.dtensor_cfg.context_parallel_size") == 2
    with pytest.raises(ConfigErrors, match="does not divide the policy's 8 workers"):
        _run(trainer__placement__policy_num_gpus_per_node=8, trainer__policy__sequence_parallel_size=3)
    with pytest.raises(ConfigErrors, match="together with sequence_parallel_size > 1"):
        _run(trainer__placement__policy_num_gpus_per_node=8, trainer__policy__sequence_parallel_size=2,
             trainer__policy__fsdp_config__fsdp_size=4)
    if "skyrl.megatron" in _sections():  # SkyRL's Ulysses is its FSDP strategy's
        with pytest.raises(ConfigErrors, match="FSDP strategy only") as caught:
            _run(trainer__strategy="megatron", trainer__policy__sequence_parallel_size=2)
        assert caught.value.errors[0].key == "trainer.policy.sequence_parallel_size"


def test_a_token_budget_per_micro_batch_is_dynamic_batching():
    assert value_at(_get(trainer__max_tokens_per_microbatch=4096), "policy.dynamic_batching") == {
        "enabled": True, "train_mb_tokens": 4096, "logprob_mb_tokens": 4096}
    assert value_at(_get(trainer__max_tokens_per_microbatch=-1), "policy.dynamic_batching.enabled") is False
    with pytest.raises(ConfigErrors, match="not a token budget"):
        _run(trainer__max_tokens_per_microbatch=0)


def test_sft_whole_splits_and_one_datasets_weight_are_inert_slices_and_mixtures_refused():
    result = _run("sft", train_datasets=["/d/sft.parquet"], eval_datasets=["/d/val.parquet"],
                  eval_dataset_splits=["train"], train_dataset_weights=[1.0])
    assert value_at(result.tree, "data.held_out_files") == ["/d/val.parquet"]  # read whole, as SkyRL's "train"
    assert {f.key: f.fate for f in result.fates if f.key in ("eval_dataset_splits", "train_dataset_weights")} == {
        "eval_dataset_splits": "inert", "train_dataset_weights": "inert"}
    with pytest.raises(ConfigErrors, match="a split slice of them") as caught:
        _run("sft", eval_dataset_splits=["train[-500:]"])
    assert caught.value.errors[0].key == "eval_dataset_splits"
    with pytest.raises(ConfigErrors, match="mixing several datasets by weight"):
        _run("sft", train_datasets=["/a", "/b"], train_dataset_weights=[0.8, 0.2])


def test_weight_transport_and_serving_layout_are_inert_with_a_warning_and_external_engines_refused():
    """A shared folder of weight deltas and prefill/decode engines change how weights and requests
    travel, not what is sampled: inert, each with a warning saying what corerl does instead; an
    engine corerl does not start stays refused."""
    result = _run(generator__inference_engine__weight_sync_backend="delta",
                  generator__inference_engine__delta_weight_sync__sync_dir="/mnt/shared/sync",
                  generator__inference_engine__delta_weight_sync__max_file_size_in_gb=1.0,
                  generator__inference_engine__enable_pd=True, generator__inference_engine__num_prefill=2)
    fates = {f.key: f.fate for f in result.fates}
    assert fates["generator.inference_engine.delta_weight_sync.sync_dir"] == "inert"
    assert fates["generator.inference_engine.delta_weight_sync.max_file_size_in_gb"] == "inert"
    assert fates["generator.inference_engine.enable_pd"] == "inert"
    said = " | ".join(result.warnings)
    assert "nothing is published to this folder" in said and "prefill/decode disaggregation" in said

    assert _run(generator__inference_engine__enable_pd=False).warnings == []
    with pytest.raises(ConfigErrors, match="corerl starts its generation engines itself") as caught:
        _run(generator__inference_engine__run_engines_locally=False,
             generator__inference_engine__delta_weight_sync__sync_dir="s3://bucket/sync")
    assert [e.key for e in caught.value.errors] == ["generator.inference_engine.run_engines_locally"]


@pytest.mark.skipif("skyrl.vllm" not in _sections(), reason="the vllm plugin is not installed")
def test_prefill_decode_cache_hand_over_is_not_passed_to_vllm():
    connector = _run(generator__inference_engine__enable_pd=True,
                     generator__inference_engine__engine_init_kwargs={"kv_transfer_config": {
                         "kv_connector": "NixlConnector"}, "max_num_seqs": 8})
    assert value_at(connector.tree, "policy.generation.vllm_cfg.engine_args") == {"max_num_seqs": 8}
    assert any("KV-cache transfer" in warning for warning in connector.warnings)


@pytest.mark.skipif("skyrl.megatron" not in _sections(), reason="the megatron plugin is needed")
def test_a_sigmoid_router_or_an_expert_bias_asks_for_a_router_with_a_per_expert_bias():
    """SkyRL's GLM-4.7 script: moe_router_score_function sigmoid and moe_router_enable_expert_bias true are
    policy.moe.expert_bias (the model must route by sigmoid scores plus a per-expert bias, checked when it is
    read); softmax and false leave the checkpoint's own router; another score function is refused."""
    prefix = "trainer__policy__megatron_config__"
    glm = _get(trainer__strategy="megatron", **{prefix + "moe_router_score_function": "sigmoid",
                                               prefix + "moe_router_enable_expert_bias": True})
    assert value_at(glm, "policy.moe.expert_bias") is True
    plain = _get(trainer__strategy="megatron", **{prefix + "moe_router_score_function": "softmax",
                                                 prefix + "moe_router_enable_expert_bias": False})
    assert value_at(plain, "policy.moe.expert_bias") is None
    with pytest.raises(ConfigErrors, match="corerl's routers score by softmax, or by sigmoid"):
        _get(trainer__strategy="megatron", **{prefix + "moe_router_score_function": "sqrtsoftplus"})
