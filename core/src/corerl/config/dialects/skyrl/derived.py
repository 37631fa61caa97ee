"""What several of SkyRL's keys decide together, in corerl's configuration: the algorithm (the
entry point with the advantage estimator and policy loss), the batch arithmetic, the step count,
the KL term, the loss reduction, importance-sampling correction, DAPO's dynamic sampling and
overlong buffer, evaluation, checkpoints, the environment and SkyRL's data layout.

A key the script leaves unset has SkyRL's default (:data:`DEFAULTS`, those that decide what runs)."""

from __future__ import annotations

import re
from typing import Any

from corerl.config.dialects.rules import Translator
from corerl.config.dialects.skyrl import entry_points
from corerl.config.dialects.skyrl.keys.data import GYM_ENVIRONMENT, GYM_SECTION
from corerl.config.tree import set_at, value_at

_A = "trainer.algorithm."
#: SkyRL's defaults of the keys decided together (skyrl/train/config/config.py)
DEFAULTS: dict[str, Any] = {
    "trainer.train_batch_size": 1024, "trainer.policy_mini_batch_size": 256, "generator.n_samples_per_prompt": 5,
    _A + "advantage_estimator": "grpo", _A + "use_kl_loss": True, _A + "kl_loss_coef": 0.001,
    _A + "use_kl_in_reward": False, _A + "loss_reduction": "token_mean", _A + "policy_loss_type": "regular",
    _A + "clip_ratio_c": 3.0, "trainer.eval_interval": 5, "trainer.eval_before_train": True,
    "generator.eval_n_samples_per_prompt": 1, "trainer.epochs": 1, "trainer.ckpt_interval": 10,
    "trainer.max_prompt_length": 512, "generator.sampling_params.max_generate_length": 1024,
    "trainer.num_dummy_steps": 5,  # the full_context entry point's own (FullCtxTrainerConfig)
}
#: the policy-loss types corerl runs: SkyRL's name -> what it sets
_LOSSES = {"regular": {}, "dual_clip": {}, "gspo": {"algorithm.sequence_level_ratios": True},
           "cispo": {"algorithm.use_cispo": True}, "rollout_is": {"algorithm.policy_loss": "rollout_is"},
           "sapo": {"algorithm.policy_loss": "sapo"}, "clip_cov": {"algorithm.policy_loss": "clip_cov"},
           "kl_cov": {"algorithm.policy_loss": "kl_cov"}}
#: each policy loss's own keys: SkyRL's key (under trainer.algorithm.) -> corerl's
_LOSS_KEYS = {"cispo": {"cispo.cispo_eps_clip_low": "algorithm.ratio_clip_min",
                        "cispo.cispo_eps_clip_high": "algorithm.ratio_clip_max"},
              "sapo": {"sapo.tau_pos": "algorithm.sapo_tau_pos", "sapo.tau_neg": "algorithm.sapo_tau_neg"},
              "clip_cov": {"clip_cov.clip_ratio": "algorithm.clip_cov_ratio",
                           "clip_cov.clip_cov_lb": "algorithm.clip_cov_lb",
                           "clip_cov.clip_cov_ub": "algorithm.clip_cov_ub"},
              "kl_cov": {"kl_cov.kl_cov_frac": "algorithm.kl_cov_ratio", "kl_cov.ppo_kl_coef": "algorithm.kl_cov_coef"}}


class _Keys:
    """The script's value of a key, else SkyRL's default."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def given(self, key: str) -> bool:
        return value_at(self.raw, key, _ABSENT) is not _ABSENT

    def __call__(self, key: str) -> Any:
        return value_at(self.raw, key) if self.given(key) else DEFAULTS.get(key)


_ABSENT = object()  # a key the script does not give (None is a value: SkyRL's null)


def _put(out: Translator, keys: _Keys, source: str, target: str, value: Any, detail: str | None = None) -> None:
    """``target`` from ``source``: a fate where the script gives the key, SkyRL's default otherwise."""
    if keys.given(source):
        out.put(source, target, value, detail)
    else:
        set_at(out.tree, target, value)
        out.new_origins[target] = f"SkyRL's default of {source}"


def _default(out: Translator, keys: _Keys, source: str, target: str, value: Any) -> None:
    """SkyRL's default of ``source`` (an acting key the script leaves unset) at ``target``."""
    if not keys.given(source):
        set_at(out.tree, target, value)
        out.new_origins[target] = f"SkyRL's default of {source}"


def derive(raw: dict[str, Any], out: Translator, entry_point: str) -> None:
    """Decide the ``derived`` keys of an RL entry point's script."""
    keys = _Keys(raw)
    _algorithm(keys, out, entry_point)
    _batches(keys, out)
    _steps(keys, out)
    if entry_point != "on_policy_distillation":
        _kl(keys, out)
    _loss(keys, out)
    _importance_sampling(keys, out)
    _dapo(keys, out)
    _asynchronous(keys, out, entry_point)
    _evaluation(keys, out)
    _checkpoints(keys, out)
    _reference(keys, out, entry_point)
    _environment(keys, out)
    _data(keys, out)
    _lora(keys, out, "trainer.policy.model.lora.rank")
    _dedicated_generation(keys, out)
    _external_servers(keys, out)
    _output_dir(keys, out, "trainer.ckpt_path")
    _conversation(keys, out)
    _entry_point_settings(out, entry_point)
    # SkyRL trains in bfloat16 unless trainer.bf16=false (its mixed precision: corerl's policy.precision)
    _default(out, keys, "trainer.bf16", "policy.precision", "bfloat16")
    if entry_point == "full_context":
        _dummy_steps(keys, out)
    prompt, answer = keys("trainer.max_prompt_length"), keys("generator.sampling_params.max_generate_length")
    if isinstance(prompt, int) and isinstance(answer, int):
        _put(out, keys, "trainer.max_prompt_length", "policy.max_seq_length", prompt + answer,
             "policy.max_seq_length (max_prompt_length + generator.sampling_params.max_generate_length)")
        _default(out, keys, "generator.sampling_params.max_generate_length", "policy.generation.max_new_tokens",
                 answer)


