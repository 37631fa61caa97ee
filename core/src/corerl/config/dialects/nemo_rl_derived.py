"""What several keys of a NeMo RL recipe decide together: the batch arithmetic, the chat template,
the scheduler list, the dataset, evaluation during training and the checkpoints kept, the critic,
the asynchronous loop, dedicated generation, the teacher and reward models, vision-language
recipes. The engine sections' own translation functions come from their plugins
(:attr:`corerl.registry.SectionRules.derived`), run after these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corerl.config.dialects import nemo_rl_opd as opd
from corerl.config.dialects import nemo_rl_vision as vision
from corerl.config.dialects.key_fate import KeyFate
from corerl.config.dialects.nemo_rl_lookup import (
    SAMPLING_ALGORITHMS,
    _leaves,
    _rule_name,
    _switched_off,
    is_eval_recipe,
    nemo_only,
    rule_for,
    table,
)
from corerl.config.dialects.rules import _DEFAULT_ONLY, Translator
from corerl.config.tree import drop_at, origin_of, set_at, value_at


def _derived(raw: dict[str, Any], out: Translator, algorithm: str | None) -> None:
    """What several keys decide together: the batch arithmetic, the chat template, the scheduler
    list, the dataset, evaluation and the checkpoints kept, the teacher and reward models."""
    policy = raw.get("policy", {}) if isinstance(raw.get("policy"), dict) else {}
    global_batch = policy.get("train_global_batch_size")
    updates_per_step = 1  # optimizer steps per GRPO step: NeMo RL steps its scheduler once per GRPO step
    if algorithm in SAMPLING_ALGORITHMS and global_batch is not None:
        grpo = raw.get(algorithm, {})
        samples = grpo.get("num_prompts_per_step", 0) * grpo.get("num_generations_per_prompt", 0)
        if samples and (not isinstance(global_batch, int) or global_batch < 1 or samples % global_batch):
            out.refuse("policy.train_global_batch_size",
                       f"{global_batch} sequences per optimizer step do not divide the {samples} a step samples "
                       f"({algorithm}.num_prompts_per_step x num_generations_per_prompt)",
                       "give a divisor of the step's samples")
        elif samples:
            updates_per_step = samples // global_batch
            out.put("policy.train_global_batch_size", "algorithm.optimizer_batch_size", global_batch,
                    f"algorithm.optimizer_batch_size ({updates_per_step} optimizer step(s) per "
                    f"{algorithm.upper()} step)")
    if algorithm is not None and algorithm != "ppo":
        opd.translate(raw, out, algorithm)  # the advantage estimator (opd: on-policy distillation)
    opd.without_ratio(raw, out)
    estimator = value_at(raw, "grpo.adv_estimator.name") or "grpo"
    if value_at(raw, "loss_fn.use_kl_in_reward") and algorithm == "grpo" and estimator != "reinforce_plus_plus":
        # NeMo RL's KL in the reward is REINFORCE++'s (SkyRL's, with outcome estimators, is another)
        out.refuse("loss_fn.use_kl_in_reward", "folds the KL into REINFORCE++'s token rewards, and "
                   f"grpo.adv_estimator.name is {estimator!r}", "set grpo.adv_estimator.name=reinforce_plus_plus, "
                   "or use_kl_in_reward=false")
    force = value_at(raw, "loss_fn.force_on_policy_ratio")
    if force and updates_per_step > 1:
        out.refuse("loss_fn.force_on_policy_ratio", f"forcing the PPO ratio to 1 over {updates_per_step} optimizer "
                   "steps per GRPO step is not built into corerl yet", "set it to false, or give "
                   "policy.train_global_batch_size all of a step's samples")
    elif force is not None:
        out.inert("loss_fn.force_on_policy_ratio", "with one optimizer step per GRPO step the ratio is 1 already"
                  if force else _DEFAULT_ONLY)
    if global_batch is not None and algorithm not in SAMPLING_ALGORITHMS:
        if algorithm == "sft":
            out.put("policy.train_global_batch_size", "algorithm.batch_size", global_batch)
        elif algorithm in ("dpo", "rm"):  # read as preference pairs per optimizer step
            out.put("policy.train_global_batch_size", "algorithm.batch_size", global_batch,
                    "algorithm.batch_size (pairs per step)")
        else:
            out.inert("policy.train_global_batch_size", "no algorithm section: nothing is trained")
    _dedicated_generation(raw, out)
    _asynchronous(raw, out)
    _chat_template(raw, out)
    max_steps = value_at(raw, f"{algorithm}.max_num_steps") if algorithm else None
    _scheduler(policy.get("scheduler"), "policy.scheduler", "policy.scheduler", out, updates_per_step, max_steps)
    if algorithm == "ppo":
        _critic(raw, out, updates_per_step, max_steps)
    keys = ["data.dataset_name", "data.train.dataset_name", "data.validation.dataset_name", "data.default.dataset_name"]
    # several datasets at once (nemo_rl_datasets): a list of names, the first standing for them all
    names = [(key, value[0] if isinstance(value, list) else value) for key in keys if (value := value_at(raw, key))]
    if value_at(out.tree, "data.train_files") is not None and algorithm in ("dpo", "rm"):
        set_at(out.tree, "data.task", "preferences")  # prompt/chosen/rejected rows (data.*_key rename them)
        for key, name in names:
            out.inert(key, f"{name!r}: the local files given replace it")
    elif value_at(out.tree, "data.train_files") is not None:
        set_at(out.tree, "data.task", "dataset")
        # NeMo RL's response datasets read the columns input and output unless told otherwise
        for key, column in (("data.prompt_key", "input"), ("data.answer_key", "output")):
            if value_at(out.tree, key) is None:
                set_at(out.tree, key, column)
                out.new_origins[key] = "nemo-rl dialect (NeMo RL's default column)"
        for key, name in names:
            out.inert(key, f"{name!r}: the local files given replace it")
    elif names:
        set_at(out.tree, "data.task", "preferences" if algorithm in ("dpo", "rm") else "dataset")
        (first, name), *others = names  # the first name given is the one refused at run start
        out.put(first, "data.hub_dataset", str(name))
        out.fates += [KeyFate(key, "acts", "data.hub_dataset") for key, _ in others]
    _checkpoint_ranking(raw, out, algorithm, _evaluation(raw, out, algorithm))
    length = value_at(raw, "policy.max_total_sequence_length") or 0
    _frozen_model(raw, out, "teacher", "the teacher", {
        "tokenizer.name": (_always, "the teacher scores the student's token ids: at run start corerl checks that the "
                                    "teacher's checkpoint maps every token as the student's tokenizer does", ""),
        "max_total_sequence_length": (lambda value: value is None or value >= length,
                                      "the teacher scores the student's sequences, at most "
                                      "policy.max_total_sequence_length tokens",
                                      "shorter than policy.max_total_sequence_length: the teacher scores the "
                                      "student's whole sequences")}, own_layout="algorithm.distillation.teacher_overrides")
    _dataloaders(raw, out)
    _reward_model_environment(raw, out)
    _reward_model_policy(raw, out, algorithm)
    _eval_recipe(raw, out)
    _vision(raw, out)


def _dataloaders(raw: dict[str, Any], out: Translator) -> None:
    """``data.num_prompts_per_dataloader`` and ``custom_dataloader``: NeMo RL's multiple dataloaders'
    settings, read only with ``use_multiple_dataloader`` on (refused: its custom function is the
    recipe's code); the datasets' rows are otherwise one pool. Several files with ``max_samples``:
    the cap is each file's (``data.train_rows``), as NeMo RL caps each dataset."""
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    files, cap = value_at(out.tree, "data.train_files"), value_at(raw, "data.train.max_samples")
    if isinstance(files, list) and len(files) > 1 and cap is not None:
        drop_at(out.tree, "data.max_train_rows")
        set_at(out.tree, "data.train_rows", f":{cap}")
        out.new_origins["data.train_rows"] = origin_of("data.train.max_samples", out.origins) or "nemo-rl dialect"
        out.refate("data.train.max_samples", "acts", f"data.train_rows (the first {cap} rows of each file)")
    for key in ("num_prompts_per_dataloader", "custom_dataloader"):
        if key in data:
            out.inert(f"data.{key}", "used only with data.use_multiple_dataloader (off here, refused on): the "
                                     "datasets' rows are drawn as one pool")


def _chat_template(raw: dict[str, Any], out: Translator) -> None:
    """NeMo RL's ``tokenizer.chat_template``: a template formats every prompt (``default``: the
    tokenizer's own); null is its passthrough template, the prompt as it is."""
    key = "tokenizer" if is_eval_recipe(raw) else "policy.tokenizer"
    tokenizer = value_at(raw, key)
    if not isinstance(tokenizer, dict) or "chat_template" not in tokenizer:
        return
    template, key = tokenizer["chat_template"], f"{key}.chat_template"
    if isinstance(template, str) and template.lower() == "default":
        out.put(key, "data.apply_chat_template", True, "data.apply_chat_template (the tokenizer's own template)")
    elif template:
        out.put(key, "policy.chat_template", template, "policy.chat_template, data.apply_chat_template")
        set_at(out.tree, "data.apply_chat_template", True)
    else:
        out.inert(key, "null: NeMo RL's passthrough template, the prompt as it is (no chat template)")


_NO_EVALUATION = "no evaluation during training (val_period); the held-out reward is reported before and after it"


def _evaluation(raw: dict[str, Any], out: Translator, algorithm: str | None) -> int | None:
    """NeMo RL's validation during training (``<algorithm>.val_period`` and the keys beside it) as
    corerl's ``eval`` section, for the algorithms it validates by sampling answers, except while
    GRPO runs asynchronously (corerl then evaluates only before and after training). Returns the
    answers a prompt each evaluation samples (None: no evaluation during training)."""
    section = raw.get(algorithm) if algorithm in SAMPLING_ALGORITHMS else None
    section = section if isinstance(section, dict) else {}
    period = section.get("val_period")
    every = period if type(period) is int and period > 0 else None
    if every is not None and value_at(out.tree, "algorithm.async.enabled") is True:
        reason = ("asynchronous GRPO's generation runs ahead of training, so corerl evaluates only before and after "
                  "it")
        out.inert(f"{algorithm}.val_period", reason)
        out.warnings.append(f"{algorithm}.val_period={period}: {reason}")
        every = None
    elif every is not None:
        out.put(f"{algorithm}.val_period", "eval.every_n_steps", every)
    elif "val_period" in section:
        out.inert(f"{algorithm}.val_period", f"{period}: {_NO_EVALUATION}")
    named = [key for key in ("val_num_generations_per_prompt", "num_val_generations_per_prompt") if key in section]
    samples = (section[named[0]] if named else None) or 1  # NeMo RL's default: one answer a prompt
    for key, target, value in [("val_at_start", "eval.at_start", section.get("val_at_start")),
                               *((name, "eval.num_samples", samples) for name in named[:1])]:
        if key in section and every is not None:
            out.put(f"{algorithm}.{key}", target, value)
        elif key in section:
            out.inert(f"{algorithm}.{key}", _NO_EVALUATION)
    for name in named[1:]:
        out.inert(f"{algorithm}.{name}", f"{named[0]} is given")
    if every is not None and not named:
        set_at(out.tree, "eval.num_samples", 1)
        out.new_origins["eval.num_samples"] = "nemo-rl dialect (NeMo RL's default: one validation answer a prompt)"
    _validation_sampling(raw, out, every is not None)
    return samples if every is not None else None


def _validation_sampling(raw: dict[str, Any], out: Translator, evaluates: bool) -> None:
    """``generation.val_temperature``, ``val_top_p``, ``val_top_k``: with evaluation during
    training the temperature is ``eval.temperature``; evaluation samples with the generation's
    top_p and top_k, so another value is refused where the recipe evaluates (an evaluation recipe
    always does, at its generation's temperature too)."""
    recipe = is_eval_recipe(raw)
    prefix = "generation" if recipe else "policy.generation"
    generation = value_at(raw, prefix)
    if not isinstance(generation, dict):
        return
    for name in ("temperature", "top_p", "top_k"):
        key, value, own = f"{prefix}.val_{name}", generation.get(f"val_{name}"), generation.get(name)
        if f"val_{name}" not in generation:
            continue
        if name == "temperature" and evaluates:
            out.put(key, "eval.temperature", value)
        elif (evaluates or recipe) and value != own:
            out.refuse(key, f"{value!r} differs from {prefix}.{name} ({own!r}): corerl samples evaluation answers "
                            f"with {prefix}.{name}", f"give {prefix}.{name}'s value")
        else:
            out.inert(key, f"the same as {prefix}.{name}" if evaluates or recipe else _NO_EVALUATION)


#: NeMo RL's checkpoint metrics (``val:<name>``, ``train:<name>``) and the corerl metric each is
VALIDATION_METRICS = {"accuracy": "eval/mean@{n}", "total_reward/mean": "eval/mean@{n}", "pass_k": "eval/pass@{n}"}
TRAINING_METRICS = {"loss": "loss", "reward": "reward/mean", "total_reward/mean": "reward/mean"}


def _checkpoint_ranking(raw: dict[str, Any], out: Translator, algorithm: str | None, samples: int | None) -> None:
    """NeMo RL's ``checkpointing.metric_name``, ``higher_is_better`` and ``keep_top_k``: the best
    ``keep_top_k`` checkpoints by a metric corerl logs too (and the newest), else the newest
    ``keep_top_k`` (NeMo RL's own order where the metric is never logged). ``samples``: the
    answers a prompt each evaluation during training samples (None: no such evaluation)."""
    checkpointing = raw.get("checkpointing")
    if not isinstance(checkpointing, dict) or _switched_off("checkpointing.keep_top_k", raw, out.host):
        return  # checkpoints off: the loop made every key inert
    name, keep = checkpointing.get("metric_name"), checkpointing.get("keep_top_k")
    kind, _, metric = str(name).partition(":")
    period = value_at(raw, f"{algorithm}.val_period")
    validated = type(period) is int and period > 0  # NeMo RL logs val: metrics during training
    target = (VALIDATION_METRICS[metric].format(n=samples) if kind == "val" and metric in VALIDATION_METRICS
              and samples is not None else TRAINING_METRICS.get(metric) if kind == "train" else None)
    if target is not None and keep is not None:
        out.put("checkpointing.metric_name", "checkpointing.metric_name", target,
                f"checkpointing.metric_name ({target})")
        out.put("checkpointing.keep_top_k", "checkpointing.keep_top_k", keep)
        if "higher_is_better" in checkpointing:
            out.put("checkpointing.higher_is_better", "checkpointing.higher_is_better",
                    checkpointing["higher_is_better"])
        return
    if keep is not None:
        out.put("checkpointing.keep_top_k", "checkpointing.keep_last", keep,
                f"checkpointing.keep_last (the newest {keep})")
    elif "keep_top_k" in checkpointing:
        out.inert("checkpointing.keep_top_k", "null: NeMo RL keeps every checkpoint; corerl keeps "
                                              "checkpointing.keep_last")
    if name is None or (kind == "val" and not validated):
        why = "NeMo RL logs no such metric in this recipe either, so it too keeps the newest checkpoints"
    elif kind == "val" and metric in VALIDATION_METRICS:
        why = "corerl does not evaluate during this run, so the newest checkpoints are kept"
    else:
        why = "corerl logs no such metric during training, so the newest checkpoints are kept"
    for key in ("metric_name", "higher_is_better"):
        if key in checkpointing:
            out.inert(f"checkpointing.{key}", f"{name}: {why}")
    if name is not None and keep is not None and not why.startswith("NeMo RL"):
        out.warnings.append(f"checkpointing.metric_name={name}: {why} (the newest {keep}, not the best {keep})")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in prefixes)


