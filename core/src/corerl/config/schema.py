"""The core's own config sections (plugin sections are validated by their plugins' schemas).

Every key the product promises is here, typed and bounded; recipes and overrides are
structured into :class:`CorerlConfig` by :mod:`corerl.config.structure`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import attrs

from corerl.config.fields import section, setting

Precision = Literal["float32", "bfloat16", "float16"]


@attrs.define(kw_only=True)
class ClusterConfig:
    """The machines a run uses; one worker per GPU (per CPU worker slot without GPUs)."""

    num_nodes: int = setting(1, min=1, help="number of nodes")
    gpus_per_node: int = setting(1, min=1, help="workers per node: GPUs, or CPU worker processes without GPUs")
    ray_address: str | None = setting(None, help="an existing Ray cluster; unset: RAY_ADDRESS, else a local runtime")
    gpu_memory_gib: float | None = setting(None, min=0.0, min_exclusive=True,
                                           help="memory of one GPU: `corerl validate` warns when the recipe's layout "
                                                "is predicted not to fit in it (`corerl plan` ranks layouts by it)")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


@attrs.define(kw_only=True)
class ResourcesConfig:
    """Resources for dedicated (non-colocated) generation."""

    num_nodes: int | None = setting(None, min=1, help="nodes given to dedicated generation (unset: one)")
    gpus_per_node: int | None = setting(None, min=1, help="GPUs per node given to dedicated generation (on a machine without GPUs: processes)")


@attrs.define(kw_only=True)
class ColocatedConfig:
    """Whether generation shares the training workers' devices."""

    enabled: bool = setting(True, help="generation shares the training GPUs (true) or has GPUs of its own (false: see resources)")
    resources: ResourcesConfig = section(ResourcesConfig)


@attrs.define(kw_only=True)
class GenerationConfig:
    """``policy.generation``: the generation backend and its sampling settings."""

    backend: str | None = setting(None, help="generation backend id; unset: the default generation backend when its plugin is installed, else hf (`corerl plugins` lists both)")
    max_new_tokens: int = setting(128, min=1, help="tokens a completion may have (policy.max_seq_length also bounds it)")
    temperature: float = setting(1.0, min=0.0, help="sampling temperature; it shapes only which tokens are drawn: the logprobs returned and trained on are of the untempered distribution")
    top_p: float = setting(1.0, min=0.0, min_exclusive=True, max=1.0, help="nucleus sampling: keep the smallest set of tokens whose probability reaches this")
    top_k: int | None = setting(None, min=1, help="sample among the k likeliest tokens; unset: all")
    stop_strings: list[str] | None = setting(None, help="a completion ends after any of these strings (kept in it)")
    bad_words: list[str] | None = setting(None, help="words a completion never holds: each banned as the tokenizer "
                                                     "writes it alone and after a space; a generation backend that can "
                                                     "ban them does (hf does; docs/generation-backends.md lists the "
                                                     "others), another is refused in one line")
    stop_token_ids: list[int] | None = setting(None, help="a completion ends at any of these tokens, besides the model's end of sequence (generation_config.json's eos_token_id, else the tokenizer's), in training's samples and held-out evaluation's answers alike")
    ignore_eos: bool = setting(False, help="every completion runs to max_new_tokens: no token ends it (equal work in "
                               "benchmarks; stop_strings still cut it). hf never samples the stop tokens then (as "
                               "transformers' min_new_tokens does); the other backends sample them and go on")
    hf_kv_cache: Literal["auto", "dynamic", "static"] = setting(
        "auto", help="hf backend: the KV cache of generate(); auto: static on a GPU, dynamic on CPU. A shared "
        "float32 training model under bfloat16/float16 autocast decodes with the static cache through a 16-bit "
        "copy of its weights (two bytes a parameter); dynamic keeps no copy")
    colocated: ColocatedConfig = section(ColocatedConfig)


@attrs.define(kw_only=True)
class SequencePackingConfig:
    """``policy.sequence_packing``: several sequences per row, never attending across each other."""

    enabled: bool = setting(False, help="pack several sequences into one row without attention across them (results equal the unpacked run)")
    algorithm: str = setting("modified_first_fit_decreasing", help="sequence packer id")
    train_mb_tokens: int | None = setting(None, min=1, help="token budget of a training micro-batch")
    logprob_mb_tokens: int | None = setting(None, min=1, help="token budget of a logprob micro-batch")


@attrs.define(kw_only=True)
class DynamicBatchingConfig:
    """``policy.dynamic_batching``: micro-batches by token budget instead of row count, without packing."""

    enabled: bool = setting(False, help="cut micro-batches by a token budget instead of a sequence count (no packing)")
    train_mb_tokens: int | None = setting(None, min=1, help="token budget (rows x longest row) of a training micro-batch")
    logprob_mb_tokens: int | None = setting(None, min=1, help="token budget of a logprob micro-batch")


@attrs.define(kw_only=True)
class ReferenceConfig:
    """``policy.reference``: the frozen reference model of the KL penalty."""

    cpu_offload: bool = setting(False, help="keep the reference model off the accelerator except while it scores")