def _entry_point_settings(out: Translator, entry_point: str) -> None:
    """What an entry point's own code stands for in corerl (``EntryPoint.implies``)."""
    try:
        entry = entry_points.by_id(entry_point)
    except KeyError:  # an id the module does not list (a canonical schedule name): implies nothing
        return
    for target, value in entry.implies:
        set_at(out.tree, target, value)
        out.new_origins[target] = f"SkyRL's {entry.id} entry point ({entry.module})"


def _dummy_steps(keys: _Keys, out: Translator) -> None:
    """SkyRL's full_context entry point trains ``trainer.num_dummy_steps`` steps on made-up
    full-length batches (``data.full_context``, which its ``implies`` sets) and neither counts
    epochs nor evaluates: corerl's ``algorithm.max_steps``, evaluation only before and after."""
    reason = "the full_context entry point runs trainer.num_dummy_steps steps"
    for key in ("trainer.epochs", "trainer.max_training_steps"):
        if keys.given(key):
            out.refate(key, "inert", reason)
    for key in ("trainer.eval_interval", "trainer.eval_before_train", "generator.eval_n_samples_per_prompt"):
        if keys.given(key):
            out.refate(key, "inert", "SkyRL's full-context trainer does not evaluate; corerl reports the held-out "
                                     "reward before and after training only")
    set_at(out.tree, "eval.every_n_steps", 0)
    set_at(out.tree, "eval.at_start", False)
    steps = keys("trainer.num_dummy_steps")
    if not isinstance(steps, int) or steps <= 0:
        out.refuse("trainer.num_dummy_steps", f"{steps!r}: the steps of a full-context run are a count above 0",
                   "give trainer.num_dummy_steps=5 (or another count)")
        return
    _put(out, keys, "trainer.num_dummy_steps", "algorithm.max_steps", steps)


_DISTILLATION = {_A + "advantage_estimator": ("no_op",), _A + "policy_loss_type": ("importance_sampling", "regular"),
                 _A + "use_kl_in_reward": (True,), _A + "use_kl_loss": (False,)}


def _distillation(keys: _Keys, out: Translator) -> None:
    """SkyRL's on-policy distillation: the reward of each token is the reverse KL to the teacher
    (``trainer.ref``), passed through as the advantage (``no_op``) with the KL in the reward:
    corerl's distillation (``algorithm.distillation.kl_type`` reverse, on the sampled tokens)."""
    set_at(out.tree, "algorithm.name", "distillation")
    set_at(out.tree, "algorithm.distillation.kl_type", "reverse")
    out.new_origins["algorithm.name"] = "SkyRL's on_policy_distillation entry point"
    for key, accepted in _DISTILLATION.items():
        if not keys.given(key):
            continue
        if keys(key) in accepted:
            out.inert(key, "on-policy distillation's own: the per-token reverse KL to the teacher is the advantage "
                           "(algorithm.distillation.kl_type reverse)")
        else:
            out.refuse(key, f"{keys(key)!r} with on-policy distillation is not built into corerl (its per-token "
                            "reverse KL to the teacher is the advantage)", "use the value SkyRL's example gives")
    if keys.given(_A + "kl_loss_coef"):
        out.inert(_A + "kl_loss_coef", "on-policy distillation's reward is the teacher's KL, unweighted")


def _algorithm(keys: _Keys, out: Translator, entry_point: str) -> None:
    if entry_point == "on_policy_distillation":
        _distillation(keys, out)
        return
    estimator, key = keys(_A + "advantage_estimator"), _A + "advantage_estimator"
    name = "grpo"
    registered = entry_points.registered(entry_point, key, estimator)  # an example's own estimator, if corerl's
    if registered is not None:
        for target, value in registered:
            out.put(key, target, value)
    elif estimator == "gae":
        name = "ppo"
        _put(out, keys, key, "algorithm.name", "ppo", "algorithm.name ppo (GAE over a critic's values)")
    elif estimator == "grpo":
        _put(out, keys, key, "algorithm.advantage_estimator", "grpo")
    elif estimator == "rloo":
        out.put(key, "algorithm.leave_one_out_baseline", True,
                "algorithm.leave_one_out_baseline, algorithm.scale_rewards_by_std false (RLOO)")
        set_at(out.tree, "algorithm.scale_rewards_by_std", False)
    elif estimator == "reinforce++":
        out.put(key, "algorithm.advantage_estimator", "reinforce_plus_plus")
    elif estimator == "maxrl":
        out.put(key, "algorithm.advantage_estimator", "maxrl")
    else:
        out.refuse(key, f"the {estimator!r} advantage estimator is not built into corerl (grpo, gae, rloo, "
                        "reinforce++ and maxrl are)", "use one of those")
    set_at(out.tree, "algorithm.name", name)
    out.new_origins.setdefault("algorithm.name", f"SkyRL's {entry_point} entry point")
    loss, key = keys(_A + "policy_loss_type"), _A + "policy_loss_type"
    registered = entry_points.registered(entry_point, key, loss)  # an example's own loss, if corerl's
    if registered is not None:
        for target, value in registered:
            out.put(key, target, value)
    elif loss not in _LOSSES:
        out.refuse(key, f"the {loss!r} policy loss is not built into corerl ({', '.join(_LOSSES)} are)",
                   "use one of those")
    elif keys.given(key) and _LOSSES[loss]:
        target, value = next(iter(_LOSSES[loss].items()))
        out.put(key, target, value)
    elif keys.given(key):
        out.inert(key, "the clipped PPO loss, corerl's" if loss == "regular" else
                  "dual clip: algorithm.ratio_clip_c (trainer.algorithm.clip_ratio_c)")
    if loss == "dual_clip":
        _put(out, keys, _A + "clip_ratio_c", "algorithm.ratio_clip_c", keys(_A + "clip_ratio_c"))
    elif keys.given(_A + "clip_ratio_c"):
        out.inert(_A + "clip_ratio_c", "used only by policy_loss_type dual_clip")
    for owner, companions in _LOSS_KEYS.items():  # SkyRL's defaults of these are corerl's
        for name, target in companions.items():
            source = _A + name
            if keys.given(source) and loss == owner:
                out.put(source, target, keys(source))
            elif keys.given(source):
                out.inert(source, f"used only by policy_loss_type {owner}")


