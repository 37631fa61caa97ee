"""NeMo RL's ``data`` and ``env`` sections in corerl's configuration (its datasets, the
environments the episodes are played against, its reward-model environment), and the sections of
its evaluation recipes (``eval``, ``generation``)."""

from __future__ import annotations

from typing import Any

from corerl.config.dialects import nemo_rl_vision as vision
from corerl.config.dialects.rules import (
    _OFF,
    DERIVED,
    Rule,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    refused,
)

_NEMO_GYM = ("NeMo Gym environments run as NeMo Gym's own resource servers, and corerl has no bridge to them "
             "yet: play such an agent with data.env_name=openai_agent, or write a corerl environment")


def _environment_name(value: Any) -> Any:
    """NeMo RL's environment name as corerl's ``data.env_name`` (NeMo Gym's is refused; its VLM
    environment ``clevr-cogent`` is corerl's ``clevr_cogent``)."""
    if value == "nemo_gym":
        raise ValueError(_NEMO_GYM)
    return vision.environment_id(value)


RULES: dict[str, Rule] = {
    "data.dataset_name": DERIVED,
    "data.train.dataset_name": DERIVED,
    "data.validation.dataset_name": DERIVED,
    "data.default.dataset_name": DERIVED,
    "data.use_multiple_dataloader": inert("false: the datasets' rows are drawn as one pool, as NeMo RL concatenates "
                                          "them; true (a custom function of the recipe picks the dataloaders, "
                                          "code corerl does not run) is refused", _truthy),
    # NeMo RL's GDPO environment (data.*.env_name: math_multi_reward): corerl's environment of that name
    "env.math_multi_reward.math_verify_impl": inert("its parts are text checks (NeMo RL's hf_math_verify "
                                                    "implementation of this environment compares text too)",
                                                    _not("hf_math_verify")),
    "data.validation.repeat": inert("corerl's held-out answers are greedy: repeating a row adds nothing"),
    # NeMo RL's reward-model environment (data.*.env_name: reward_model): corerl's reward_model section
    "env.reward_model.model_name": acts("reward_model.model_name"),
    "env.reward_model.batch_size": acts("reward_model.micro_batch_size"),
    "env.reward_model.reward_model_cfg.enabled": inert("the reward model is loaded with its score head "
                                                       "(reward_model.kind)", _not(True)),
    "env.reward_model.reward_model_cfg.reward_model_type": inert(
        "only Bradley-Terry reward models are built into corerl (reward_model.kind=bradley_terry)",
        _not("bradley_terry")),
    "env.reward_model.*": derived("the reward model is frozen and scores the policy's samples on the policy's "
                                  "training backend, with its layout: training and resource settings are inert; its "
                                  "layout and precision must equal the policy's, else refused in one line"),
    **{f"env.{name}.*": inert(f"settings of NeMo RL's {name} environment, which corerl does not have "
                              "(data.env_name naming it is refused)")
       for name in ("sliding_puzzle_game", "mmpr-tiny", "math_multi_reward")},
    # NeMo RL's VLM reward environments: corerl's built-in ones (clevr-cogent is clevr_cogent)
    **{f"env.{name}.{key}": acts(f"env.{env_id}.{key}")
       for name, env_id in vision.VLM_ENVIRONMENTS.items() for key in vision.VLM_ENVIRONMENT_KEYS},
    **{f"env.{name}.*": refused(f"a setting NeMo RL's VLM environment {name} does not have (num_workers and "
                                "reward_functions are)")
       for name in vision.VLM_ENVIRONMENTS},
    **{f"env.{key}": inert("NeMo Gym's switches; corerl has no bridge to NeMo Gym")
       for key in ("should_use_nemo_gym", "should_log_nemo_gym_responses", "should_mask_flagged_samples")},
    "data.train": refused("a dataset section (data_path or dataset_name), or a list of them, is expected"),
    "data.train.*": refused("a NeMo RL dataset option corerl does not translate; give a local file "
                            "(data.train.data_path)"),
    **{f"data.{key}": DERIVED for key in ("num_prompts_per_dataloader", "custom_dataloader")},
    "data.add_system_prompt": inert(_OFF, _truthy),
    "data.validation.allowed_problem_types": inert("used by NeMo RL's validation datasets; corerl holds rows of the "
                                                   "training data out"),
    # -- evaluation recipes (examples/configs/evals: eval, generation, tokenizer and data, no policy) --
    "eval.metric": inert("corerl eval reports pass@k (eval/pass@k) beside mean@n and the greedy reward; cons@k "
                         "(majority vote) is not built into corerl yet", _not("pass@k")),
    "eval.num_tests_per_prompt": acts("eval.num_samples"),
    "eval.k_value": acts("eval.pass_k"),
    "eval.seed": acts("algorithm.seed"),
    "eval.save_path": inert("corerl eval writes its figures to the file --output names"),
    "generation.model_name": acts("policy.model_name"),
    "generation.num_prompts_per_step": inert("corerl eval hands the engine the prompts together; how they are "
                                             "batched does not change the answers"),
    "data.problem_key": acts("data.prompt_key"),
    "data.solution_key": acts("data.answer_key"),
    "data.processor": inert(vision.PROCESSOR_REASON),
    "data.repeat": inert("each prompt is answered eval.num_samples times (eval.num_tests_per_prompt)", _not(1)),
    "data.file_format": inert("corerl's dataset task reads a data file by its extension (.jsonl, .json, .parquet, "
                              ".csv)", lambda value: value not in (None, "json", "jsonl", "parquet", "csv")),
    "env.math.verifier_type": acts("env.math.verifier_type"),
    # -- data --
    "data.max_input_seq_length": inert("a prompt that leaves no room for a completion in policy.max_seq_length is "
                                       "refused with its row; completions end at policy.max_seq_length"),
    "data.shuffle": acts("data.shuffle"),
    "data.num_workers": inert("rows are read in the driver"),
    "data.add_bos": inert("prompts start with the tokenizer's beginning-of-sequence token", _not(True)),
    "data.add_eos": inert("SFT responses end with the end-of-sequence token", _not(True)),
    "data.add_generation_prompt": inert("prompts end with the template's generation prompt when a chat template "
                                        "is applied"),
    "data.system_prompt_file": acts("data.system_prompt_file"),
    "data.prompt_file": acts("data.prompt_file"),
    "data.input_key": acts("data.prompt_key"),
    "data.output_key": acts("data.answer_key"),
    "data.train_data_path": acts("data.train_files"),
    "data.val_data_path": acts("data.held_out_files"),
    "data.train.data_path": acts("data.train_files"),
    "data.validation.data_path": acts("data.held_out_files"),
    "data.train.input_key": acts("data.prompt_key"),
    "data.train.output_key": acts("data.answer_key"),
    "data.default.input_key": acts("data.prompt_key"),
    "data.default.output_key": acts("data.answer_key"),
    "data.default.prompt_file": acts("data.prompt_file"),
    "data.default.system_prompt_file": acts("data.system_prompt_file"),
    "data.default.processor": inert(vision.PROCESSOR_REASON),
    "data.train.max_samples": acts("data.max_train_rows"),
    "data.train.split": inert("local files are read whole"),
    "data.validation.split": inert("local files are read whole"),
    "data.validation.input_key": inert("the validation rows use the training columns"),
    "data.validation.output_key": inert("the validation rows use the training columns"),
    "data.validation": inert("null: corerl holds data.held_out_size rows of the training data out", _truthy),
    "data.train.split_validation_size": inert("corerl holds data.held_out_size rows (unset: a quarter, at most 32) "
                                              "of the training data out, not a fraction"),
    "data.train.seed": inert("the rows are shuffled with the run's seed (grpo.seed / sft.seed)"),
    "data.split": inert("local files are read whole"),
    "data.seed": inert("the rows are shuffled with the run's seed (grpo.seed / sft.seed)"),
    "data.train_split": inert("local files are read whole"),
    "data.val_split": inert("local files are read whole"),
    # -- env: the environments the episodes are played against --
    "data.env_name": acts("data.env_name", _environment_name),
    "data.default.env_name": acts("data.env_name", _environment_name),
    "data.train.env_name": acts("data.env_name", _environment_name),
    "data.validation.env_name": inert("the held-out rows are played against the training rows' environment"),
    "env.math.num_workers": acts("env.math.num_workers"),
    "env.math.math_verify_impl": acts("env.math.math_verify_impl"),
    "env.math.*": inert("corerl's math environment verifies with math-verify and has no other settings"),
    "env.nemo_gym.*": refused(_NEMO_GYM),
    **{key: refused(vision.AUDIO_VIDEO)
       for key in ("data.default.video_target_num_patches", "data.default.video_maintain_aspect_ratio")},
}