@attrs.define(kw_only=True)
class LoraConfig:
    """``policy.lora``: train a low-rank adapter (PEFT's LoRA) instead of the policy's weights. The
    base weights stay frozen; the KL reference is the base with the adapter switched off; refits
    send the adapter only; checkpoints hold the adapter and its optimizer state; ``final/`` is a
    PEFT adapter folder (NeMo RL's ``policy.dtensor_cfg.lora_cfg`` and ``policy.megatron_cfg.peft``
    map here; see docs/lora.md)."""

    enabled: bool = setting(False, help="train a LoRA adapter on the policy (the critic stays whole)")
    target_modules: list[str] = setting([], help="module names (or name suffixes) that get an adapter; empty with "
                                                 "match_all_linear: every linear layer but the output head")
    exclude_modules: list[str] = setting([], help="module names (or name suffixes) that never get one")
    match_all_linear: bool = setting(True, help="adapt every linear layer but the output head (target_modules "
                                                "then only narrows nothing: it is ignored)")
    dim: int = setting(8, min=1, help="the adapter's rank r")
    alpha: float = setting(32, min=0.0, min_exclusive=True, help="scaling numerator: the update is (alpha / dim) B A x")
    dropout: float = setting(0.0, min=0.0, max=1.0, help="dropout on the adapter's input")
    dropout_position: Literal["pre", "post"] = setting(
        "pre", help="pre: dropout on the adapter's input (PEFT's LoRA); post, on its output, is refused with dropout > 0")
    lora_A_init: Literal["xavier", "uniform"] = setting(  # noqa: N815 (NeMo RL's key name)
        "xavier", help="initialisation of A (B starts at zero, so a new adapter changes nothing): xavier "
                       "(normal) or uniform (PEFT's Kaiming-uniform)")


@attrs.define(kw_only=True)
class MoeConfig:
    """``policy.moe``: how a mixture-of-experts policy's router trains (ignored on a dense model,
    except that a setting that only means something for experts is refused there). Every training
    backend that takes MoE models acts on these; NeMo RL's ``policy.megatron_cfg.moe_*`` keys and
    ``freeze_moe_router`` map here (see docs/moe.md)."""

    freeze_router: bool = setting(True, help="keep each MoE layer's router weights fixed (NeMo RL's freeze_moe_router, "
                                             "on by default as there)")
    load_balancing_type: Literal["none", "aux_loss", "seq_aux_loss"] = setting(
        "none", help="the load-balancing loss: none, aux_loss (over the micro-batch's tokens, Switch-style) or "
                     "seq_aux_loss (per sequence); weighted by aux_loss_coeff")
    aux_loss_coeff: float = setting(0.0, min=0.0, help="weight of the load-balancing loss in the training loss")
    z_loss_coeff: float = setting(0.0, min=0.0, help="weight of the router z-loss (mean squared log-sum-exp of the "
                                                    "router logits)")
    router_replay: Literal["none", "r2", "r3"] = setting(
        "none", help="route training tokens as before: r2 records the experts chosen while scoring the old-policy "
                     "logprobs, r3 takes those the generation engine chose (a backend that reports them) for the old-policy "
                     "pass and training alike; none routes afresh")
    expert_bias: bool | None = setting(
        None, help="route with the router's per-expert bias (aux-loss-free balancing: GLM-4.5's "
                   "e_score_correction_bias, added to the sigmoid scores to pick the experts, not to weigh them): "
                   "unset, as the model's router does; true requires a model whose router has one; false is refused "
                   "for such a model (its routing is defined with the bias)")
    expert_bias_update_rate: float = setting(
        0.0, min=0.0, help="after each training step, move each router's per-expert bias by this much towards even "
                           "load (up for an expert that took fewer of the step's tokens than the mean, down for one "
                           "that took more: DeepSeek-V3's aux-loss-free rule); 0 keeps the checkpoint's bias. A model "
                           "whose router has that bias only, on a backend that moves it; the bias is exported with "
                           "the weights")


@attrs.define(kw_only=True)
class OffloadConfig:
    """``policy.offload``: what leaves the accelerator between phases."""

    policy: str = setting("none", help="offload policy id: none, optimizer, full, ...")


@attrs.define(kw_only=True)
class OptimizerConfig:
    """The generic optimizer (a backend may replace it with its own section)."""

    name: Literal["adamw", "adam", "sgd"] = setting("adamw", help="the optimizer (adamw, adam or sgd)")
    lr: float = setting(1e-5, min=0.0, min_exclusive=True, help="learning rate")
    weight_decay: float = setting(0.0, min=0.0, help="decoupled weight decay (AdamW) or L2 (others)")
    betas: list[float] = setting([0.9, 0.999], help="Adam's (beta1, beta2)")
    momentum: float = setting(0.0, min=0.0, help="SGD only")
    eps: float = setting(1e-8, min=0.0, min_exclusive=True, help="Adam's epsilon")


@attrs.define(kw_only=True)
class SchedulerConfig:
    """The generic learning-rate schedule."""

    name: Literal["constant", "linear", "cosine"] = setting("constant", help="the learning-rate schedule after the warm-up: constant, linear decay or cosine decay to zero")
    warmup_steps: int = setting(0, min=0, help="optimizer steps of linear warm-up from zero")