def _always(_: Any) -> bool:
    return True


def _frozen_model(raw: dict[str, Any], out: Translator, section: str, what: str,
                  own: dict[str, tuple[Callable[[Any], bool], str, str]], own_layout: str | None = None) -> None:
    """The keys of ``section``, a frozen model beside the policy (NeMo RL's teacher, its reward
    model environment), that no rule of their own names. What only training or generation reads is
    inert; a key of ``own`` (test, why it is inert, why it is refused) is inert where its test
    passes; any other key must equal the policy's, since corerl runs ``what`` on the policy's
    training backend with the policy's layout and settings, unless ``own_layout`` names where
    corerl takes the frozen model's own ``policy`` keys (the teacher's
    ``algorithm.distillation.teacher_overrides``): a differing key whose policy twin acts on a
    ``policy.*`` key goes there. The keys that still differ are refused together, in one line."""
    tree = value_at(raw, section)
    if not isinstance(tree, dict):
        return
    differing: list[tuple[str, str]] = []
    for rest, value in _leaves(tree, host=out.host):
        path, policy_path = f"{section}.{rest}", f"policy.{rest}"
        if _rule_name(path, out.host) != f"{section}.*":
            continue  # a rule of its own: judged in the loop
        off = _switched_off(policy_path, {"policy": tree}, out.host)
        test, reason, refusal = next((own[key] for key in own if _under(rest, (key,))), (None, "", ""))
        if off is not None:
            out.inert(path, f"{section}{off[len('policy'):]}.enabled is false")
        elif _under(rest, table(out.host).frozen_inert):
            out.inert(path, f"{what} is frozen and only scores: what training and generation read does nothing")
        elif test is not None and test(value):
            out.inert(path, reason)
        elif test is None and value == value_at(raw, policy_path):
            out.inert(path, f"the same as {policy_path}")
        elif test is None and own_layout is not None and (target := _policy_target(policy_path, value, out.host)) is not None:
            out.put(path, f"{own_layout}.{target[0]}", target[1])
        else:
            differing.append((path, f"{value!r}: {refusal}" if test is not None else
                              f"{value!r}, the policy's {value_at(raw, policy_path)!r}"))
    if len(differing) == 1:
        (path, detail), = differing
        out.refuse(path, f"{detail}: corerl runs {what} with the policy's layout and settings",
                   "give the policy's value, or remove the key")
    elif differing:
        listed = ", ".join(f"{path[len(section) + 1:]} ({detail})" for path, detail in differing)
        out.refuse(section, f"{len(differing)} keys differ from the policy's: {listed}; corerl runs {what} with the "
                            "policy's layout and settings", "give the policy's values, or remove the keys")