def _batches(keys: _Keys, out: Translator) -> None:
    """``train_batch_size`` prompts a step, ``n_samples_per_prompt`` samples each, an optimizer step
    every ``policy_mini_batch_size`` prompts."""
    prompts, samples = keys("trainer.train_batch_size"), keys("generator.n_samples_per_prompt")
    mini, key = keys("trainer.policy_mini_batch_size"), "trainer.policy_mini_batch_size"
    _default(out, keys, "trainer.train_batch_size", "algorithm.batch_size", prompts)
    _default(out, keys, "generator.n_samples_per_prompt", "algorithm.num_generations_per_prompt", samples)
    if not (isinstance(mini, int) and isinstance(prompts, int) and isinstance(samples, int)):
        return
    if mini < 1 or prompts % mini:
        out.refuse(key, f"{mini} prompts per optimizer step do not divide trainer.train_batch_size ({prompts})",
                   "give a divisor of trainer.train_batch_size")
        return
    _put(out, keys, key, "algorithm.optimizer_batch_size", mini * samples,
         f"algorithm.optimizer_batch_size ({mini} x {samples} sequences: {prompts // mini} optimizer step(s) a step)")
    critic = "trainer.critic_mini_batch_size"
    if keys.given(critic) and keys(critic) == mini:
        out.inert(critic, "corerl's critic takes an optimizer step with the policy's")
    elif keys.given(critic):
        out.refuse(critic, "a critic mini-batch other than the policy's is not built into corerl",
                   f"set it to trainer.policy_mini_batch_size ({mini})")