@attrs.define(kw_only=True)
class PolicyConfig:
    """``policy``: the model being trained and how it is trained and sampled."""

    model_name: str = setting(help="Hugging Face checkpoint directory, a .gguf file (converted once into corerl's model "
                                   "cache), a packaged model (smollm2-135m-instruct) or a built-in model name",
                              path=True)
    gguf_file: str | None = setting(None, help="the .gguf file inside the model_name folder to load (converted once "
                                               "into a Hugging Face folder in corerl's model cache)")
    dequantize_base_checkpoint: bool = setting(False, help="a quantised checkpoint (gpt-oss's MXFP4 experts), "
                                                           "which transformers loads for inference only: dequantise "
                                                           "it once into corerl's model cache, and train and sample "
                                                           "that copy")
    tokenizer_name: str | None = setting(None, help="a folder holding the tokenizer; unset: model_name's", path=True)
    chat_template: str | None = setting(None, help="a Jinja chat template replacing the tokenizer's own")
    chat_template_kwargs: dict[str, Any] = setting({}, help="variables the chat template is rendered with "
                                                           "(enable_thinking, reasoning_effort, ...), as "
                                                           "apply_chat_template's keyword arguments, in every prompt "
                                                           "corerl renders")
    hf_config_overrides: dict[str, Any] = setting({}, help="keys laid over the checkpoint's config.json before any "
                                                         "engine loads it (e.g. max_position_embeddings)")
    max_seq_length: int = setting(1024, min=1, help="prompt plus completion, in tokens: completions stop there; a longer prompt is refused before training")
    precision: Precision = setting("float32", help="float32, bfloat16 or float16 for the weights and compute (bfloat16 and float16 want a GPU)")
    train_micro_batch_size: int = setting(4, min=1, help="sequences per forward/backward pass; gradients accumulate over a step's micro-batches")
    logprob_micro_batch_size: int | None = setting(None, min=1, help="sequences per forward pass when scoring logprobs (no gradients)")
    max_logits_mb: int = setting(1024, min=1, help="the most memory (MiB) one forward's fp32 logits and their log-softmax "
                                 "may take (2 x 4 bytes x rows x tokens x vocabulary): micro-batches, and the hf "
                                 "backend's generate() calls, that would take more are split (a warning says so)")
    max_grad_norm: float | None = setting(1.0, min=0.0, min_exclusive=True, help="clip the gradient's global norm to this; unset: no clipping")
    training_backend: str | None = setting(None, help="training backend id; unset: chosen by priority")
    optimizer: OptimizerConfig = section(OptimizerConfig)
    scheduler: SchedulerConfig = section(SchedulerConfig)
    generation: GenerationConfig = section(GenerationConfig)
    sequence_packing: SequencePackingConfig = section(SequencePackingConfig)
    dynamic_batching: DynamicBatchingConfig = section(DynamicBatchingConfig)
    offload: OffloadConfig = section(OffloadConfig)
    reference: ReferenceConfig = section(ReferenceConfig)
    lora: LoraConfig = section(LoraConfig)
    moe: MoeConfig = section(MoeConfig)
    freeze_vision_tower: bool | None = setting(None, help="a vision-language model: keep the vision tower's weights "
                                                          "fixed (out of the optimizer); unset: frozen for RL and "
                                                          "distillation, trained for SFT (NeMo RL's default)")

    def tokenizer_path(self, model_path: str) -> str:
        """Where the tokenizer loads from: ``tokenizer_name``, unless it is unset or names the model
        itself (NeMo RL recipes say ``${policy.model_name}``), then the model's resolved folder."""
        return self.tokenizer_name if self.tokenizer_name not in (None, self.model_name) else model_path


@attrs.define(kw_only=True)
class RewardScalingConfig:
    """``algorithm.reward_scaling``: each sample's reward mapped linearly from [source_min, source_max]
    onto [target_min, target_max], clamped to the source range first (DAPO's scaling; NeMo RL's
    ``grpo.reward_scaling`` and ``ppo.reward_scaling`` map here)."""

    enabled: bool = setting(False, help="map rewards linearly from [source_min, source_max] to [target_min, target_max] (clamped)")
    source_min: float = setting(0.0, help="the reward range's low end before scaling")
    source_max: float = setting(1.0, help="the reward range's high end before scaling")
    target_min: float = setting(0.0, help="what source_min becomes")
    target_max: float = setting(1.0, help="what source_max becomes")


@attrs.define(kw_only=True)
class OverlongPenaltyConfig:
    """``algorithm.overlong_penalty``: DAPO's soft overlong punishment, added to the reward after
    scaling: 0 up to ``max_response_length - buffer_length`` completion tokens, then falling
    linearly to ``-penalty`` at ``max_response_length`` (and staying there). NeMo RL's
    ``grpo.reward_shaping`` maps here."""

    enabled: bool = setting(False, help="DAPO's soft overlong penalty on completions near policy.generation.max_new_tokens")
    buffer_length: int = setting(0, min=0, help="completion tokens over which the penalty grows")
    penalty: float = setting(1.0, min=0.0, help="the penalty at max_response_length")
    max_response_length: int | None = setting(None, min=1, help="unset: policy.generation.max_new_tokens")
    truncated_reward_factor: float | None = setting(None, min=0.0, max=1.0,
                                                    help="ProRL's stop-properly penalty: a completion cut at the "
                                                         "length limit has its reward multiplied by this (the soft "
                                                         "penalty above is then off); unset: off")


@attrs.define(kw_only=True)
class DynamicSamplingConfig:
    """``algorithm.dynamic_sampling``: DAPO's dynamic sampling (GRPO, synchronous): groups whose
    rewards are all equal teach nothing and are dropped; generation goes on over fresh prompts
    until ``algorithm.batch_size`` groups remain, at most ``max_generation_batches`` times (then
    the run stops, in one line). Groups beyond ``batch_size`` are dropped too."""

    enabled: bool = setting(False, help="DAPO's dynamic sampling: train only on groups whose rewards differ (GRPO, synchronous)")
    batch_multiplier: float = setting(1.0, min=1.0, help="prompts per generation batch, as a multiple of "
                                                          "algorithm.batch_size")
    max_generation_batches: int = setting(10, min=1, help="generation batches a step may draw; short of groups "
                                                          "then, the run stops in one line saying how many groups "
                                                          "had all-equal rewards")