def _policy_target(policy_path: str, value: Any, host: Any = None) -> tuple[str, Any] | None:
    """The corerl ``policy.*`` key and value NeMo RL's ``policy_path`` acts on: a key without a rule
    passes through under its own name (validation judges it); None where it acts elsewhere, or
    does not act."""
    rule = rule_for(policy_path, host)
    if rule is None:
        return (policy_path, value) if not nemo_only(policy_path) else None
    if rule.fate != "acts" or rule.target is None or not rule.target.startswith("policy."):
        return None
    try:
        return rule.target, rule.convert(value) if rule.convert is not None else value
    except ValueError:
        return None


ENV_NAME_KEYS = ("data.env_name", "data.default.env_name", "data.train.env_name")


def _played(raw: dict[str, Any]) -> Any:
    """The environment a recipe names (NeMo RL's data.env_name, or its default or train dataset's)."""
    return next((value_at(raw, key) for key in ENV_NAME_KEYS if value_at(raw, key)), None)


def _reward_model_environment(raw: dict[str, Any], out: Translator) -> None:
    """NeMo RL's reward-model environment (``env_name: reward_model``): no environment in corerl,
    a Bradley-Terry ``reward_model`` scoring the samples (``env.reward_model.model_name``), frozen
    on the policy's training backend with the policy's layout."""
    source = next((key for key in ENV_NAME_KEYS if value_at(raw, key)), None)
    if source is None or _played(raw) != "reward_model":
        return
    _frozen_model(raw, out, "env.reward_model", "the reward model", {
        "tokenizer.name": (_always, "corerl's reward model reads the policy's token ids (a warning says so)", ""),
        "processor": (_always, "the data processor of NeMo RL's datasets; corerl's dataset task formats rows itself",
                      ""),
        "resources": (_always, "corerl's reward model shares the policy's devices (reward_model.cpu_offload keeps it "
                               "in CPU memory between scorings)", ""),
        "max_model_len": (_always, "corerl's reward model scores each whole sample, at most policy.max_seq_length "
                                   "tokens", ""),
        "checkpoint_path": (lambda path: path is None, "null: the weights of model_name",
                            "corerl loads the reward model from model_name")})
    drop_at(out.tree, "data.env_name")
    out.new_origins.pop("data.env_name", None)
    set_at(out.tree, "reward_model.kind", "bradley_terry")
    out.new_origins["reward_model.kind"] = origin_of(source, out.origins) or "nemo-rl dialect"
    out.refate(source, "acts", "reward_model.kind (bradley_terry): env.reward_model.model_name scores the samples")
    out.warnings.append(f"{source}=reward_model: corerl's reward model scores the prompt and completion token ids "
                        "the policy wrote, without a chat template of its own, so its tokenizer must give the "
                        "policy's ids (NeMo RL's environment re-encodes the conversation with the reward model's)")