def _steps(keys: _Keys, out: Translator) -> None:
    """``max_training_steps``, else ``epochs`` over the training rows (counted from the files' metadata)."""
    if keys.given("trainer.max_training_steps"):
        if keys.given("trainer.epochs"):
            out.inert("trainer.epochs", "trainer.max_training_steps is given")
        return
    epochs, prompts = keys("trainer.epochs"), keys("trainer.train_batch_size")
    rows = _rows(keys("data.train_data"))
    if rows is None or not isinstance(prompts, int) or not isinstance(epochs, int):
        if keys.given("trainer.epochs"):
            out.inert("trainer.epochs", "the training files' rows could not be counted here: corerl runs "
                                        "algorithm.max_steps steps (give trainer.max_training_steps)")
            out.warnings.append(f"trainer.epochs={epochs}: the training rows could not be counted; corerl runs "
                                "algorithm.max_steps steps (set trainer.max_training_steps)")
        return
    steps = max(1, rows // prompts) * epochs
    _put(out, keys, "trainer.epochs", "algorithm.max_steps", steps,
         f"algorithm.max_steps ({epochs} epoch(s) of {rows} rows, {prompts} a step: {steps})")


def _rows(files: Any) -> int | None:
    """The rows of local parquet files, from their metadata (None: not all countable here)."""
    from pathlib import Path

    paths = [files] if isinstance(files, str) else list(files) if isinstance(files, (list, tuple)) else []
    if not paths or not all(str(p).endswith(".parquet") and Path(str(p)).expanduser().is_file() for p in paths):
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return sum(pq.ParquetFile(str(Path(str(p)).expanduser())).metadata.num_rows for p in paths)


def _kl(keys: _Keys, out: Translator) -> None:
    loss, reward, coef = keys(_A + "use_kl_loss"), keys(_A + "use_kl_in_reward"), keys(_A + "kl_loss_coef")
    if loss and reward:
        out.refuse(_A + "use_kl_in_reward", "use_kl_loss and use_kl_in_reward are both on (SkyRL takes one)",
                   "switch one off")
        return
    if reward:
        out.put(_A + "use_kl_in_reward", "algorithm.use_kl_in_reward", True)
    elif keys.given(_A + "use_kl_in_reward"):
        out.inert(_A + "use_kl_in_reward", "false: no KL in the reward")
    if loss or reward:
        what = "the KL term in the loss" if loss else "the KL penalty in the reward"
        _put(out, keys, _A + "kl_loss_coef", "algorithm.kl_penalty", coef, f"algorithm.kl_penalty ({what})")
        if keys.given(_A + "use_kl_loss") and loss:
            out.put(_A + "use_kl_loss", "algorithm.kl_penalty", coef, "algorithm.kl_penalty (kl_loss_coef)")
        elif keys.given(_A + "use_kl_loss"):
            out.inert(_A + "use_kl_loss", "false: the KL is in the reward")
    else:
        _put(out, keys, _A + "use_kl_loss", "algorithm.kl_penalty", 0.0, "algorithm.kl_penalty 0 (no KL term)")
        if keys.given(_A + "kl_loss_coef"):
            out.inert(_A + "kl_loss_coef", "use_kl_loss and use_kl_in_reward are false")


def _loss(keys: _Keys, out: Translator) -> None:
    reduction, key = keys(_A + "loss_reduction"), _A + "loss_reduction"
    if reduction in ("token_mean", "token_mean_legacy", "sequence_mean"):
        _put(out, keys, key, "algorithm.loss_aggregation", "sequence_mean" if reduction == "sequence_mean"
             else "token_mean")
        if keys.given(_A + "max_seq_len"):
            out.inert(_A + "max_seq_len", "used only by loss_reduction seq_mean_token_sum_norm")
    elif reduction == "seq_mean_token_sum_norm":
        length = keys(_A + "max_seq_len")
        if length is None:
            out.refuse(key, "seq_mean_token_sum_norm needs trainer.algorithm.max_seq_len (the length it divides by)",
                       "set trainer.algorithm.max_seq_len")
            return
        out.put(key, "algorithm.loss_aggregation", "constant_length")
        out.put(_A + "max_seq_len", "algorithm.loss_aggregation_length", length)
    else:
        out.refuse(key, f"the {reduction!r} loss reduction is not built into corerl (token_mean, sequence_mean and "
                        "seq_mean_token_sum_norm are)", "use one of those")


def _importance_sampling(keys: _Keys, out: Translator) -> None:
    kind, key = keys(_A + "off_policy_correction.tis_ratio_type"), _A + "off_policy_correction.tis_ratio_type"
    cap_key = _A + "off_policy_correction.token_tis_ratio_clip_high"
    if kind == "token":
        out.put(key, "algorithm.importance_sampling_correction", True)
        set_at(out.tree, "algorithm.importance_sampling_type", "tis")
        _put(out, keys, cap_key, "algorithm.importance_weight_cap", keys(cap_key) if keys.given(cap_key) else 2.0)
    elif kind == "sequence":
        out.put(key, "algorithm.importance_sampling_correction", True, "algorithm.importance_sampling_type seq-tis")
        set_at(out.tree, "algorithm.importance_sampling_type", "seq-tis")
        cap_key = _A + "off_policy_correction.sequence_tis_ratio_clip_high"
        _put(out, keys, cap_key, "algorithm.importance_weight_cap", keys(cap_key) if keys.given(cap_key) else 5.0)
    elif kind is not None:
        out.refuse(key, f"{kind!r} importance-sampling correction is not built into corerl (token and sequence are)",
                   "use token or sequence, or remove the key")
    elif keys.given(cap_key):
        out.inert(cap_key, "used only with tis_ratio_type token")
    sequence_cap = _A + "off_policy_correction.sequence_tis_ratio_clip_high"
    if kind != "sequence" and keys.given(sequence_cap):
        out.inert(sequence_cap, "used only with tis_ratio_type sequence")
    _sequence_mask(keys, out, kind)
    if keys(_A + "use_tis"):
        out.put(_A + "use_tis", "algorithm.importance_sampling_correction", True)
        cap = keys(_A + "tis_imp_ratio_cap")
        if isinstance(cap, (int, float)) and cap > 0:
            out.put(_A + "tis_imp_ratio_cap", "algorithm.importance_weight_cap", cap)
    else:
        for source in (_A + "use_tis", _A + "tis_imp_ratio_cap"):
            if keys.given(source):
                out.inert(source, "use_tis is false")


def _dapo(keys: _Keys, out: Translator) -> None:
    kind, key = keys(_A + "dynamic_sampling.type"), _A + "dynamic_sampling.type"
    if kind == "filter":
        out.put(key, "algorithm.dynamic_sampling.enabled", True)
    elif kind == "replace":
        out.refuse(key, "dynamic sampling by replacing groups is not built into corerl (filter is)", "use filter")
    elif keys.given(key):
        out.inert(key, "null: no dynamic sampling")
    length, key = keys(_A + "overlong_buffer_len"), _A + "overlong_buffer_len"
    if isinstance(length, int) and length > 0:
        out.put(key, "algorithm.overlong_penalty.buffer_length", length,
                "algorithm.overlong_penalty (enabled, buffer_length, max_response_length)")
        set_at(out.tree, "algorithm.overlong_penalty.enabled", True)
        set_at(out.tree, "algorithm.overlong_penalty.max_response_length",
               keys("generator.sampling_params.max_generate_length"))
    elif keys.given(key):
        out.inert(key, "0: no overlong buffer")


def _asynchronous(keys: _Keys, out: Translator, entry_point: str) -> None:
    key = "trainer.fully_async.enabled"
    if entry_point == "async":  # one step off-policy: generation runs a step ahead of training
        set_at(out.tree, "algorithm.async.enabled", True)
        set_at(out.tree, "algorithm.async.max_staleness", 1)
        out.new_origins["algorithm.async.enabled"] = "SkyRL's async entry point (one step off-policy)"
    if entry_point == "fully_async" or keys(key):
        if entry_point != "fully_async":
            out.refuse(key, "trainer.fully_async.enabled runs only with SkyRL's fully_async entry point",
                       "start the fully_async entry point")
            return
        set_at(out.tree, "algorithm.async.enabled", True)
        out.new_origins["algorithm.async.enabled"] = "SkyRL's fully_async entry point"
        if keys.given(key):
            out.put(key, "algorithm.async.enabled", True)
        clear = "trainer.fully_async.clear_kv_cache_on_weight_sync"
        if keys.given(clear):
            out.put(clear, "algorithm.async.in_flight", "abort" if keys(clear) else "continue")
    elif keys.given(key):
        out.inert(key, "false: synchronous training")
    _simulated_trainer(keys, out, entry_point)


_SIM = "trainer.fully_async.simulate_"


def _simulated_trainer(keys: _Keys, out: Translator, entry_point: str) -> None:
    """``trainer.fully_async.simulate_training`` (which SkyRL's fully_async_sim entry point requires):
    corerl's simulated trainer, ``algorithm.async.simulate_training``: each step sleeps
    ``simulate_training_step_seconds`` instead of training, each refit pauses generation
    ``simulate_weight_sync_seconds`` and sends no weights."""
    flag, seconds = _SIM + "training", {_SIM + "training_step_seconds": "algorithm.async.simulate_training_seconds",
                                        _SIM + "weight_sync_seconds": "algorithm.async.simulate_refit_seconds"}
    if not keys(flag):
        if keys.given(flag):
            out.inert(flag, "false: training runs")
        for key in seconds:
            if keys.given(key):
                out.inert(key, "used only with trainer.fully_async.simulate_training true")
        return
    if entry_point != "fully_async":
        out.refuse(flag, "a simulated trainer runs only in SkyRL's fully asynchronous schedule",
                   "start the fully_async_sim entry point")
        return
    out.put(flag, "algorithm.async.simulate_training", True,
            "algorithm.async.simulate_training (steps sleep instead of training; the weights never change)")
    for key, target in seconds.items():
        _put(out, keys, key, target, float(keys(key) if keys.given(key) else (30.0 if "step" in key else 0.0)))


def _evaluation(keys: _Keys, out: Translator) -> None:
    interval = keys("trainer.eval_interval")
    if value_at(out.tree, "algorithm.async.enabled"):
        for key in ("trainer.eval_interval", "trainer.eval_before_train", "generator.eval_n_samples_per_prompt"):
            if keys.given(key):
                out.inert(key, "asynchronous GRPO evaluates the held-out prompts before and after training only")
        return
    if isinstance(interval, int) and interval > 0 and (keys.given("data.val_data") or keys.given("trainer.eval_interval")):
        _put(out, keys, "trainer.eval_interval", "eval.every_n_steps", interval)
        _put(out, keys, "trainer.eval_before_train", "eval.at_start", bool(keys("trainer.eval_before_train")))
        _put(out, keys, "generator.eval_n_samples_per_prompt", "eval.num_samples",
             keys("generator.eval_n_samples_per_prompt"))
        return
    for key in ("trainer.eval_interval", "trainer.eval_before_train", "generator.eval_n_samples_per_prompt"):
        if keys.given(key):
            out.inert(key, "no evaluation during training (eval_interval); corerl reports the held-out reward "
                           "before and after it")


def _checkpoints(keys: _Keys, out: Translator) -> None:
    interval = keys("trainer.ckpt_interval")
    if isinstance(interval, int) and interval > 0:
        _put(out, keys, "trainer.ckpt_interval", "checkpointing.save_period", interval,
             "checkpointing.enabled, checkpointing.save_period")
        set_at(out.tree, "checkpointing.enabled", True)
    elif keys.given("trainer.ckpt_interval"):
        out.put("trainer.ckpt_interval", "checkpointing.enabled", False)
    keep = keys("trainer.max_ckpts_to_keep")
    if isinstance(keep, int) and keep > 0:
        out.put("trainer.max_ckpts_to_keep", "checkpointing.keep_last", keep)
    elif keys.given("trainer.max_ckpts_to_keep"):
        out.inert("trainer.max_ckpts_to_keep", "-1 (keep all): corerl keeps checkpointing.keep_last")
    mode = keys("trainer.resume_mode")
    if mode in ("latest", None, "none", "None"):
        if keys.given("trainer.resume_mode"):
            out.inert("trainer.resume_mode", "corerl resumes a run found in run.output_dir (run.resume auto)")
    elif keys.given("trainer.resume_mode"):
        out.refuse("trainer.resume_mode", f"resume mode {mode!r} is not built into corerl (latest is: a run resumes "
                                          "from its own run.output_dir)", "use latest")


def _reference(keys: _Keys, out: Translator, entry_point: str) -> None:
    key = "trainer.ref.model.path"
    if not keys.given(key):
        return
    if entry_point == "on_policy_distillation":
        out.put(key, "algorithm.distillation.teacher_model", keys(key), "algorithm.distillation.teacher_model (the "
                                                                        "teacher)")
    elif keys(key) in (None, keys("trainer.policy.model.path")):
        out.inert(key, "the reference is the policy's initial weights")
    else:
        out.refuse(key, "a reference model other than the policy's checkpoint is not built into corerl",
                   "remove the key (the reference is the policy's initial weights)")


def _environment(keys: _Keys, out: Translator) -> None:
    env = keys("environment.env_class")
    if keys.given("environment.env_class"):
        out.put("environment.env_class", f"{GYM_SECTION}.env_class", env,
                f"data.env_name {GYM_ENVIRONMENT}, {GYM_SECTION}.env_class")
        set_at(out.tree, "data.env_name", GYM_ENVIRONMENT)
        out.new_origins["data.env_name"] = out.new_origins[f"{GYM_SECTION}.env_class"]
    gym = value_at(keys.raw, "environment.skyrl_gym")
    if not isinstance(gym, dict):
        return
    for section, settings in gym.items():
        if section == "max_env_workers" or not isinstance(settings, dict):
            continue
        for name, value in settings.items():
            source = f"environment.skyrl_gym.{section}.{name}"
            if section == env or (env == "text2sql" and section == "text2sql"):
                out.put(source, f"{GYM_SECTION}.env_config.{name}", value)
            else:
                out.inert(source, f"environment.skyrl_gym.{section} is not the environment the script plays "
                                  f"(environment.env_class: {env})")


def _data(keys: _Keys, out: Translator) -> None:
    """SkyRL's parquet layout: chat-message prompts, the answer at ``reward_spec.ground_truth``."""
    if value_at(out.tree, "data.train_files") is None:
        return
    for target, value in (("data.task", "dataset"), ("data.prompt_key", "prompt"),
                          ("data.answer_key", "reward_spec.ground_truth"), ("data.apply_chat_template", True)):
        set_at(out.tree, target, value)
        out.new_origins[target] = "skyrl dialect (SkyRL's dataset layout)"


def derive_sft(raw: dict[str, Any], out: Translator) -> None:
    """Decide the ``derived`` keys of the SFT entry point's script (its keys at the top level)."""
    keys = _Keys(raw)
    _lora(keys, out, "model.lora.rank")
    set_at(out.tree, "algorithm.name", "sft")
    set_at(out.tree, "sft.enabled", False)
    out.new_origins["algorithm.name"] = "SkyRL's sft entry point"
    for source, target in (("train_datasets", "data.train_files"), ("eval_datasets", "data.held_out_files")):
        if keys.given(source):
            out.put(source, target, _files(keys(source)))
    if keys.given("dataset_name"):
        out.put("dataset_name", "data.hub_dataset", keys("dataset_name"))
    if keys.given("eval_dataset_name"):
        out.inert("eval_dataset_name", "corerl holds out rows of data.hub_dataset")
    if keys.given("train_datasets") or keys.given("dataset_name"):
        set_at(out.tree, "data.task", "dataset")
        out.new_origins["data.task"] = "skyrl dialect (SkyRL's SFT rows: chat messages)"
        _conversation_keys(keys, out)
    _splits(keys, out)
    _eval_splits(keys, out)
    _mixture(keys, out)
    _full_context(keys, out)
    _packing_budget(keys, out)
    _output_dir(keys, out, "ckpt_path")
    if keys.given("num_epochs"):
        out.inert("num_epochs", "num_steps is given" if keys.given("num_steps") else
                  "corerl runs algorithm.max_steps steps (give num_steps)")
    interval = keys("ckpt_interval")
    if isinstance(interval, int) and interval > 0:
        out.put("ckpt_interval", "checkpointing.save_period", interval, "checkpointing.enabled, save_period")
        set_at(out.tree, "checkpointing.enabled", True)
    elif keys.given("ckpt_interval"):
        out.put("ckpt_interval", "checkpointing.enabled", False)
    resume = keys("resume_from")
    if keys.given("resume_from") and resume in ("", "latest", None):
        out.inert("resume_from", "corerl resumes a run found in run.output_dir (run.resume auto)")
    elif keys.given("resume_from"):
        out.refuse("resume_from", "resuming from a given checkpoint folder is not built into corerl",
                   "remove the key (a run resumes from its own run.output_dir)")


#: SFT key -> (corerl's data key, SkyRL's default): a row is a conversation to learn
_CONVERSATION_DEFAULTS = {"messages_key": ("data.prompt_key", "messages"), "tools_key": ("data.tools_key", "tools"),
                          "system_key": ("data.system_key", "system"),
                          "train_on_what": ("data.train_on", "last_assistant_message")}


def _conversation_keys(keys: _Keys, out: Translator) -> None:
    """SkyRL's SFT rows are conversations (its chat-message format): corerl learns them as
    ``data.train_on`` says, reading SkyRL's columns where the script names none (``messages``,
    ``tools`` and ``system``; the last two only where a row has them) and training on the last
    assistant message unless ``train_on_what`` says otherwise."""
    for source, (target, default) in _CONVERSATION_DEFAULTS.items():
        if not keys.given(source):
            set_at(out.tree, target, default)
            out.new_origins[target] = f"SkyRL's default of {source} ({default})"


def _packing_budget(keys: _Keys, out: Translator) -> None:
    """SFT's ``max_tokens_per_microbatch``: the token budget of a packed micro-batch (SkyRL's bin
    capacity, at least ``max_length``; null: ``max_length``), read only with ``use_sequence_packing``
    (the RL trainer's key of that name is dynamic batching's budget, not this)."""
    if not keys.given("max_tokens_per_microbatch"):
        return
    budget, length = keys("max_tokens_per_microbatch"), keys("max_length")
    if not keys("use_sequence_packing"):
        out.inert("max_tokens_per_microbatch", "used only with use_sequence_packing (a packed micro-batch's tokens)")
    elif budget is None:
        if isinstance(length, int):
            out.put("max_tokens_per_microbatch", "policy.sequence_packing.train_mb_tokens", length,
                    "policy.sequence_packing.train_mb_tokens (null: max_length)")
        else:
            out.inert("max_tokens_per_microbatch", "null: corerl's packer sizes the micro-batches")
    elif not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0 or (
            isinstance(length, int) and budget < length):
        out.refuse("max_tokens_per_microbatch", f"{budget!r} is not a packed micro-batch's token budget: a count of at "
                                                f"least max_length ({length}), as SkyRL requires",
                   "give max_tokens_per_microbatch a count of at least max_length, or remove it")
    else:
        out.put("max_tokens_per_microbatch", "policy.sequence_packing.train_mb_tokens", budget)


def _full_context(keys: _Keys, out: Translator) -> None:
    """SFT's ``dummy_run_full_ctx``: SkyRL's benchmark mode, made-up sequences of ``max_length``
    tokens in place of the data for ``dummy_run_max_steps`` steps (default 5): corerl's
    ``data.full_context`` (a memory check) for that many steps."""
    steps = keys("dummy_run_max_steps") if keys.given("dummy_run_max_steps") else 5
    if not keys("dummy_run_full_ctx"):
        if keys.given("dummy_run_full_ctx"):
            out.inert("dummy_run_full_ctx", "false: the data is trained on")
        if keys.given("dummy_run_max_steps"):
            out.inert("dummy_run_max_steps", "used only with dummy_run_full_ctx")
        return
    if not isinstance(steps, int) or steps <= 0:
        out.refuse("dummy_run_max_steps", f"{steps!r}: the steps of a dummy run are a count above 0, as SkyRL "
                                          "requires", "give dummy_run_max_steps=5 (or another count)")
        return
    out.put("dummy_run_full_ctx", "data.full_context", True, "data.full_context (every batch made-up sequences of "
                                                              "policy.max_seq_length tokens)")
    if keys.given("num_steps"):
        out.make_inert("num_steps", "algorithm.max_steps", steps, "a dummy run takes dummy_run_max_steps steps")
    else:
        set_at(out.tree, "algorithm.max_steps", steps)
    if keys.given("dummy_run_max_steps"):
        out.put("dummy_run_max_steps", "algorithm.max_steps", steps)
    else:
        out.new_origins["algorithm.max_steps"] = "SkyRL's default of dummy_run_max_steps (5), dummy_run_full_ctx"


def _files(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _lora(keys: _Keys, out: Translator, key: str) -> None:
    """SkyRL's LoRA is on where its rank is above 0."""
    rank = keys(key)
    if isinstance(rank, int) and rank > 0:
        out.put(key, "policy.lora.dim", rank, "policy.lora.enabled, policy.lora.dim")
        set_at(out.tree, "policy.lora.enabled", True)
    elif keys.given(key):
        out.inert(key, "0: no LoRA (the whole model trains)")


def _sequence_mask(keys: _Keys, out: Translator, token_tis: Any) -> None:
    """SkyRL's geometric sequence mask: corerl's ``seq-mask`` (a sequence whose geometric-mean
    ratio lies outside [geo_mask_low, geo_mask_high] is left out; the others' tokens are not
    weighted: SkyRL's mask weighs nothing)."""
    key = _A + "off_policy_correction.sequence_mask_metric"
    metric = keys(key)
    bounds = [_A + "off_policy_correction.geo_mask_low", _A + "off_policy_correction.geo_mask_high"]
    if metric == "geometric" and token_tis is None:
        out.put(key, "algorithm.importance_sampling_correction", True,
                "algorithm.importance_sampling_type seq-mask")
        set_at(out.tree, "algorithm.importance_sampling_type", "seq-mask")
        for source, target, default in zip(bounds, ("algorithm.importance_weight_min",
                                                    "algorithm.importance_weight_cap"), (0.99, 1.01), strict=True):
            _put(out, keys, source, target, keys(source) if keys.given(source) else default)
        return
    if metric == "geometric":
        out.refuse(key, f"{token_tis}-level TIS together with a geometric sequence mask is not built into corerl "
                        "(either alone is)", "set tis_ratio_type=null or sequence_mask_metric=null")
    elif metric is not None:
        out.refuse(key, f"the {metric!r} sequence mask is not built into corerl (geometric is)", "use geometric")
    for source in bounds:
        if keys.given(source):
            out.inert(source, "used only with sequence_mask_metric geometric")


_SPLIT = re.compile(r"\s*(\w[\w.-]*)\s*(?:\[\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*\])?\s*")


def _split_rows(split: Any) -> tuple[str, int | None, int | None] | None:
    """A Hugging Face split (``train``, ``train[:100]``, ``train[-500:]``, ``train[200:300]``):
    (its name, the slice's start and stop); None for another form (a percentage, several slices)."""
    found = _SPLIT.fullmatch(str(split))
    if found is None:
        return None
    name, start, stop = found.groups()
    return name, None if start is None else int(start), None if stop is None else int(stop)


def _rows_text(start: int | None, stop: int | None) -> str:
    """The slice as ``data.train_rows`` / ``data.held_out_rows`` read it (``:`` the whole file)."""
    return f"{'' if start is None else start}:{'' if stop is None else stop}"


def _split_list(keys: _Keys, out: Translator, key: str, datasets_key: str) -> list[tuple[str, Any, Any]] | None:
    """``key``'s splits, one per entry of ``datasets_key`` (SkyRL refuses other counts), each read
    by :func:`_split_rows`; None (refused) where they are not."""
    splits = keys(key)
    texts = [splits] if isinstance(splits, str) else [str(split) for split in splits]
    read = [_split_rows(split) for split in texts]
    odd = [text for text, parts in zip(texts, read, strict=True) if parts is None]
    if odd:
        out.refuse(key, f"{odd[0]!r}: a split other than a name with one row slice (train, train[:N], "
                        "train[-N:], train[a:b]) is not built into corerl (percentages are not)",
                   "give the split as rows: train[a:b]")
        return None
    datasets = keys(datasets_key) if keys.given(datasets_key) else None
    # without the list, SkyRL reads one dataset: the deprecated single name's, or its default
    count = 1 if datasets is None else len(_files(datasets))
    if count != len(texts):
        out.refuse(key, f"{splits!r}: {len(texts)} split(s) for {count} dataset(s) of {datasets_key}; SkyRL requires "
                        "one split per entry of it", f"give {datasets_key} and one split for each of its datasets")
        return None
    return read  # type: ignore[return-value]


def _splits(keys: _Keys, out: Translator) -> None:
    """SFT's ``train_dataset_splits``: a Hugging Face split slice of each training dataset. One
    dataset's first rows (``train[:N]``) are corerl's ``data.max_train_rows``; another slice, or
    several datasets' slices, ``data.train_rows`` (a slice of each file's rows)."""
    key = "train_dataset_splits"
    if not keys.given(key):
        return
    if keys(key) is None:
        out.inert(key, "null: the whole files")
        return
    read = _split_list(keys, out, key, "train_datasets")
    if read is None:
        return
    if all(start is None and stop is None for _, start, stop in read):
        out.inert(key, "a whole split: corerl reads the whole files")
    elif len(read) == 1 and read[0][1] is None and read[0][2] is not None and read[0][2] > 0:
        out.put(key, "data.max_train_rows", read[0][2], "data.max_train_rows (the first rows)")
    else:
        out.put(key, "data.train_rows", [_rows_text(start, stop) for _, start, stop in read],
                "data.train_rows (each file's rows)")


def _eval_splits(keys: _Keys, out: Translator) -> None:
    """SFT's ``eval_dataset_splits``: a slice of each eval dataset's rows (``train[-500:]``, the
    training dataset's last rows) is corerl's ``data.held_out_rows`` of ``data.held_out_files``."""
    key = "eval_dataset_splits"
    if not keys.given(key):
        return
    if keys(key) is None:
        out.inert(key, "null: the whole held-out files")
        return
    if not keys.given("eval_datasets") and keys.given("eval_dataset_name"):
        out.inert(key, "the split of eval_dataset_name (a Hugging Face dataset: corerl holds out rows of "
                       "data.hub_dataset)")
        return
    if not keys.given("eval_datasets"):
        out.refuse(key, f"{keys(key)!r}: a split slice of them needs eval_datasets, which is not given (SkyRL refuses "
                        "eval_dataset_splits alone)", "give eval_datasets, one per split, or remove the key")
        return
    read = _split_list(keys, out, key, "eval_datasets")
    if read is None:
        return
    if all(start is None and stop is None for _, start, stop in read):
        out.inert(key, "a whole split: corerl holds out the whole held-out files (eval_datasets)")
        return
    out.put(key, "data.held_out_rows", [_rows_text(start, stop) for _, start, stop in read],
            "data.held_out_rows (each held-out file's rows)")


def _mixture(keys: _Keys, out: Translator) -> None:
    """Several training datasets: SkyRL draws each batch from them in the ratio of
    ``train_dataset_weights`` (unset: equal), whatever their sizes: corerl's
    ``data.train_file_weights``. One dataset's weight changes nothing."""
    key = "train_dataset_weights"
    datasets = _files(keys("train_datasets")) if keys.given("train_datasets") and keys("train_datasets") else []
    weights = keys(key) if keys.given(key) else None
    if len(datasets) <= 1:
        if weights is not None and len(weights) > 1:
            out.refuse(key, f"{weights!r}: mixing several datasets by weight needs one train_datasets entry per "
                            f"weight ({len(datasets)} given)", "give the datasets in train_datasets")
        elif keys.given(key):
            out.inert(key, "one dataset: its weight changes nothing")
        return
    if not keys.given("train_dataset_splits"):
        if weights is not None:
            out.refuse(key, f"{weights!r}: mixing several datasets by weight needs train_dataset_splits, one split "
                            "per dataset (SkyRL refuses several datasets without)", "give train_dataset_splits")
        else:
            out.refuse("train_datasets", f"{len(datasets)} datasets need train_dataset_splits, one split per dataset "
                                         "(SkyRL refuses them without)", "give train_dataset_splits")
        return
    if keys("sampler") not in ("random", None):
        if weights is not None:
            out.refuse(key, f"sampler {keys('sampler')!r}: SkyRL mixes datasets by weight only with sampler random",
                       "remove the key, or set sampler=random")
        return
    if weights is None:
        set_at(out.tree, "data.train_file_weights", [1.0 / len(datasets)] * len(datasets))
        out.new_origins["data.train_file_weights"] = ("SkyRL's default of train_dataset_weights (several datasets "
                                                      "mixed equally)")
        return
    if len(weights) != len(datasets) or any(not isinstance(w, (int, float)) or w <= 0 for w in weights):
        out.refuse(key, f"{weights!r}: one weight above 0 per entry of train_datasets ({len(datasets)}) is needed, as "
                        "SkyRL requires", "give one positive weight per dataset")
        return
    out.put(key, "data.train_file_weights", [float(w) for w in weights],
            "data.train_file_weights (each batch's share of each file)")


def _dedicated_generation(keys: _Keys, out: Translator) -> None:
    """``trainer.placement.colocate_all=false``: SkyRL's engines get GPUs of their own,
    ``num_engines`` x the engine's ``tensor_parallel_size``."""
    if keys("trainer.placement.colocate_all") is not False or keys(_IE + "run_engines_locally") is False:
        return  # (run_engines_locally=false: the engines run outside the run: _external_servers)
    engines = keys("generator.inference_engine.num_engines") or 1
    width = keys("generator.inference_engine.tensor_parallel_size") or 1
    if isinstance(engines, int) and isinstance(width, int):
        set_at(out.tree, "policy.generation.colocated.resources.gpus_per_node", engines * width)
        set_at(out.tree, "policy.generation.colocated.resources.num_nodes", 1)
        out.new_origins["policy.generation.colocated.resources.gpus_per_node"] = (
            "generator.inference_engine.num_engines x tensor_parallel_size (colocate_all=false)")


_IE = "generator.inference_engine."
_OUTSIDE = ("an inference engine setting of SkyRL's external servers: corerl's remote backend sends them requests "
            "and weights, and each server's engine is the one its own recipe set (corerl serve-generation)")


def _external_servers(keys: _Keys, out: Translator) -> None:
    """``run_engines_locally=false``: the inference engines run outside the run, reached over HTTP
    (``external_proxy_url`` takes the generation requests, each of ``external_server_urls`` the
    refits; without a proxy the servers share the requests): corerl's ``remote`` generation backend."""
    proxy_key, urls_key, local_key = _IE + "external_proxy_url", _IE + "external_server_urls", _IE + "run_engines_locally"
    proxy, urls = keys(proxy_key), keys(urls_key)
    urls = [urls] if isinstance(urls, str) else list(urls or [])
    if keys(local_key) is not False:
        if keys.given(local_key):
            out.inert(local_key, "true: corerl starts its generation engines itself")
        for key in (proxy_key, urls_key):
            if keys.given(key):
                out.inert(key, "used only with run_engines_locally false: corerl starts its generation engines itself")
        return
    if not proxy and not urls:
        out.refuse(local_key, "false names no external server (external_proxy_url, external_server_urls), and "
                              "without one corerl starts its generation engines itself",
                   f"give {urls_key}=['http://host:port'] (servers started with `corerl serve-generation`)")
        return
    for fate in [f for f in getattr(out, "fates", []) if f.key.startswith(_IE) and f.fate == "acts"]:
        out.refate(fate.key, "inert", _OUTSIDE)
    if keys.given(_IE + "weight_sync_backend"):
        out.refate(_IE + "weight_sync_backend", "inert", "external servers take each refit as safetensors chunks over "
                                                         "HTTP (corerl's remote generation backend)")
    out.put(local_key, "policy.generation.backend", "remote",
            "policy.generation.backend remote (generation servers started apart from the run)")
    if urls:
        out.put(urls_key, "policy.generation.remote.urls", [str(u) for u in urls])
    elif keys.given(urls_key):
        out.inert(urls_key, "null: the proxy takes the refits too")
    if proxy:
        out.put(proxy_key, "policy.generation.remote.proxy_url", str(proxy))
    elif keys.given(proxy_key):
        out.inert(proxy_key, "null: the servers share the generation requests")
    # the run's GPUs all train; asynchronous RL keeps its generation worker (here the servers' client)
    # in a process of its own, apart from training, as colocate_all=false says
    if keys.given("trainer.placement.colocate_all") and value_at(out.tree, "algorithm.async.enabled") is not True:
        out.refate("trainer.placement.colocate_all", "inert", "the inference engines run outside the run "
                                                               "(run_engines_locally false): every GPU of the run trains")
        set_at(out.tree, "policy.generation.colocated.enabled", True)
    elif value_at(out.tree, "policy.generation.colocated.enabled") is False:  # the client's worker: one process
        set_at(out.tree, "policy.generation.colocated.resources.gpus_per_node", 1)
        out.new_origins["policy.generation.colocated.resources.gpus_per_node"] = (
            "asynchronous RL's generation worker, the external servers' client (run_engines_locally=false)")


def _output_dir(keys: _Keys, out: Translator, key: str) -> None:
    """SkyRL's checkpoint folder is corerl's ``run.output_dir`` (empty: corerl's default)."""
    if not keys.given(key):
        return
    folder = keys(key)
    if folder:
        out.put(key, "run.output_dir", str(folder), "run.output_dir (checkpoints and logs)")
    else:
        out.inert(key, "empty: corerl's default run.output_dir")


def _conversation(keys: _Keys, out: Translator) -> None:
    key = "generator.use_conversation_multi_turn"
    if not keys.given(key):
        return
    turns = keys("generator.max_turns") or 1
    if keys(key) is not False:
        out.inert(key, "corerl's rollout: each turn a message of the conversation")
    elif isinstance(turns, int) and turns <= 1:
        out.inert(key, "false with one turn (generator.max_turns 1): there is no second turn to place")
    else:
        out.put(key, f"{GYM_SECTION}.conversation_format", False,
                f"{GYM_SECTION}.conversation_format false: the environment's observations appended as text inside "
                "the model's response (one assistant message)")