@attrs.define(kw_only=True)
class AlgorithmConfig:
    """``algorithm``: which algorithm runs and its batch arithmetic."""

    name: str = setting("grpo", help="a registered algorithm id: grpo, ppo, sft, dpo (the core's), or one a plugin "
                                     "registers (corerl plugins lists them)")
    batch_size: int = setting(8, min=1, help="prompts per step (GRPO, PPO), examples per step (SFT) or pairs per "
                                             "step (DPO)")
    gradient_accumulation_steps: int = setting(1, min=1, help="optimizer steps per training step: the batch is split into this many parts")
    num_generations_per_prompt: int = setting(4, min=1, help="completions sampled per prompt (GRPO's group size)")
    max_steps: int | None = setting(10, min=1, help="training steps of the algorithm; unset: as many as "
                                                     "algorithm.max_epochs passes over the training rows take")
    max_epochs: int | None = setting(
        None, min=1, help="stop after this many passes over the task's training rows (ceil(rows / batch_size) steps "
                          "each) where that comes before max_steps; the run's steps, its learning-rate schedule's "
                          "among them, are set once the data is read. Needs a task with a fixed training set (the "
                          "dataset and preference tasks); unset: max_steps alone")
    seed: int = setting(42, min=0, help="seeds sampling, data order and initialisation (the same seed gives the same run)")
    ratio_clip_min: float = setting(0.2, min=0.0, help="PPO-clip's lower bound: the ratio is clipped to 1 - this")
    ratio_clip_max: float = setting(0.2, min=0.0, help="PPO-clip's upper bound: the ratio is clipped to 1 + this")
    ratio_clip_c: float | None = setting(None, min=1.0, min_exclusive=True,
                                         help="dual clipping: a negative-advantage token's loss is at most "
                                              "ratio_clip_c x |advantage|; unset: off")
    sequence_level_ratios: bool = setting(False, help="one importance ratio per sequence: exp of the mean log ratio "
                                                       "of its tokens (GSPO)")
    importance_sampling_correction: bool = setting(False, help="weight each token's loss by the training policy's "
                                                               "probability over the generation engine's")
    importance_weight_cap: float | None = setting(None, min=0.0, min_exclusive=True,
                                                  help="upper bound on those weights (truncated importance sampling)")
    importance_weight_min: float | None = setting(None, min=0.0, help="lower bound (icepop and seq-mask-tis)")
    importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis", "seq-mask", "seq-tis"] = setting(
        "tis", help="tis: weights capped at importance_weight_cap; icepop: tokens whose weight lies outside "
                    "[importance_weight_min, importance_weight_cap] left out; seq-mask-tis: sequences whose geometric-"
                    "mean weight lies outside those bounds left out; seq-mask: those sequences left out, the others' "
                    "tokens unweighted (a mask only); seq-tis: each sequence's tokens weighted by the product of "
                    "its ratios, capped at importance_weight_cap")
    kl_penalty: float = setting(0.0, min=0.0, help="GRPO: weight of the KL term in the loss; PPO: the KL penalty "
                                                   "folded into each token's reward")
    kl_type: Literal["k1", "k2", "k3"] = setting("k3", help="KL estimator: k1 log ratio, k2 half its square, k3 "
                                                           "exp(d)-d-1")
    kl_input_clamp: float | None = setting(None, min=0.0, min_exclusive=True, help="bound on the log ratio")
    kl_output_clamp: float | None = setting(None, min=0.0, min_exclusive=True, help="bound on the per-token KL")
    on_policy_kl_approximation: bool = setting(False, help="weight each token's KL term by exp(logprob - "
                                                           "generation logprob): an estimate of the KL under the "
                                                           "training policy, not the sampler")
    loss_aggregation: Literal["token_mean", "sequence_mean", "constant_length"] = setting(
        "token_mean", help="token_mean: the loss is the mean over an optimizer batch's loss tokens (DAPO); "
                           "sequence_mean: each sequence's token mean, averaged over sequences (the original GRPO); "
                           "constant_length: the tokens' summed loss over sequences x loss_aggregation_length, "
                           "a normaliser that does not depend on the lengths sampled (Dr. GRPO)")
    loss_aggregation_length: int | None = setting(None, min=1, help="constant_length: the length each sequence "
                                                                    "counts as; unset: "
                                                                    "policy.generation.max_new_tokens")
    token_level_loss: bool | None = setting(None, help="deprecated spelling of loss_aggregation (true: token_mean, "
                                                       "false: sequence_mean); unset: loss_aggregation decides")
    use_cispo: bool = setting(False, help="CISPO: each token's loss is -A x sg(clip(r, 1 - ratio_clip_min, 1 + "
                                          "ratio_clip_max)) x logprob, so every token keeps a gradient (the clipped "
                                          "ratio is a detached weight, not a cut-off)")
    policy_loss: Literal["clipped", "rollout_is", "sapo", "clip_cov", "kl_cov", "reinforce"] = setting(
        "clipped", help="the policy-gradient surrogate (GRPO, PPO). clipped: PPO-clip (with use_cispo, ratio_clip_c, "
                        "sequence_level_ratios); rollout_is: -A x sg(w) x logprob, w = the policy's probability over "
                        "the generation engine's where it lies within (1 - ratio_clip_min, 1 + ratio_clip_max), else "
                        "0 (GLM-5's loss for asynchronous training); sapo: -A x 4/tau x sigmoid(tau x (r - 1)), a soft "
                        "gate instead of the clip (SAPO; sapo_tau_pos, sapo_tau_neg); clip_cov: PPO-clip with a random "
                        "clip_cov_ratio share of the tokens whose advantage-logprob covariance lies in (clip_cov_lb, "
                        "clip_cov_ub) left out (Clip-Cov); kl_cov: -A x r, plus kl_cov_coef x |log r| on the "
                        "kl_cov_ratio share of tokens of largest covariance (KL-Cov); reinforce: -A x logprob, plain "
                        "REINFORCE (no ratio, no clipping)")
    sapo_tau_pos: float = setting(1.0, min=0.0, min_exclusive=True,
                                  help="policy_loss sapo: the gate's temperature on tokens with a positive advantage")
    sapo_tau_neg: float = setting(1.05, min=0.0, min_exclusive=True,
                                  help="policy_loss sapo: the gate's temperature on the other tokens")
    clip_cov_ratio: float = setting(0.0002, min=0.0, max=1.0, help="policy_loss clip_cov: the share of loss tokens "
                                                                   "left out (at least one)")
    clip_cov_lb: float = setting(1.0, help="policy_loss clip_cov: tokens left out have a covariance above this")
    clip_cov_ub: float = setting(5.0, help="policy_loss clip_cov: ... and below this")
    kl_cov_ratio: float = setting(0.2, min=0.0, max=1.0, help="policy_loss kl_cov: the share of loss tokens (at "
                                                              "least one) with the KL term")
    kl_cov_coef: float = setting(1.0, min=0.0, help="policy_loss kl_cov: the weight of that KL term")
    use_kl_in_reward: bool = setting(False, help="kl_penalty x the kl_type estimate is taken from the reward instead "
                                                 "of added to the loss. reinforce_plus_plus: from each token's "
                                                 "reward; advantages are each token's return to go, normalised over "
                                                 "the step's tokens (REINFORCE++). grpo, maxrl, batch_mean: each "
                                                 "sample's summed KL from its reward, before the baseline. PPO always "
                                                 "does this")
    advantage_estimator: Literal["grpo", "gdpo", "reinforce_plus_plus", "maxrl", "batch_mean"] = setting(
        "grpo", help="GRPO: grpo (each reward against its group, scaled by the group's std); reinforce_plus_plus: "
                     "REINFORCE++-baseline (minus the group's mean, then normalised over the step's samples); maxrl: "
                     "MaxRL (minus the group's mean, divided by that mean: 1/success-rate weighting, for rewards of 0 "
                     "or more); batch_mean: minus the mean reward of the step's samples, unscaled (one baseline for "
                     "the batch); gdpo: GDPO, each named part of the reward (an environment's reward_components, e.g. "
                     "math_multi_reward's) against its group as grpo does, the parts summed, then normalised over the "
                     "step's samples. maxrl and batch_mean take none of scale_rewards_by_std, leave_one_out_baseline, "
                     "minus_baseline")
    advantage_clip_low: float | None = setting(None, help="GRPO: advantages below this are raised to it; unset: "
                                                          "no bound")
    advantage_clip_high: float | None = setting(None, help="GRPO: advantages above this are lowered to it; unset: "
                                                           "no bound")
    seq_logprob_error_threshold: float | None = setting(
        None, min=1.0, help="GRPO: drop from the loss every sequence whose mean over its tokens of "
                            "exp(|training logprob - generation logprob|) is above this (e.g. 2: the engines' "
                            "probabilities of its tokens differ twofold on average); the training policy's logprob "
                            "pass then runs every step; logged as logprob_mismatch/seq_prob_error/* and "
                            "/seq_dropped_share; unset: every sequence trains")
    minus_baseline: bool = setting(True, help="reinforce_plus_plus: subtract the group's mean reward first")
    scale_rewards_by_std: bool = setting(True, help="divide each group's advantages by its reward standard deviation")
    leave_one_out_baseline: bool = setting(False, help="each sample's baseline is the mean of its group's other rewards")
    optimization_passes: int = setting(1, min=1, help="passes over a step's samples (more than one reuses them off-policy, clipped)")
    optimizer_batch_size: int | None = setting(None, min=1, help="GRPO: sequences per optimizer step; unset: all of a "
                                                                 "step's samples (one optimizer step per step)")
    max_rollout_turns: int | None = setting(None, min=1, help="with data.env_name: the most model turns of an episode; "
                                                              "unset: until the environment says done or "
                                                              "policy.max_seq_length is reached")
    step_wise_trajectories: bool = setting(
        False, help="GRPO with data.env_name: each model turn of an episode is trained as a row of its own, the "
                    "conversation as the chat template renders it at that turn (the prompt the model saw) followed "
                    "by the turn's tokens, every row taking its episode's advantage (computed from the episode's "
                    "reward within its prompt's group); a template that does not render a conversation as an "
                    "extension of its start (Qwen3 drops earlier turns' <think> blocks) trains as sampled. false: "
                    "an episode is one sequence, the environment's tokens out of the loss")
    step_wise_merge: bool = setting(
        False, help="with step_wise_trajectories: an episode's consecutive rows are merged where the later row's "
                    "prompt begins with the earlier row's prompt and response (the tokens between the two responses "
                    "out of the loss), so a template that renders the conversation as an extension of its start "
                    "gives one row per episode and one that does not keeps a row per break (SkyRL's "
                    "merge_stepwise_output); without step_wise_trajectories it does nothing")
    overlong_filtering: bool = setting(False, help="samples cut at the length limit are left out of the loss "
                                                   "(DAPO's overlong filtering)")
    reward_scaling: RewardScalingConfig = section(RewardScalingConfig)
    overlong_penalty: OverlongPenaltyConfig = section(OverlongPenaltyConfig)
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig)

    @property
    def aggregation(self) -> str:
        """The loss aggregation in force: ``loss_aggregation``, or what the deprecated
        ``token_level_loss`` says where it is set (the support check refuses the two disagreeing)."""
        if self.token_level_loss is None:
            return self.loss_aggregation
        return "token_mean" if self.token_level_loss else "sequence_mean"