def _reward_model_policy(raw: dict[str, Any], out: Translator, algorithm: str | None) -> None:
    """``policy.reward_model_cfg.enabled``: the rm section's reward model, refused elsewhere."""
    key = "policy.reward_model_cfg.enabled"
    if not isinstance(value_at(raw, "policy.reward_model_cfg"), dict) or "enabled" not in raw["policy"][
            "reward_model_cfg"]:
        return
    if value_at(raw, key) and algorithm != "rm":
        out.refuse(key, f"a reward model is trained by NeMo RL's rm section (algorithm.name=rm), not by {algorithm}",
                   "remove it, or train the reward model with an rm section")
    elif algorithm == "rm" and not value_at(raw, key):
        out.refuse(key, "an rm section trains a reward model (a score head on the policy's model)", "set it to true")
    else:
        out.inert(key, "algorithm.name=rm trains a score head on the policy's model" if algorithm == "rm" else
                  "false: the policy is a language model")


def _eval_recipe(raw: dict[str, Any], out: Translator) -> None:
    """An evaluation recipe's local file given is the evaluation set: all of it is held out
    (``corerl eval`` scores it); the engine section's plugin takes its length and precision."""
    if not is_eval_recipe(raw):
        return
    files = value_at(out.tree, "data.train_files")
    if files is not None and value_at(out.tree, "data.held_out_files") is None:
        set_at(out.tree, "data.held_out_files", files)
        out.new_origins["data.held_out_files"] = "nemo-rl dialect (an evaluation recipe evaluates its whole file)"


def _vision(raw: dict[str, Any], out: Translator) -> None:
    """A vision-language recipe (:func:`nemo_rl_vision.marker`): its Hub model must be of a Qwen-VL
    image family and its datasets not audio or video ones (an engine's section refuses its own VLM
    path, in its plugin's translation)."""
    if vision.marker(raw) is None:
        return
    key = vision.model_key(raw)
    why = vision.model_refusal(value_at(raw, key))
    if why is not None:
        out.refuse(key, why, vision.MODEL_HINT)
    for name_key in vision.DATASET_KEYS:
        name = value_at(raw, name_key)
        if vision.is_audio_video_dataset(name):
            out.refuse(name_key, f"{name!r} is an audio or audio-visual dataset: {vision.AUDIO_VIDEO}",
                       "give an image dataset (a local JSONL/Parquet file with an image column, data.image_key)")


LINEAR_LR, CONSTANT_LR = "torch.optim.lr_scheduler.LinearLR", "torch.optim.lr_scheduler.ConstantLR"


def _scheduler(scheduler: Any, source: str, target: str, out: Translator, updates_per_step: int,
               max_steps: Any = None) -> None:
    """NeMo RL's list of torch schedulers at ``source`` as corerl's schedule at ``target``: an
    optional LinearLR warm-up (ending at factor 1), then a constant rate (ConstantLR, or nothing) or
    one LinearLR decay from 1 to 0 that ends at the run's last step (``max_steps``, NeMo RL's
    ``max_num_steps``: corerl's linear decay reaches zero there); any other list is refused."""
    if scheduler is None:
        return
    if not isinstance(scheduler, list):
        out.refuse(source, "expected NeMo RL's list of torch schedulers",
                   f"write a list, or corerl's {target}.name and warmup_steps in a corerl recipe")
        return
    named = [s for s in scheduler if isinstance(s, dict) and "name" in s]  # the milestones entry has no name

    def factors(entry: dict[str, Any]) -> tuple[float, float, int]:
        kwargs = entry.get("kwargs") or {}
        return (float(kwargs.get("start_factor", 1 / 3)), float(kwargs.get("end_factor", 1.0)),
                int(kwargs.get("total_iters", 5)))  # torch's LinearLR defaults

    warmup = named[:1] if named and named[0]["name"] == LINEAR_LR and factors(named[0])[1] == 1.0 else []
    warmup_iters = factors(warmup[0])[2] if warmup else 0
    rest = named[len(warmup):]
    name, why = "constant", ""
    if all(s["name"] == CONSTANT_LR for s in rest):
        pass
    elif len(rest) == 1 and rest[0]["name"] == LINEAR_LR and factors(rest[0])[:2] == (1.0, 0.0):
        decay_iters = factors(rest[0])[2]
        if updates_per_step > 1:  # the backends' schedules span max_steps optimizer steps
            why = (f"a LinearLR decay with {updates_per_step} optimizer steps per algorithm step is not translated "
                   "(corerl's linear schedule spans algorithm.max_steps optimizer steps)")
        elif isinstance(max_steps, int) and max_steps > 0 and warmup_iters + decay_iters == max_steps:
            name = "linear"
        else:
            why = (f"its LinearLR decay ends after {warmup_iters} + {decay_iters} steps, not at the run's last step "
                   f"({max_steps}), where corerl's linear schedule reaches zero")
    else:
        why = "only a LinearLR warm-up, then a constant rate or one LinearLR decay to zero, is translated"
    if why:
        out.refuse(source, why, f"write corerl's {target}.name (constant, linear, cosine) and warmup_steps")
        return
    # NeMo RL counts warm-up in algorithm steps; corerl's scheduler counts optimizer steps
    steps = warmup_iters * updates_per_step
    out.put(source, target, {"name": name, "warmup_steps": steps},
            f"{target} ({name}, warmup_steps={steps} optimizer steps)")