@attrs.define(kw_only=True)
class CriticConfig:
    """``critic``: PPO's value model, a second trained group on the policy's devices. Unset keys
    follow the policy's; a ``critic.<backend>_cfg`` section (e.g. ``critic.dtensor_cfg``) gives
    the critic its own layout, replacing the policy's section of that name for the critic."""

    model_name: str | None = setting(None, help="a critic checkpoint (token classification, one label); unset: the "
                                                "policy's starting weights with a zero value head", path=True)
    training_backend: str | None = setting(None, help="training backend id; unset: the policy's, unless a "
                                                      "critic.<backend>_cfg section is enabled")
    train_micro_batch_size: int | None = setting(None, min=1, help="unset: policy.train_micro_batch_size")
    value_micro_batch_size: int | None = setting(None, min=1, help="rows per micro-batch when scoring values; "
                                                                   "unset: policy.logprob_micro_batch_size")
    max_grad_norm: float | None = setting(1.0, min=0.0, min_exclusive=True, help="clip the critic's gradient norm to this; unset: no clipping")
    value_clip: float | None = setting(0.2, min=0.0, min_exclusive=True,
                                       help="how far a value may move from the old one before the loss is clipped; "
                                            "null: unclipped")
    loss_scale: float = setting(1.0, min=0.0, min_exclusive=True, help="factor on the value loss (NeMo RL: "
                                                                       "value_loss_fn.scale)")
    optimizer: OptimizerConfig = section(OptimizerConfig)
    scheduler: SchedulerConfig = section(SchedulerConfig)