def _critic(raw: dict[str, Any], out: Translator, updates_per_step: int, max_steps: Any) -> None:
    """NeMo RL's ``value`` section and PPO's GAE lambdas: what several keys decide together
    (``max_steps``: ``ppo.max_num_steps``, where the critic's schedule ends too)."""
    estimator = value_at(raw, "ppo.adv_estimator") or {}
    policy_lam, lam = estimator.get("gae_lambda_policy"), estimator.get("gae_lambda")
    if policy_lam is not None:  # VAPO's decoupled GAE: the policy's lambda apart from the value targets'
        out.put("ppo.adv_estimator.gae_lambda_policy", "algorithm.ppo.lam", policy_lam)
        if lam is not None:
            out.inert("ppo.adv_estimator.gae_lambda", "gae_lambda_policy is given: it is the policy's lambda")
    else:
        if lam is not None:
            out.put("ppo.adv_estimator.gae_lambda", "algorithm.ppo.lam", lam)
        if "gae_lambda_policy" in estimator:
            out.inert("ppo.adv_estimator.gae_lambda_policy", "null: gae_lambda is the policy's lambda")
    value = raw.get("value")
    if not isinstance(value, dict):
        return
    policy = raw.get("policy") if isinstance(raw.get("policy"), dict) else {}
    name = value.get("model_name")
    if "model_name" in value:
        if name in (None, policy.get("model_name")):
            out.inert("value.model_name", "the policy's model: the critic starts from the policy's starting weights "
                                          "with a zero value head, as NeMo RL's value model does")
        else:
            out.refuse("value.model_name", f"a critic from another model ({name}) than the policy's is not translated: "
                       "corerl's critic.model_name takes a value model (a one-label token classifier)",
                       "remove it, or set critic.model_name to a value-model checkpoint in a corerl recipe")
    for key, what in (("train_global_batch_size", "trains on the policy's optimizer batches"),
                      ("max_total_sequence_length", "reads the policy's rows"),
                      ("precision", "runs in the policy's precision")):
        if key not in value:
            continue
        if value[key] in (None, policy.get(key)):
            out.inert(f"value.{key}", f"the critic {what} (the same value as policy.{key})")
        else:
            out.refuse(f"value.{key}", f"{value[key]!r} differs from policy.{key} ({policy.get(key)!r}): the critic "
                       f"{what}", f"give the policy's value or remove value.{key}")
    _scheduler(value.get("scheduler"), "value.scheduler", "critic.scheduler", out, updates_per_step, max_steps)


def _asynchronous(raw: dict[str, Any], out: Translator) -> None:
    """NeMo RL's two asynchronous forms: ``grpo.async_grpo`` (in-flight updates on or off, the KV
    cache kept or recomputed after one) and HEAD's ``async_rl`` section (its presence turns the
    asynchronous loop on). Requests in progress at an update: ``wait`` (in-flight updates off),
    ``continue`` (on, KV cache kept), ``abort`` (on, recomputed: corerl resumes each request from
    its tokens under the new weights)."""
    section = value_at(raw, "async_rl")
    if isinstance(section, dict):
        set_at(out.tree, "algorithm.async.enabled", True)
        out.new_origins["algorithm.async.enabled"] = origin_of("async_rl", out.origins) or "nemo-rl dialect"
        recompute = section.get("recompute_kv_cache_after_weight_updates")
        if "recompute_kv_cache_after_weight_updates" in section:
            out.put("async_rl.recompute_kv_cache_after_weight_updates", "algorithm.async.in_flight",
                    "abort" if recompute else "continue")
        return
    grpo = value_at(raw, "grpo.async_grpo")
    if not isinstance(grpo, dict) or not grpo.get("enabled"):
        return
    in_flight, recompute = grpo.get("in_flight_weight_updates"), grpo.get("recompute_kv_cache_after_weight_updates")
    mode = "wait" if not in_flight else "abort" if recompute else "continue"
    for key in ("in_flight_weight_updates", "recompute_kv_cache_after_weight_updates"):
        if key in grpo:
            out.put(f"grpo.async_grpo.{key}", "algorithm.async.in_flight", mode, f"algorithm.async.in_flight ({mode})")