@attrs.define(kw_only=True)
class DataConfig:
    """``data``: where prompts, demonstrations and rewards come from."""

    task: str = setting("digit_echo", help="a registered task id: digit_echo, dataset, or one a plugin registers")
    reward: str | None = setting(None, help="a registered reward id or an import path pkg.module:fn; unset: the task's own")
    train_files: str | list[str] | None = setting(None, help="dataset task: JSONL, Parquet or CSV file(s); a folder: its "
                                                           "one data file, or its train split's (the file named "
                                                           "train) where it holds several", path=True)
    held_out_files: str | list[str] | None = setting(None, help="dataset task: held-out file(s); unset: cut from "
                                                                "train_files", path=True)
    held_out_size: int | None = setting(None, min=1, help="dataset task without held_out_files: rows kept out of "
                                                          "training; unset: a quarter of the rows, at most 32")
    max_train_rows: int | None = setting(None, min=1, help="dataset and preferences tasks: read only the first N rows "
                                         "of train_files, in file order, before the held-out cut; unset: every row")
    train_rows: str | list[str] | None = setting(None, help="dataset and preferences tasks: the rows of each file of "
                                              "train_files to read, a Python slice start:stop in file order (:1000 "
                                              "the first 1000, -500: the last 500, 100:200), one for every file or "
                                              "one per file; unset: every row")
    held_out_rows: str | list[str] | None = setting(None, help="dataset and preferences tasks: the rows of each file "
                                                 "of held_out_files to hold out, a slice as train_rows (one for every "
                                                 "file or one per file; the held-out files may be the training files, "
                                                 "e.g. train_rows=:50000 with held_out_rows=-500:); unset: every row")
    train_file_weights: list[float] | None = setting(None, help="dataset task: one weight per file of train_files: "
                                                     "each batch draws rows from the files in these proportions, "
                                                     "whatever their sizes (a file's rows drawn in its own epochs, "
                                                     "data.shuffle applying to each); unset: the files' rows as one "
                                                     "pool")
    full_context: bool = setting(False, help="a memory check: every training batch is made-up token sequences of the "
                                             "full context length, in place of the task's rows (SFT: "
                                             "policy.max_seq_length tokens, all trained on; GRPO and PPO: prompts "
                                             "leaving room for policy.generation.max_new_tokens, rewards 0 or 1 at "
                                             "random; set policy.generation.ignore_eos so every completion runs that "
                                             "long); held-out evaluation keeps the task's rows; what is learned "
                                             "means nothing")
    prompt_key: str = setting("prompt", help="dataset task: the prompt column: a text, or chat messages "
                                             "[{role, content}, ...] rendered as a conversation by the chat template")
    answer_key: str = setting("answer", help="dataset task: the answer column (rewards read it), or a dotted path into "
                                             "a struct column: reward_spec.ground_truth")
    response_key: str | None = setting(None, help="dataset task: the SFT response column; unset: answer_key")
    train_on: Literal["last_assistant_message", "all_assistant_messages"] | None = setting(
        None, help="dataset task: learn conversations: a row whose prompt_key column holds chat messages is trained "
                   "on its last assistant turn (last_assistant_message, the messages before it the prompt) or on "
                   "every assistant turn (all_assistant_messages, one sequence, the other turns untrained context), "
                   "each turn as the chat template renders it, no response column read; a row whose prompt is a "
                   "text takes its response column as without it; held-out prompts are the messages before the last "
                   "assistant turn, its content the answer where the row has no answer column; unset: the prompt "
                   "and response columns")
    tools_key: str | None = setting(None, help="dataset task: the column of a row's tool schemas (a list of JSON "
                                               "schemas, or a JSON text of one), passed to the chat template (its "
                                               "tools argument) with the row's chat messages; a row without it has "
                                               "none; unset: no tools")
    system_key: str | None = setting(None, help="dataset task: the column of a row's system prompt, put before its "
                                                "chat messages as a system turn where they do not start with one; a "
                                                "row without it has none; unset: no such column")
    image_key: str = setting("images", help="dataset task: the column of a row's images (one or a list: paths "
                                            "relative to the data file, bytes, or base64 text), each placed at an "
                                            "image placeholder of the prompt; a row without it is text-only")
    max_image_pixels: int | None = setting(None, min=1, help="dataset task: the most pixels (width x height) an image "
                                           "of the data may have; a larger one (or a decompression bomb) is refused, "
                                           "naming its row, before anything is written; unset: 4 x the policy's "
                                           "image processor's max_pixels")
    chosen_key: str = setting("chosen", help="preferences task: the preferred response column")
    rejected_key: str = setting("rejected", help="preferences task: the dispreferred response column")
    shuffle: bool = setting(True, help="dataset task: draw training rows in a fresh random order each epoch; false: "
                                       "in file order")
    apply_chat_template: bool | None = setting(None, help="wrap each prompt in the chat template (the dataset, "
                                                          "preferences and real tasks); unset: when the policy's "
                                                          "tokenizer has one (or policy.chat_template gives one)")
    prompt_file: str | None = setting(None, help="dataset task: a text file whose {} each prompt fills (str.format)",
                                      path=True)
    system_prompt_file: str | None = setting(None, help="dataset task: a text file holding a system prompt (a system "
                                                        "message with apply_chat_template, else the prompt's first "
                                                        "paragraph)", path=True)
    env_name: str | None = setting(None, help="an environment id (corerl plugins lists them): GRPO and PPO play "
                                              "episodes against it, its section is env.<id>; unset: one turn scored "
                                              "by the task's reward")
    hub_dataset: str | None = setting(None, help="a Hugging Face Hub dataset name (NeMo RL recipes); refused at run "
                                                 "start: nothing is downloaded, give data.train_files")


@attrs.define(kw_only=True)
class EnvConfig:
    """``env``: one section per installed environment, ``env.<id>`` (its keys are the environment's
    registration's; ``data.env_name`` picks the one a run plays)."""


@attrs.define(kw_only=True)
class LoggerConfig:
    """``logger``: one section per installed experiment logger, ``logger.<id>`` (its keys are the
    logger's registration's: ``enabled``, ``optional`` and its own)."""


@attrs.define(kw_only=True)
class SftConfig:
    """``sft``: a supervised warm start (masked next-token loss) before GRPO."""

    enabled: bool = setting(False, help="run SFT on the task's demonstrations before GRPO")
    max_steps: int = setting(20, min=1, help="SFT optimizer steps")
    batch_size: int = setting(32, min=1, help="demonstrations per SFT step")


@attrs.define(kw_only=True)
class RunConfig:
    """``run``: where a run keeps what it writes, and how it recovers from a dead or hung worker
    (:mod:`corerl.run.recovery`)."""

    output_dir: str = setting("runs", help="parent folder of run directories; a relative one is in the working "
                                           "directory (not beside the recipe)")
    name: str | None = setting(None, help="run directory name; unset: a timestamp")
    tensorboard: bool = setting(True, help="deprecated spelling of logger.tensorboard.enabled (false still switches "
                                           "TensorBoard off)")
    resume: Literal["auto", "must"] = setting(
        "auto", help="auto: resume from the last complete checkpoint, else start over; must: resume or fail")
    max_restarts: int = setting(0, min=0, help="times a run recovers by itself when a rank, an engine actor or a Ray "
                                               "node dies or a call hangs: its workers restarted from the last "
                                               "complete checkpoint (0: the run stops, rerun the command to resume)")
    collective_timeout_s: float | None = setting(
        1800.0, min=0, min_exclusive=True, help="seconds a call on a group of ranks may take before its ranks count "
                                                "as hung: killed, and recovered as a dead rank is (unset: no limit)")
    restart_wait_s: float = setting(300.0, min=0, help="seconds a recovery waits for the cluster to hold the run's "
                                                       "layout again (a node gone) before the run stops")


@attrs.define(kw_only=True)
class RewardModelConfig:
    """``reward_model``: training's samples scored by a model instead of the task's reward (GRPO,
    PPO); held-out figures and ``eval`` keep the task's own reward (:mod:`corerl.environments.model_rewards`)."""

    kind: Literal["bradley_terry", "llm_judge"] | None = setting(
        None, help="bradley_terry: a reward model's score; llm_judge: a model grading each answer; unset: the "
                   "task's reward")
    model_name: str | None = setting(None, help="bradley_terry: an rm run's final/ or reward_model/, or a one-label "
                                                "sequence classifier; llm_judge: the judge (unset: the policy itself)",
                                     path=True)
    micro_batch_size: int = setting(64, min=1, help="bradley_terry: rows per scoring forward")
    cpu_offload: bool = setting(False, help="bradley_terry: keep the reward model in CPU memory except while it scores")
    judge_template: str = setting(
        "Question: {prompt}\nAnswer: {response}\nGrade the answer from 0 to 10.\nGrade:",
        help="llm_judge: the judge's prompt; {prompt} and {response} are the decoded prompt and completion")
    judge_pattern: str = setting(r"(\d+(?:\.\d+)?)", help="llm_judge: a regular expression whose first group "
                                                          "(else whole match) is the grade")
    judge_max_score: float = setting(10.0, min=0.0, min_exclusive=True, help="llm_judge: the grade that scores 1")
    judge_max_new_tokens: int = setting(8, min=1, help="llm_judge: tokens the judge may write")

    def check(self) -> Iterator[tuple[str, str]]:
        """The judge's template names its fields, its pattern compiles; a reward model is named."""
        if self.kind == "bradley_terry" and self.model_name is None:
            yield ("reward_model.model_name", "a bradley_terry reward needs its model: an rm run's final/ or "
                                              "reward_model/ folder")
        if self.kind == "llm_judge":
            try:
                self.judge_template.format(prompt="", response="")
            except (KeyError, IndexError, ValueError) as exc:
                yield ("reward_model.judge_template", f"fields other than {{prompt}} and {{response}}, or a stray "
                                                      f"brace ({type(exc).__name__}: {exc}); write {{{{ for a brace")
            try:
                re.compile(self.judge_pattern)
            except re.error as exc:
                yield ("reward_model.judge_pattern", f"not a regular expression: {exc}")


@attrs.define(kw_only=True)
class EvalConfig:
    """``eval``: evaluation on the task's held-out set during training (and by ``corerl eval``):
    greedy reward, and over ``num_samples`` sampled completions a prompt, mean@k and pass@k."""

    every_n_steps: int | None = setting(None, min=0, help="evaluate every this many steps (and after the last); "
                                                          "unset or 0: only the held-out reward before and after training")
    at_start: bool = setting(False, help="also evaluate before the first step (logged at step 0)")
    num_samples: int = setting(4, min=1, help="sampled completions per prompt for mean@k and pass@k (k is this)")
    pass_k: int | None = setting(None, min=1, help="the k of pass@k; unset: num_samples; at most num_samples")
    temperature: float | None = setting(None, min=0.0, help="temperature of the sampled completions; unset: "
                                                             "policy.generation.temperature")
    max_prompts: int | None = setting(None, min=1, help="held-out prompts evaluated; unset: all of them")
    only: bool = setting(False, help="corerl run evaluates policy.model_name as it is on the held-out prompts and "
                                     "stops: no training, nothing written but its figures (as corerl eval does for "
                                     "a checkpoint; SkyRL's main_generate)")