def _dedicated_generation(raw: dict[str, Any], out: Translator) -> None:
    """NeMo RL's ``cluster`` counts generation's GPUs too: with dedicated generation, training
    gets what the generation resources leave (whole nodes on a multi-node cluster, else GPUs of
    the one node); corerl's ``cluster`` is the training workers alone."""
    colocated = value_at(raw, "policy.generation.colocated")
    if not isinstance(colocated, dict) or colocated.get("enabled") is not False:
        return
    resources = colocated.get("resources") or {}
    nodes = value_at(raw, "cluster.num_nodes") or 1
    gpus = value_at(raw, "cluster.gpus_per_node") or 1
    key = "policy.generation.colocated.resources"
    # what generation takes: whole nodes of a multi-node cluster, else GPUs of the one node
    unit, total, noun = ("num_nodes", nodes, "node") if nodes > 1 else ("gpus_per_node", gpus, "GPU")
    taken = resources.get(unit)
    if not taken or taken >= total:
        out.refuse(f"{key}.{unit}", f"{taken} generation {noun}(s) of the cluster's {total}: training needs at least "
                   f"one {noun}", f"give 1 to {total - 1} {noun}s to generation")
        return
    set_at(out.tree, f"cluster.{unit}", total - taken)
    set_at(out.tree, f"{key}.num_nodes", taken if nodes > 1 else 1)
    set_at(out.tree, f"{key}.gpus_per_node", (resources.get("gpus_per_node") or gpus) if nodes > 1 else taken)
    out.refate("policy.generation.colocated.enabled", "acts",
               "policy.generation.colocated.enabled; cluster.* less the generation resources")