@attrs.define(kw_only=True)
class CheckpointingConfig:
    """``checkpointing``: resumable checkpoints in ``<run dir>/checkpoints``."""

    enabled: bool = setting(False, help="save resumable checkpoints (the same command resumes from the last complete one)")
    save_period: int = setting(10, min=1, help="save every this many steps (and at the end)")
    keep_last: int = setting(2, min=1, help="complete checkpoints kept; older ones are deleted")
    save_by: str | float | None = setting(None, help="a wall-clock budget, DD:HH:MM:SS (or HH:MM:SS) from the run's start: "
                                             "once a step ends past it, the run saves a checkpoint and stops (resume "
                                             "with the same run.name); for schedulers' time limits")
    merge_lora_on_export: bool = setting(False, help="with policy.lora, also write the merged Hugging Face model "
                                                     "to final/merged (final/ itself is the PEFT adapter)")
    metric_name: str | None = setting(None, help="a logged metric (e.g. eval/pass@4, reward/mean) that ranks "
                                                 "checkpoints for keep_top_k; unset: the newest are kept")
    higher_is_better: bool = setting(True, help="metric_name: a higher value is a better checkpoint")
    keep_top_k: int | None = setting(None, min=1, help="with metric_name: the best this many checkpoints are kept, "
                                                       "and the newest one besides (to resume from)")


@attrs.define(kw_only=True)
class CorerlConfig:
    """A whole recipe: cluster, policy, critic, algorithm, data, env, logger, sft, run and checkpointing sections."""

    cluster: ClusterConfig = section(ClusterConfig)
    policy: PolicyConfig = setting()
    critic: CriticConfig = section(CriticConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    data: DataConfig = section(DataConfig)
    env: EnvConfig = section(EnvConfig)
    logger: LoggerConfig = section(LoggerConfig)
    sft: SftConfig = section(SftConfig)
    run: RunConfig = section(RunConfig)
    checkpointing: CheckpointingConfig = section(CheckpointingConfig)
    eval: EvalConfig = section(EvalConfig)
    reward_model: RewardModelConfig = section(RewardModelConfig)

    def check(self) -> Iterator[tuple[str, str]]:
        """Cross-field rules of the core sections: (key path, message) per problem."""
        colocated = self.policy.generation.colocated
        if not colocated.enabled and colocated.resources.gpus_per_node is None:
            yield (
                "policy.generation.colocated.resources.gpus_per_node",
                "dedicated generation (colocated.enabled=false) needs resources.gpus_per_node",
            )
        if self.policy.sequence_packing.enabled and self.policy.dynamic_batching.enabled:
            yield (
                "policy.dynamic_batching.enabled",
                "sequence packing and dynamic batching are two ways to cut micro-batches; pick one",
            )
        if self.algorithm.max_steps is None and self.algorithm.max_epochs is None:
            yield ("algorithm.max_steps", "unset, the run needs algorithm.max_epochs to know when to stop: set one")
        if (self.algorithm.max_rollout_turns or 1) > 1 and self.data.env_name is None:
            yield (
                "algorithm.max_rollout_turns",
                f"episodes of {self.algorithm.max_rollout_turns} turns need an environment to answer the turns; "
                "set data.env_name (corerl plugins lists the environments)",
            )
        low, high = self.algorithm.advantage_clip_low, self.algorithm.advantage_clip_high
        if low is not None and high is not None and low >= high:
            yield ("algorithm.advantage_clip_low", f"must be below algorithm.advantage_clip_high ({high}), got {low}")
        save_by = self.checkpointing.save_by
        if isinstance(save_by, (int, float)):  # YAML 1.1 reads unquoted 1:30:00 as a base-60 number
            yield ("checkpointing.save_by", f"YAML read the duration as the number {save_by:g}; quote it "
                                            "(save_by: '00:03:30:00')")
        elif save_by is not None and re.fullmatch(r"(\d+:){0,3}\d+(\.\d+)?", str(save_by)) is None:
            yield ("checkpointing.save_by", f"expected DD:HH:MM:SS (or HH:MM:SS), got {save_by!r}")
        if save_by is not None and not self.checkpointing.enabled:
            yield ("checkpointing.save_by", "stopping at the time budget saves a checkpoint to resume from; set "
                                            "checkpointing.enabled=true")
        yield from self.reward_model.check()
        if self.reward_model.kind is not None and self.data.env_name is not None:
            yield ("reward_model.kind", f"episodes of data.env_name={self.data.env_name!r} are scored by the "
                                        "environment; a reward model scores single-turn samples: unset one of them")
        if self.eval.pass_k is not None and self.eval.pass_k > self.eval.num_samples:
            yield ("eval.pass_k", f"pass@{self.eval.pass_k} needs at least {self.eval.pass_k} samples a prompt; "
                                  f"eval.num_samples is {self.eval.num_samples}: raise it or lower eval.pass_k")
        if self.checkpointing.keep_top_k is not None and self.checkpointing.metric_name is None:
            yield ("checkpointing.keep_top_k", "ranking checkpoints needs a metric: set checkpointing.metric_name "
                                               "(e.g. eval/pass@4 with eval.every_n_steps, or reward/mean)")
        if self.algorithm.batch_size % self.algorithm.gradient_accumulation_steps:
            yield (
                "algorithm.gradient_accumulation_steps",
                f"must divide algorithm.batch_size ({self.algorithm.batch_size}), "
                f"got {self.algorithm.gradient_accumulation_steps}",
            )

