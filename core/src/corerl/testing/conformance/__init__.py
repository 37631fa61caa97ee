"""The training-backend conformance suite: subclass :class:`TrainingBackendConformance`.

Any training backend runs the same checks, on a tiny model built in code::

    from corerl.testing.conformance import TrainingBackendConformance

    class TestMyBackendWorld1(TrainingBackendConformance):
        backend_id = "mine"
        overrides = ["policy.mine_cfg.enabled=true", "cluster.gpus_per_node=1"]

One subclass per layout (world size, parallel sizes). The checks:

(a) logprobs equal a plain transformers forward within ``tolerance`` (fp32);
(b) one train step on a fixed batch gives the loss and the updated weights of a plain
    single-process PyTorch step (whole batch at once, SGD, gradient clipping);
(c) at world size > 1, logprobs, losses and weights equal the same backend at world size 1;
(d) save, load into a fresh model, continue equals uninterrupted training (with SGD's momentum,
    and in world-size-1 layouts with Adam(W)'s moments: ``adam_overrides``); in world-size-1
    layouts ``policy.precision=bfloat16`` gives logprobs within ``bf16_tolerance`` of the fp32
    reference and further from it than 10 x ``tolerance`` (a backend that ignores the precision
    fails; contract 2.15);
(e) the exported Hugging Face checkpoint loads with transformers, reproduces the logprobs,
    and carries the tokenizer;
(f) the weight stream covers every parameter with Hugging Face names and shapes;
(g) with sequence packing (the default packer) and with dynamic token-budget micro-batches,
    logprobs, the loss, the gradient norm and the (clipped) gradients equal a plain forward
    of each sequence alone, unpadded (set ``micro_batch_layouts`` to narrow this);
(h) for backends that report ``worker_devices()``: one device per rank, of a kind the machine
    has; on a GPU machine (``gpu`` mark, skipped without one) every rank computes on CUDA;
(i) DPO's pair loss (:class:`corerl.algorithms.dpo_math.DPOLoss`, whose pairs must not be split)
    gives the loss and the weights of a plain step on the whole batch, in this layout (one pair
    per micro-batch) and, in (g)'s token-budget layouts, with pairs packed or grouped by tokens;
    so do GRPO's loss variants (:data:`GRPO_LOSS_VARIANTS`: CISPO, and Dr. GRPO's constant
    normaliser, both with asymmetric ratio bounds) on a batch whose ratios are partly clipped;
(j) as PPO's critic (``role="critic"``, for a registration with ``value_model=True``; others are
    checked to be refused for PPO): values equal a plain transformers token-classification
    forward, one clipped-value-loss step gives the loss and weights of a plain PyTorch step, save,
    load and continue equals uninterrupted training, and the exported checkpoint loads as a value
    model that reproduces the values. With (g)'s packed sequences the values and the step equal
    each sequence run alone, unpadded;
(k) enabling the backend's section (without ``policy.training_backend``) selects it; the loss
    function's metrics come back summed over micro-batches and ranks; offload then reload leaves
    the engine computing the same logprobs and training on, and ``state_bytes()`` (where there is
    one) reports every rank; from contract 2.15 the offload moves the state: while offloaded the
    ranks hold 0 bytes of it on their device (on a GPU, the memory is freed), and the reload brings
    back the same bytes (:func:`corerl.testing.offload_check.check_offload_keeps_state`);
(l) with ``policy.lora`` (a registration with ``lora=True``): two LoRA steps give the losses and the
    adapter of two plain PEFT steps in PyTorch from the same starting adapter, the base model
    (the adapter switched off) still computes the starting logprobs (only adapter parameters
    moved), and the refit's adapter and the exported PEFT folder hold adapter tensors only; a
    registration without it is refused with ``policy.lora.enabled``, in one line.

A layout's class attributes say which checks it leaves to the backend's other layouts
(``algorithm_checks``, ``critic_checks``, ``lora_checks``, ``micro_batch_layouts``,
``adam_overrides``, ``bf16_tolerance``) or cannot run (the world-size-1 comparison (c) at world size
1, a critic for a registration without ``value_model``...): those are deselected, not skipped
(:class:`ConformanceLayout`, through corerl's pytest plugin); a skip means the machine cannot run
the check (no GPU, an engine refusing here) and says why.

Mixture-of-experts checks (m1-m5) are a class of their own, :class:`MoeConformance`: one more
subclass per backend (one engine for it), expert parallelism 2 at world size 2 where the
registration names its key; a backend registered without ``moe=True`` is checked to be refused.

A backend is held to the contract version its plugin states (``corerl_contract``; none stated:
the oldest this corerl loads). A check that needs what a later version added (a loss metric, the
routers' metrics, ``topk_logprobs``) is skipped for an older plugin and fails for one that states
that version, both in one line naming the metric or method, the version and how to add it
(:mod:`corerl.testing.contract_versions`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.testing.contract_versions import (
    CANDIDATE_LOGPROBS,
    LOSS_METRICS,
    OFFLOAD_MOVES_STATE,
    ROUTER_METRICS,
    TOPK_LOGPROBS,
    ContractCheck,
    Requirement,
    stated_contract,
)
from corerl.testing.offload_check import check_offload_keeps_state
from corerl.testing.reference import (
    hf_logprobs,
    hf_topk,
    reference_gradients,
    reference_lora_steps,
    reference_sgd_step,
)

LR = 0.5
MOMENTUM = 0.9
MAX_GRAD_NORM = 1.0
#: a bf16 run's logprobs must differ from the fp32 reference by more than this many times the fp32
#: ``tolerance``: a backend that ignores ``policy.precision=bfloat16`` computes within it
BF16_MIN_FACTOR = 10

#: contract 2.15: ``policy.precision=bfloat16`` computes in bf16 (the lower bound of the bf16 check)
BF16_COMPUTE = Requirement(
    "computing in policy.precision=bfloat16", "2.15",
    "cast the model to the recipe's policy.precision or autocast its forward to it (corerl_dtensor's worker "
    "does); where the engine cannot compute in bf16, refuse the recipe at policy.precision (EngineNotAvailable "
    "on this machine, ConfigError in this layout) or set bf16_tolerance = None on that conformance class")


def conformance_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
    """A policy-gradient-shaped loss: -sum(advantage * logprob) over loss tokens / normaliser."""
    weighted = logprobs * batch["advantages"] * batch["loss_mask"]
    loss = -weighted.sum() / normaliser
    return loss, {"loss_tokens": float(batch["loss_mask"][:, 1:].sum())}


def conformance_batch(rows: int = 4, length: int = 16, vocab: int = 128, seed: int = 0) -> dict[str, torch.Tensor]:
    """A fixed right-padded batch with varied lengths, a prompt/response mask and advantages."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab, (rows, length), generator=gen)
    lengths = [length - (3 * i) % 7 for i in range(rows)]
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention_mask[row, :n] = 1
    input_ids = input_ids * attention_mask
    loss_mask = attention_mask.clone()
    loss_mask[:, :5] = 0  # the "prompt"
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, length).contiguous()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "advantages": advantages}


def preference_conformance_batch(pairs: int = 4, vocab: int = 128, seed: int = 2) -> dict[str, torch.Tensor]:
    """A fixed DPO batch: ``pairs`` (prompt, chosen, rejected) of varied lengths on adjacent rows,
    with reference logprobs on the response tokens."""
    from corerl.algorithms.dpo_math import preference_batch

    gen = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> list[int]:
        return torch.randint(4, vocab, (count,), generator=gen).tolist()

    triples = [(tokens(3 + i % 3), tokens(2 + (2 * i) % 5), tokens(3 + i % 4)) for i in range(pairs)]
    batch = preference_batch(triples)
    batch["ref_logprobs"] = -torch.rand(batch["loss_mask"].shape, generator=gen) * 3 * batch["loss_mask"]
    return batch


def dpo_conformance_loss(pairs: int = 4) -> Any:
    """DPO's loss with an SFT term, over ``pairs`` pairs."""
    from corerl.algorithms.dpo_math import DPOLoss

    return DPOLoss(beta=0.5, sft_weight=0.3, pairs=pairs)


#: GRPO loss options each layout's step is checked with (i), by test id
GRPO_LOSS_VARIANTS = ("cispo", "dr_grpo")

#: the checks each flag of :class:`TrainingBackendConformance` and :class:`MoeConformance` governs
_ALGORITHM_VARIANT_CHECKS = frozenset({"test_grpo_loss_variants_match_plain_pytorch",
                                       "test_topk_distillation_matches_plain_pytorch"})
_CRITIC_ENGINE_CHECKS = frozenset({"test_critic_values_match_transformers", "test_critic_step_matches_plain_pytorch",
                                   "test_critic_save_load_continue_equals_uninterrupted",
                                   "test_critic_export_loads_as_a_value_model"})
_MOE_ENGINE_CHECKS = frozenset({"test_moe_logprobs_match_transformers",
                                "test_moe_step_with_router_terms_matches_plain_pytorch",
                                "test_moe_step_reports_the_routers_metrics",
                                "test_moe_weight_stream_and_export_load_into_transformers",
                                "test_moe_save_load_continue_equals_uninterrupted"})


def grpo_conformance_loss(variant: str) -> Any:
    """The :class:`~corerl.algorithms.grpo_math.GRPOLoss` of one of :data:`GRPO_LOSS_VARIANTS`:
    ``cispo`` (the clipped ratio a detached weight), ``dr_grpo`` (the summed token loss over rows
    x 16), each with the ratio bounded to [0.8, 1.28] (DAPO's clip-higher)."""
    from corerl.algorithms.grpo_math import GRPOLoss

    bounds = {"ratio_clip_min": 0.2, "ratio_clip_max": 0.28}
    if variant == "cispo":
        return GRPOLoss(use_cispo=True, **bounds)
    if variant == "dr_grpo":
        return GRPOLoss(loss_aggregation="constant_length", loss_aggregation_length=16, **bounds)
    raise ValueError(f"unknown GRPO loss variant {variant!r}; known: {', '.join(GRPO_LOSS_VARIANTS)}")


def grpo_conformance_batch(model_dir: str, loss_fn: Any, seed: int = 4) -> dict[str, torch.Tensor]:
    """:func:`conformance_batch` with what a GRPO loss reads: ``old_logprobs`` (the model's own
    logprobs moved by noise, so that some ratios fall outside the clip range and some inside) and
    the loss's ``aggregation_weights`` where its aggregation has any."""
    from transformers import AutoModelForCausalLM

    batch = conformance_batch()
    mask = batch["loss_mask"].float()
    current = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
    gen = torch.Generator().manual_seed(seed)
    batch["old_logprobs"] = (current + 0.3 * torch.randn(mask.shape, generator=gen)) * mask
    weights = loss_fn.aggregation_weights(batch["loss_mask"])
    if weights is not None:
        batch["aggregation_weights"] = weights
    return batch


def value_conformance_batch(rows: int = 4, seed: int = 3) -> dict[str, torch.Tensor]:
    """:func:`conformance_batch` with what the value loss reads: ``returns`` and ``old_values``."""
    batch = conformance_batch(rows=rows, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    mask = batch["loss_mask"].float()
    batch["returns"] = 0.5 * torch.randn(mask.shape, generator=gen) * mask
    batch["old_values"] = 0.3 * torch.randn(mask.shape, generator=gen) * mask
    return batch


def value_conformance_loss() -> Any:
    """PPO's clipped value loss, with a clip range both branches of the clip meet on the batch above."""
    from corerl.algorithms.ppo_math import ValueLoss

    return ValueLoss(clip=0.5)


def write_conformance_critic(model_dir: str, out: Path, seed: int = 5) -> str:
    """A value model of ``model_dir`` with a random head (so values differ from row to row)."""
    from transformers import AutoModelForTokenClassification

    from corerl.models.hf_save import save_pretrained
    from corerl.models.value_model import init_value_model

    path = init_value_model(model_dir, out)
    model = AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=gen) * 0.2)
    save_pretrained(model, path)
    return str(path)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max().item())


def _save_load_continue(engine: Any, model_dir: str, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor],
                        folder: Path) -> tuple[list[Any], dict[str, torch.Tensor], list[Any], dict[str, torch.Tensor]]:
    """(d)'s procedure: a step on ``first``, a checkpoint, then steps on ``second`` and ``first``
    straight on and again after loading the checkpoint into a fresh model and optimizer; the
    step results and weights of both."""
    engine.load_hf(model_dir)
    engine.train_step(first, conformance_loss)
    engine.save_checkpoint(str(folder))
    straight = [engine.train_step(b, conformance_loss) for b in (second, first)]
    straight_w = dict(engine.weight_stream())
    engine.load_hf(model_dir)  # a fresh model and optimizer
    engine.load_checkpoint(str(folder))
    resumed = [engine.train_step(b, conformance_loss) for b in (second, first)]
    return straight, straight_w, resumed, dict(engine.weight_stream())


#: each layout class's registration, as :meth:`BackendLayout._registration_or_none` found it
_REGISTRATIONS: dict[type, Any] = {}


class ConformanceLayout:
    """The base of every conformance class: a layout declares, through class attributes, the
    checks it does not run, and those are not collected. corerl's pytest plugin (loaded through
    the ``pytest11`` entry point, so in a plugin's own project too) asks each collected test's
    class :meth:`conformance_deselected` and deselects the test where it gives a reason; pytest
    reports them as "N deselected" (``-v`` lists each with its reason at the end). A skip is
    left for what cannot run on this machine (no GPU, an engine refusing here), saying why."""

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """Why this layout does not run the suite's check ``test`` (the test function's name)
        with ``params`` (its parametrization, e.g. ``{"layout": "packed"}``), or None where it
        runs it. A subclass adding reasons calls ``super()``; a test the subclass defines itself
        under a suite check's name is never deselected."""
        return None

    @classmethod
    def _suite_check(cls, test: str, suite: type) -> bool:
        """Whether ``test`` is ``suite``'s own check on this class (not one the subclass redefines)."""
        return test in vars(suite) and getattr(cls, test, None) is vars(suite)[test]

    def _skip_if_deselected(self, test: str, **params: Any) -> None:
        """Where corerl's pytest plugin is not loaded (``-p no:corerl``), the check deselection
        would have left out skips, with the same reason."""
        reason = type(self).conformance_deselected(test, params)
        if reason is not None:
            pytest.skip(reason)


class BackendLayout(ConformanceLayout):
    """One layout of a training backend under test (no checks of its own): ``backend_id``, the
    ``overrides`` that make the layout (world size, parallel sizes), and how the suites build a
    selection and an engine from them."""

    backend_id: ClassVar[str]
    overrides: ClassVar[list[str]] = []
    #: a plugin object to register instead of discovering installed plugins (optional)
    plugin: ClassVar[Any] = None

    @classmethod
    def _build(cls, model_dir: str, tmp_path: Path, extra: list[str], critic: bool = False) -> Any:
        """(config, engine) of this layout; ``critic``: PPO's critic (its own config and role)."""
        config, selection = cls._select(model_dir, tmp_path, [*extra, *(["algorithm.name=ppo"] if critic else [])])
        choice = selection.critic_backend if critic else selection.training_backend
        assert choice.id == cls.backend_id, choice.reason
        if critic:
            config = selection.critic_config
        return config, choice.registration.create(config=config)

    @classmethod
    def _select(cls, model_dir: str, tmp_path: Path, extra: list[str]) -> Any:
        """(config, selection) of this layout's recipe with ``extra`` overrides."""
        from corerl.testing import host_with, select_for, write_recipe

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        recipe = write_recipe(tmp_path / "conformance.yaml", {
            "policy": {
                "model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2,
                "max_grad_norm": MAX_GRAD_NORM, "training_backend": cls.backend_id,
                "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                "scheduler": {"name": "linear", "warmup_steps": 2},
                # the suite tests training backends: the core's own sampler, whatever the tiny model's head size
                "generation": {"backend": "hf"},
            },
            "critic": {  # PPO's critic (j): the same plain SGD step as the reference
                "max_grad_norm": MAX_GRAD_NORM, "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                "scheduler": {"name": "linear", "warmup_steps": 2},
            },
            "algorithm": {"max_steps": 8, "seed": 1234},
        })
        return select_for(host, recipe, [*cls.overrides, *extra])

    @classmethod
    def _registration(cls) -> Any:
        from corerl.testing import host_with

        registration = host_with(cls.plugin, f"{cls.backend_id}-under-test").training_backends.get(cls.backend_id)
        assert registration is not None, f"no training backend {cls.backend_id!r} is registered"
        return registration

    @classmethod
    def _contract(cls) -> ContractCheck:
        """The backend held to the contract version its plugin states (none: the oldest supported);
        a check that reads what a later version added fails, or skips, in one line
        (:mod:`corerl.testing.contract_versions`)."""
        from corerl.testing import host_with

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        registration = host.training_backends.get(cls.backend_id)
        assert registration is not None, f"no training backend {cls.backend_id!r} is registered"
        return ContractCheck(f"training backend {cls.backend_id!r} (plugin {registration.plugin!r})",
                             stated_contract(host, registration))

    @classmethod
    def _world_size(cls) -> int:
        """The layout's world size as its ``overrides`` set it (nodes x workers per node; 1 each unset)."""
        def last(key: str) -> int:
            sizes = [int(o.split("=", 1)[1]) for o in cls.overrides if o.startswith(f"{key}=")]
            return sizes[-1] if sizes else 1

        return last("cluster.num_nodes") * last("cluster.gpus_per_node")

    @classmethod
    def _registration_or_none(cls) -> Any:
        """The registration, or None where it cannot be found (the checks then run and fail saying
        so); looked up once per class (collection asks for each of its tests)."""
        if cls not in _REGISTRATIONS:
            try:
                _REGISTRATIONS[cls] = cls._registration()
            except Exception:  # noqa: BLE001 (collection goes on; the test names the problem when it runs)
                _REGISTRATIONS[cls] = None
        return _REGISTRATIONS[cls]


class TrainingBackendConformance(BackendLayout):
    """Base class of a backend's conformance tests; set ``backend_id`` and ``overrides``."""

    #: the tiny model's architecture family: "qwen2" (biased q/k/v, tied embeddings) or "llama" (untied)
    model_family: ClassVar[str] = "qwen2"
    tolerance: ClassVar[float] = 1e-5
    #: the token-budget micro-batch layouts checked by (g)
    micro_batch_layouts: ClassVar[tuple[str, ...]] = ("packed", "dynamic")
    #: whether (j) runs the critic in this layout (a value-model backend may turn it off in
    #: layouts that add nothing new for a critic, to keep its suite short)
    critic_checks: ClassVar[bool] = True
    #: whether (i)'s algorithm variants (the GRPO loss options, the top-k distillation step) run in
    #: this layout: they check what the backend hands the loss, which one or two layouts per
    #: backend cover, so the others may turn them off to keep the suite short
    algorithm_checks: ClassVar[bool] = True
    #: overrides that make the backend's optimizer Adam(W) for (d)'s Adam variant (world size 1
    #: layouts only; empty: skipped in this layout)
    adam_overrides: ClassVar[list[str]] = ["policy.optimizer.name=adamw", "policy.optimizer.lr=0.001"]
    #: largest logprob difference allowed between ``policy.precision=bfloat16`` and the fp32
    #: reference (bf16 keeps 8 bits of mantissa: a few thousandths on the tiny model); None: the
    #: backend does not compute in bf16 here
    bf16_tolerance: ClassVar[float | None] = 0.1
    #: whether (l) runs LoRA in this layout (a backend may turn it off in layouts that add nothing
    #: new for an adapter, to keep its suite short)
    lora_checks: ClassVar[bool] = True

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """The checks this layout's flags leave out (:class:`ConformanceLayout`): (c) at world size
        1, (d)'s Adam variant without ``adam_overrides`` or above world size 1, bf16 with
        ``bf16_tolerance = None`` or above world size 1, (i)'s algorithm variants with
        ``algorithm_checks = False``, (g)'s layouts not in ``micro_batch_layouts``, (j)'s critic
        engine checks with ``critic_checks = False`` or for a registration without
        ``value_model``, (l) with ``lora_checks = False`` (a registration with ``lora``; without,
        (l) checks the refusal), and (k)'s section check for a registration without a section."""
        if not cls._suite_check(test, TrainingBackendConformance):
            return super().conformance_deselected(test, params)
        world = cls._world_size()
        if test == "test_matches_world_size_1" and world == 1:
            return "(c) compares a layout above world size 1 with world size 1: this one is world size 1"
        if test == "test_adam_state_survives_save_and_load" and (not cls.adam_overrides or world > 1):
            return ("(d)'s Adam variant runs in world-size-1 layouts with adam_overrides"
                    + (f" (world size {world} here)" if world > 1 else " (adam_overrides is empty here)"))
        if test == "test_bfloat16_logprobs_are_close_to_float32" and (cls.bf16_tolerance is None or world > 1):
            return ("bf16 is checked in world-size-1 layouts where the backend computes in bf16"
                    + (f" (world size {world} here)" if world > 1 else " (bf16_tolerance = None here)"))
        if test in _ALGORITHM_VARIANT_CHECKS and not cls.algorithm_checks:
            return "the algorithm variants are checked in this backend's other layouts (algorithm_checks = False)"
        if test == "test_token_budget_micro_batches_match_unpadded" and params.get("layout") not in cls.micro_batch_layouts:
            return f"{cls.backend_id} does not run the {params.get('layout')} layout here (micro_batch_layouts)"
        if test in _CRITIC_ENGINE_CHECKS:
            registration = cls._registration_or_none()
            if registration is not None and not registration.value_model:
                return (f"{cls.backend_id} does not train value models (value_model=False): "
                        "test_critic_is_refused_for_ppo_unless_registered_as_a_value_model checks PPO refuses it")
            if not cls.critic_checks:
                return "the critic is checked in this backend's other layouts (critic_checks = False)"
        if test == "test_lora_step_matches_plain_peft" and not cls.lora_checks:
            registration = cls._registration_or_none()
            if registration is None or registration.lora:  # without lora=True, (l) checks the refusal
                return "LoRA is checked in this backend's other layouts (lora_checks = False)"
        if test == "test_enabling_the_section_selects_the_backend":
            registration = cls._registration_or_none()
            if registration is not None and registration.config_section is None:
                return f"{cls.backend_id} has no config section to enable"
        return super().conformance_deselected(test, params)

    # -- fixtures ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> str:
        from corerl.models.tiny import build_tiny_model

        return str(build_tiny_model(
            tmp_path_factory.mktemp("tiny-model"), family=cls.model_family, hidden_size=64, num_layers=2,
            tie_word_embeddings=cls.model_family == "qwen2",
        ))

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        config, backend = cls._build(model_dir, tmp_path_factory.mktemp("recipe"), [])
        backend.conformance_world_size = config.core.cluster.world_size
        try:
            yield backend
        finally:
            backend.shutdown()

    @pytest.fixture
    def batch(self) -> dict[str, torch.Tensor]:
        return conformance_batch()

    # -- (a) ---------------------------------------------------------------------------

    def test_logprobs_match_transformers(self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForCausalLM

        backend.load_hf(model_dir)
        ours = backend.logprobs(batch)
        reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
        assert ours.shape == batch["input_ids"].shape
        assert _max_diff(ours, reference) <= self.tolerance

    # -- (b) ---------------------------------------------------------------------------

    def test_train_step_matches_plain_pytorch(self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor]) -> None:
        backend.load_hf(model_dir)
        result = backend.train_step(batch, conformance_loss)
        ref_loss, ref_params = reference_sgd_step(
            model_dir, batch, conformance_loss, lr=result.lr, momentum=MOMENTUM, max_grad_norm=MAX_GRAD_NORM
        )
        assert result.step == 1 and result.tokens == int(batch["loss_mask"][:, 1:].sum())
        assert abs(result.loss - ref_loss) <= self.tolerance
        weights = dict(backend.weight_stream())
        moved = max(_max_diff(weights[n], p) for n, p in ref_params.items())
        assert moved <= self.tolerance, f"weights differ from the reference by {moved:.3g}"
        # (k) the loss's metrics come back summed over micro-batches and ranks (each counts its
        # micro-batch's loss tokens), and offload then reload leaves the engine as it was
        loss_tokens = self._contract().metric(result.metrics, "loss_tokens", LOSS_METRICS)
        assert loss_tokens == float(batch["loss_mask"][:, 1:].sum())
        before = backend.logprobs(batch)
        backend.offload(["optimizer", "parameters"])
        backend.reload(["optimizer", "parameters"])
        assert _max_diff(backend.logprobs(batch), before) <= self.tolerance
        if hasattr(backend, "state_bytes"):
            ranks = backend.state_bytes()
            assert len(ranks) == backend.conformance_world_size
            assert all(rank["parameters"] > 0 and rank["optimizer"] > 0 for rank in ranks), ranks
        # contract 2.15: the offload moved the state (0 bytes held on the ranks' device meanwhile, the
        # GPU memory freed), and the reload brought back what left
        try:
            check_offload_keeps_state(backend, batch, self.tolerance)
        except AssertionError as exc:
            self._contract().missing(f"offload: {str(exc).splitlines()[0]}", OFFLOAD_MOVES_STATE)

    # -- (c) ---------------------------------------------------------------------------

    def test_matches_world_size_1(self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor], tmp_path: Path) -> None:
        self._skip_if_deselected("test_matches_world_size_1")
        if backend.conformance_world_size == 1:  # world size 1 set otherwise than by cluster.* overrides
            pytest.skip("(c) compares a layout above world size 1 with world size 1: this one is world size 1")
        _, single = self._build(model_dir, tmp_path, ["cluster.num_nodes=1", "cluster.gpus_per_node=1",
                                                      *self._single_rank_overrides()])
        try:
            for engine in (backend, single):
                engine.load_hf(model_dir)
            assert _max_diff(backend.logprobs(batch), single.logprobs(batch)) <= self.tolerance
            for _ in range(2):
                ours, theirs = backend.train_step(batch, conformance_loss), single.train_step(batch, conformance_loss)
                assert abs(ours.loss - theirs.loss) <= self.tolerance
                assert abs(ours.grad_norm - theirs.grad_norm) <= self.tolerance * max(1.0, theirs.grad_norm)
            ours_w, theirs_w = dict(backend.weight_stream()), dict(single.weight_stream())
            assert ours_w.keys() == theirs_w.keys()
            assert max(_max_diff(ours_w[n], theirs_w[n]) for n in ours_w) <= self.tolerance
        finally:
            single.shutdown()

    def _single_rank_overrides(self) -> list[str]:
        """Overrides that turn this layout's parallelism off (world size 1); extend for your sections."""
        return []

    # -- (d) ---------------------------------------------------------------------------

    def test_save_load_continue_equals_uninterrupted(
        self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor], tmp_path: Path
    ) -> None:
        straight, straight_w, resumed, resumed_w = _save_load_continue(
            backend, model_dir, batch, conformance_batch(seed=1), tmp_path / "ckpt")
        for a, b in zip(straight, resumed, strict=True):
            assert (a.step, a.lr) == (b.step, b.lr)
            assert abs(a.loss - b.loss) <= self.tolerance
        assert max(_max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

    def test_adam_state_survives_save_and_load(self, model_dir: str, tmp_path: Path) -> None:
        """(d) with Adam(W): its moments and step counts come back from the checkpoint."""
        self._skip_if_deselected("test_adam_state_survives_save_and_load")
        _, engine = self._build(model_dir, tmp_path, list(self.adam_overrides))
        try:
            straight, straight_w, resumed, resumed_w = _save_load_continue(
                engine, model_dir, conformance_batch(seed=0), conformance_batch(seed=1), tmp_path / "adam")
        finally:
            engine.shutdown()
        assert max(abs(a.loss - b.loss) for a, b in zip(straight, resumed, strict=True)) <= self.tolerance
        assert max(_max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

    def test_bfloat16_logprobs_are_close_to_float32(self, model_dir: str, tmp_path: Path) -> None:
        """``policy.precision=bfloat16``: logprobs within :attr:`bf16_tolerance` of the fp32
        reference but further from it than :data:`BF16_MIN_FACTOR` x :attr:`tolerance` (what fp32
        runs are held to: a backend computing in fp32 whatever the recipe says fails), and a step
        trains to finite weights."""
        from transformers import AutoModelForCausalLM

        from corerl.errors import EngineNotAvailable

        self._skip_if_deselected("test_bfloat16_logprobs_are_close_to_float32")
        assert self.bf16_tolerance is not None
        try:
            _, engine = self._build(model_dir, tmp_path, ["policy.precision=bfloat16"])
        except EngineNotAvailable as exc:  # refused on this machine, in one line, as a run would be
            pytest.skip(f"{self.backend_id} refuses bf16 here: {exc.message}")
        batch = conformance_batch()
        try:
            engine.load_hf(model_dir)
            ours = engine.logprobs(batch)
            result = engine.train_step(batch, conformance_loss)
            weights = dict(engine.weight_stream())
        finally:
            engine.shutdown()
        reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
        diff = _max_diff(ours, reference)
        assert diff <= self.bf16_tolerance, f"bf16 logprobs differ from the fp32 reference by {diff:.3g}"
        assert abs(result.loss) < float("inf") and all(torch.isfinite(w.float()).all() for w in weights.values())
        # and further than fp32 noise: a backend that ignores policy.precision (computes in fp32) lands within the
        # fp32 tolerance; bf16's 8 bits of mantissa show at about 2e-3 on the tiny model (dtensor)
        if diff <= BF16_MIN_FACTOR * self.tolerance:
            self._contract().missing(
                f"computes within {diff:.3g} of the fp32 reference with policy.precision=bfloat16 (at most "
                f"{BF16_MIN_FACTOR} x the fp32 tolerance {self.tolerance:g}): it ignores the precision", BF16_COMPUTE)

    # -- (e) ---------------------------------------------------------------------------

    def test_exported_checkpoint_loads_and_reproduces_logprobs(
        self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor], tmp_path: Path
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        backend.load_hf(model_dir)
        backend.train_step(batch, conformance_loss)  # so the weights differ from the input checkpoint
        out = tmp_path / "export"
        backend.export_hf(str(out))
        assert list(out.glob("*.safetensors")) and (out / "config.json").exists()
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        assert _max_diff(hf_logprobs(exported, batch), backend.logprobs(batch)) <= self.tolerance
        original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert _max_diff(hf_logprobs(original, batch), backend.logprobs(batch)) > self.tolerance
        tokenizer = AutoTokenizer.from_pretrained(out)
        assert tokenizer.vocab_size == AutoTokenizer.from_pretrained(model_dir).vocab_size

    # -- (f) ---------------------------------------------------------------------------

    def test_weight_stream_covers_every_parameter(self, backend: Any, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        backend.load_hf(model_dir)
        streamed = {name: tuple(t.shape) for name, t in backend.weight_stream()}
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
        assert set(expected) <= set(streamed), f"missing: {sorted(set(expected) - set(streamed))}"
        assert set(streamed) <= set(model.state_dict()), f"not Hugging Face names: {sorted(set(streamed) - set(model.state_dict()))}"
        assert all(streamed[name] == shape for name, shape in expected.items())

    # -- (h) ---------------------------------------------------------------------------

    def test_every_rank_reports_where_it_computes(self, backend: Any) -> None:
        """(h) on any machine: ``worker_devices()`` names one device per rank, each a torch device
        of a kind this machine has (the CPU, or CUDA where torch sees a GPU)."""
        if not hasattr(backend, "worker_devices"):
            pytest.skip(f"{self.backend_id} does not report its ranks' devices (it has no worker_devices())")
        devices = backend.worker_devices()
        assert len(devices) == backend.conformance_world_size, f"one device per rank expected: {devices}"
        kinds = {"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"}
        assert all(torch.device(device).type in kinds for device in devices), devices

    @pytest.mark.gpu
    def test_ranks_compute_on_the_machines_accelerator(self, backend: Any) -> None:
        """(h) on a GPU machine (the ``gpu`` tier): every rank computes on CUDA. On a CPU this
        could only answer "cpu", so it is skipped there, saying so."""
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU (torch sees none): on a CPU every rank can only compute on the CPU")
        if not hasattr(backend, "worker_devices"):
            pytest.skip(f"{self.backend_id} does not report its ranks' devices (it has no worker_devices())")
        devices = backend.worker_devices()
        assert len(devices) == backend.conformance_world_size, f"one device per rank expected: {devices}"
        assert all(torch.device(device).type == "cuda" for device in devices), devices

    # -- (i) ---------------------------------------------------------------------------

    def test_dpo_pairs_match_plain_pytorch(self, backend: Any, model_dir: str) -> None:
        self._check_dpo_step(backend, model_dir, unpadded=False)

    def _check_dpo_step(self, engine: Any, model_dir: str, unpadded: bool) -> None:
        result = self._check_step(engine, model_dir, preference_conformance_batch(), dpo_conformance_loss(), "DPO",
                                  unpadded)
        accuracy = self._contract().metric(result.metrics, "preference_accuracy", LOSS_METRICS)
        assert 0.0 <= accuracy <= 1.0  # a mean over the step's pairs

    @pytest.mark.parametrize("variant", GRPO_LOSS_VARIANTS)
    def test_grpo_loss_variants_match_plain_pytorch(self, backend: Any, model_dir: str, variant: str) -> None:
        self._skip_if_deselected("test_grpo_loss_variants_match_plain_pytorch", variant=variant)
        loss_fn = grpo_conformance_loss(variant)
        result = self._check_step(backend, model_dir, grpo_conformance_batch(model_dir, loss_fn), loss_fn, variant)
        clipped = self._contract().metric(result.metrics, "clip_fraction", LOSS_METRICS)
        assert 0.0 < clipped < 1.0  # summed over micro-batches and ranks: a share

    def test_topk_distillation_matches_plain_pytorch(self, backend: Any, model_dir: str) -> None:
        """As a teacher, the engine's ``topk_logprobs`` give transformers' top-k next tokens and
        logprobs; as a student, its step on the mixed KL over those tokens (the backend computing
        ``candidate_logprobs``) gives the loss and weights of a plain PyTorch step."""
        from transformers import AutoModelForCausalLM

        from corerl.algorithms.distillation_math import TopKDistillationLoss

        self._skip_if_deselected("test_topk_distillation_matches_plain_pytorch")
        k = 5
        contract = self._contract()
        topk_logprobs = contract.method(backend, "topk_logprobs", TOPK_LOGPROBS)
        backend.load_hf(model_dir)
        batch = conformance_batch()
        logprobs, top, ids = topk_logprobs(batch, k)
        expected, expected_ids = hf_topk(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                         batch, k)
        inside = batch["attention_mask"][:, 1:].bool()
        assert top.shape == ids.shape == (*batch["input_ids"].shape, k)
        assert (logprobs - expected["tokens"]).abs().max() <= self.tolerance
        assert (top - expected["topk"]).abs()[:, 1:][inside].max() <= self.tolerance  # the same k values, in order
        at_ids = expected["all"].gather(-1, ids[:, 1:])[inside]  # ties aside, the same tokens: theirs at ours
        assert (at_ids - top[:, 1:][inside]).abs().max() <= self.tolerance
        gen = torch.Generator().manual_seed(7)
        mask = batch["loss_mask"].float()
        batch.update(teacher_topk_logprobs=(expected["topk"] + 0.2 * torch.randn(top.shape, generator=gen)).clamp(max=0.0),
                     candidate_ids=expected_ids, advantages=torch.randn(mask.shape, generator=gen) * mask)
        try:
            result = self._check_step(backend, model_dir, batch, TopKDistillationLoss("mixed", 0.7), "mixed KL")
        except Exception as exc:  # the loss read a column the backend did not write (on a rank: WorkerFailed)
            if "KeyError" not in f"{type(exc).__name__}: {exc}" or "'candidate_logprobs'" not in str(exc):
                raise
            contract.missing("wrote no candidate_logprobs into the micro-batches of a batch with candidate_ids",
                             CANDIDATE_LOGPROBS)
        assert contract.metric(result.metrics, "forward_kl", LOSS_METRICS) != 0.0

    def _check_step(self, engine: Any, model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, label: str,
                    unpadded: bool = False) -> Any:
        """One step of ``loss_fn`` from the starting weights gives the loss and the weights of a
        plain PyTorch step on the whole batch; the step's result."""
        engine.load_hf(model_dir)
        result = engine.train_step(batch, loss_fn)
        ref_loss, ref_params = reference_sgd_step(
            model_dir, batch, loss_fn, lr=result.lr, momentum=MOMENTUM, max_grad_norm=MAX_GRAD_NORM, unpadded=unpadded)
        assert abs(result.loss - ref_loss) <= self.tolerance, (label, result.loss, ref_loss)
        weights = dict(engine.weight_stream())
        moved = max(_max_diff(weights[n], p) for n, p in ref_params.items())
        assert moved <= self.tolerance, f"{label} step: weights differ from the reference by {moved:.3g}"
        return result

    # -- (k) ---------------------------------------------------------------------------

    def test_enabling_the_section_selects_the_backend(self, model_dir: str, tmp_path: Path) -> None:
        self._skip_if_deselected("test_enabling_the_section_selects_the_backend")
        registration = self._registration()
        _, selection = self._select(model_dir, tmp_path, ["policy.training_backend=null",
                                                           f"{registration.config_section}.enabled=true"])
        assert selection.training_backend.id == self.backend_id, selection.training_backend.reason

    # -- (j) ---------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def critic_dir(cls, model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
        return write_conformance_critic(model_dir, tmp_path_factory.mktemp("critic"))

    @pytest.fixture(scope="class")
    @classmethod
    def critic(cls, model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        reason = cls.conformance_deselected("test_critic_values_match_transformers", {})
        if reason is not None:  # deselected where corerl's pytest plugin is loaded
            pytest.skip(reason)
        _, engine = cls._build(model_dir, tmp_path_factory.mktemp("critic-recipe"), [], critic=True)
        try:
            yield engine
        finally:
            engine.shutdown()

    def test_critic_is_refused_for_ppo_unless_registered_as_a_value_model(self, model_dir: str, tmp_path: Path) -> None:
        from corerl.errors import ConfigErrors

        if self._registration().value_model:
            config, selection = self._select(model_dir, tmp_path, ["algorithm.name=ppo"])
            assert selection.critic_backend.id == self.backend_id and selection.critic_config.role == "critic"
            assert selection.critic_config.core.policy.optimizer == config.core.critic.optimizer
            return
        with pytest.raises(ConfigErrors, match="does not train value models"):
            self._select(model_dir, tmp_path, ["algorithm.name=ppo"])

    def test_critic_values_match_transformers(self, critic: Any, critic_dir: str) -> None:
        from transformers import AutoModelForTokenClassification

        from corerl.testing.reference import hf_values

        batch = value_conformance_batch()
        critic.load_hf(critic_dir)
        ours = critic.values(batch)
        reference = hf_values(AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float32), batch)
        assert ours.shape == batch["input_ids"].shape
        assert float(reference.abs().max()) > 0.01  # the random head gives values worth comparing
        assert _max_diff(ours, reference) <= self.tolerance

    def test_critic_step_matches_plain_pytorch(self, critic: Any, critic_dir: str) -> None:
        self._check_critic_step(critic, critic_dir, unpadded=False)

    def _check_critic_step(self, engine: Any, critic_dir: str, unpadded: bool) -> None:
        from transformers import AutoModelForTokenClassification

        from corerl.testing.reference import hf_values

        batch, loss_fn = value_conformance_batch(rows=8 if unpadded else 4), value_conformance_loss()
        engine.load_hf(critic_dir)
        before = {name: p.clone() for name, p in engine.weight_stream()}
        reference = hf_values(AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float32), batch,
                              unpadded=unpadded)
        assert _max_diff(engine.values(batch), reference) <= self.tolerance
        result = engine.train_step(batch, loss_fn)
        ref_loss, ref_params = reference_sgd_step(critic_dir, batch, loss_fn, lr=result.lr, momentum=MOMENTUM,
                                                  max_grad_norm=MAX_GRAD_NORM, unpadded=unpadded, critic=True)
        assert result.step == 1
        assert abs(result.loss - ref_loss) <= self.tolerance, (result.loss, ref_loss)
        assert abs(self._contract().metric(result.metrics, "value_loss", LOSS_METRICS) - ref_loss) <= self.tolerance
        weights = dict(engine.weight_stream())
        assert set(ref_params) <= set(weights), f"missing: {sorted(set(ref_params) - set(weights))}"
        # the value head's gradient sums every token's hidden state: float32 summation order
        # (micro-batches, ranks) shows there a few times more than in the policy's weights
        worst, name = max((_max_diff(weights[n], p), n) for n, p in ref_params.items())
        assert worst <= 4 * self.tolerance, f"critic step: {name} differs from the reference by {worst:.3g}"
        assert max(_max_diff(weights[n], before[n]) for n in ref_params) > 100 * self.tolerance  # the step moved them

    def test_critic_save_load_continue_equals_uninterrupted(self, critic: Any, critic_dir: str, tmp_path: Path) -> None:
        first, second = value_conformance_batch(seed=3), value_conformance_batch(seed=4)
        loss_fn = value_conformance_loss()
        critic.load_hf(critic_dir)
        critic.train_step(first, loss_fn)
        critic.save_checkpoint(str(tmp_path / "ckpt"))
        straight = [critic.train_step(b, loss_fn).loss for b in (second, first)]
        straight_values = critic.values(first)
        critic.load_hf(critic_dir)
        critic.load_checkpoint(str(tmp_path / "ckpt"))
        resumed = [critic.train_step(b, loss_fn).loss for b in (second, first)]
        assert max(abs(a - b) for a, b in zip(straight, resumed, strict=True)) <= self.tolerance
        assert _max_diff(critic.values(first), straight_values) <= self.tolerance

    def test_critic_export_loads_as_a_value_model(self, critic: Any, critic_dir: str, tmp_path: Path) -> None:
        from transformers import AutoModelForTokenClassification

        from corerl.models.value_model import is_value_model
        from corerl.testing.reference import hf_values

        batch = value_conformance_batch()
        critic.load_hf(critic_dir)
        critic.train_step(batch, value_conformance_loss())
        out = tmp_path / "critic-export"
        critic.export_hf(str(out))
        assert is_value_model(out)
        exported = AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32)
        assert _max_diff(hf_values(exported, batch), critic.values(batch)) <= self.tolerance

    # -- (g) ---------------------------------------------------------------------------

    @pytest.mark.parametrize("layout", ["packed", "dynamic"])
    def test_token_budget_micro_batches_match_unpadded(self, layout: str, model_dir: str, tmp_path: Path) -> None:
        self._skip_if_deselected("test_token_budget_micro_batches_match_unpadded", layout=layout)
        section = "sequence_packing" if layout == "packed" else "dynamic_batching"
        # budgets of a few sequences: several micro-batches per rank, sequences cut nowhere
        config, engine = self._build(model_dir, tmp_path, [
            f"policy.{section}.enabled=true", f"policy.{section}.train_mb_tokens=30",
            f"policy.{section}.logprob_mb_tokens=40",
        ])
        batch = conformance_batch(rows=8)
        try:
            engine.load_hf(model_dir)
            from transformers import AutoModelForCausalLM

            original = {name: p.clone() for name, p in engine.weight_stream()}  # copies: a stream may share storage

            reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch, unpadded=True)
            assert _max_diff(engine.logprobs(batch), reference) <= self.tolerance

            result = engine.train_step(batch, conformance_loss)
            ref_loss, (ref_norm, ref_grads), _ = reference_gradients(
                model_dir, batch, conformance_loss, max_grad_norm=MAX_GRAD_NORM, unpadded=True)
            assert abs(result.loss - ref_loss) <= self.tolerance
            assert abs(result.grad_norm - ref_norm) <= self.tolerance * max(1.0, ref_norm)
            # SGD's first step with momentum moves each weight by lr x its clipped gradient
            after = dict(engine.weight_stream())
            worst = max(_max_diff((original[n] - after[n]) / result.lr, g) for n, g in ref_grads.items())
            assert worst <= self.tolerance, f"gradients differ from the unpadded reference by {worst:.3g}"
            self._check_dpo_step(engine, model_dir, unpadded=True)  # (i): pairs kept whole in this layout
        finally:
            engine.shutdown()
        registration = self._registration()
        if registration.value_model and self.critic_checks and layout == "packed":  # (j), sequences packed
            _, critic = self._build(model_dir, tmp_path, [
                f"policy.{section}.enabled=true", f"policy.{section}.train_mb_tokens=30",
                f"policy.{section}.logprob_mb_tokens=40"], critic=True)
            try:
                self._check_critic_step(critic, write_conformance_critic(model_dir, tmp_path / "critic-model"),
                                        unpadded=True)
            finally:
                critic.shutdown()

    # -- (l) ---------------------------------------------------------------------------

    lora_overrides: ClassVar[list[str]] = ["policy.lora.enabled=true", "policy.lora.dim=4", "policy.lora.alpha=8"]

    def test_lora_step_matches_plain_peft(self, model_dir: str, tmp_path: Path) -> None:
        from corerl.errors import CorerlError

        if not self._registration().lora:  # refused at validation (``corerl validate`` and ``run`` alike), one line
            with pytest.raises(CorerlError, match=r"^policy\.lora\.enabled: [^\n]+$"):
                self._select(model_dir, tmp_path, self.lora_overrides)
            return
        self._skip_if_deselected("test_lora_step_matches_plain_peft")
        config, engine = self._build(model_dir, tmp_path, self.lora_overrides)
        batch = conformance_batch()
        try:
            engine.load_hf(model_dir)
            assert engine.adapter_only
            start = engine.adapter_weights().tensors()
            results = [engine.train_step(batch, conformance_loss) for _ in range(2)]
            trained = engine.adapter_weights().tensors()
            base = engine.base_logprobs(batch)
            engine.export_adapter(str(tmp_path / "adapter"))
        finally:
            engine.shutdown()
        from transformers import AutoModelForCausalLM

        losses, reference = reference_lora_steps(model_dir, batch, conformance_loss, config.core.policy.lora, start,
                                                 [r.lr for r in results])
        for ours, theirs in zip(results, losses, strict=True):
            assert abs(ours.loss - theirs) <= self.tolerance
        assert start.keys() == trained.keys() == reference.keys() and all(".lora_" in n for n in start)
        worst = max(_max_diff(trained[n], reference[n]) for n in reference)
        assert worst <= self.tolerance, f"the adapter differs from a plain PEFT step's by {worst:.3g}"
        assert max(_max_diff(trained[n], start[n]) for n in start) > 10 * self.tolerance  # it trained
        plain = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
        assert _max_diff(base, plain) <= self.tolerance  # the base weights did not move
        from safetensors.torch import load_file

        exported = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
        assert exported.keys() == trained.keys()
        # the exported folder's LoRA is the recipe's: rank, scaling numerator and dropout as policy.lora says
        import json

        settings = config.core.policy.lora
        written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
        said = {"r": settings.dim, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout}
        assert {key: written.get(key) for key in said} == said, f"adapter_config.json: {written}"


class MoeConformance(BackendLayout):
    """The mixture-of-experts checks (m), a class of their own beside a backend's
    :class:`TrainingBackendConformance` layouts (one engine per class, built once)::

        class TestMyBackendMoe(MoeConformance):
            backend_id = "mine"
            overrides = ["cluster.gpus_per_node=2"]

    On the suite's tiny Qwen3-MoE (:data:`corerl.testing.moe_reference.MOE_SHAPE`), with the
    router trained and both router loss terms on (:attr:`router_overrides`), and at world size
    above 1 the registration's ``expert_parallel_key`` (where it has one) set to 2 (unless
    :attr:`expert_parallel` is off):

    (m1) logprobs equal transformers' within ``tolerance``;
    (m2) one train step gives the policy loss and the weights of a plain PyTorch step whose loss
         adds the load-balancing and z-loss terms of each micro-batch
         (:func:`corerl.testing.moe_reference.reference_router_step`), and reports the step's
         ``moe/aux_loss``, ``moe/z_loss`` and each layer's ``load_min``/``load_max``/``load_entropy``
         (equal to that reference's, unless :attr:`metrics_match_reference` is off);
    (m3) the weight stream holds every parameter under transformers' in-memory names and shapes
         (fused experts; a tied head may come too), and the exported checkpoint loads into transformers with equal logprobs;
    (m4) save, load into a fresh model, continue equals uninterrupted training;
    (m5) selection takes a MoE policy on the backend, or, where its registration says
         ``moe=False``, refuses it at ``policy.training_backend`` in one line (the engine checks
         are then skipped).
    """

    tolerance: ClassVar[float] = 1e-5
    #: largest weight difference after (m2)'s step: the router's gradient sums every token's
    #: probabilities, so float32 summation order shows there a little more than elsewhere
    step_tolerance: ClassVar[float] = 2e-5
    aux_loss_coeff: ClassVar[float] = 0.5
    z_loss_coeff: ClassVar[float] = 0.05
    #: whether (m2) holds the ``moe/*`` metrics to the reference's values (a backend whose
    #: metrics count differently, say padding tokens too, sets False: they are then checked for
    #: presence and range only)
    metrics_match_reference: ClassVar[bool] = True
    #: whether a layout above world size 1 sets the registration's expert-parallel key to 2 (False:
    #: the experts are sharded as every other parameter, e.g. FSDP only)
    expert_parallel: ClassVar[bool] = True

    @classmethod
    def router_overrides(cls) -> list[str]:
        """The router trained, with both loss terms (:attr:`aux_loss_coeff`, :attr:`z_loss_coeff`)."""
        return ["policy.moe.freeze_router=false", "policy.moe.load_balancing_type=aux_loss",
                f"policy.moe.aux_loss_coeff={cls.aux_loss_coeff}", f"policy.moe.z_loss_coeff={cls.z_loss_coeff}"]

    @classmethod
    def expert_parallel_overrides(cls) -> list[str]:
        """Expert parallelism 2 at world size above 1, where the registration names its key."""
        registration = cls._registration()
        if (cls._world_size() == 1 or not cls.expert_parallel or not registration.expert_parallel_key
                or not registration.config_section):
            return []
        return [f"{registration.config_section}.{registration.expert_parallel_key}=2"]

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """(m1)-(m4) for a registration without ``moe=True``: (m5) checks it is refused."""
        if cls._suite_check(test, MoeConformance) and test in _MOE_ENGINE_CHECKS:
            registration = cls._registration_or_none()
            if registration is not None and not registration.moe:
                return (f"{cls.backend_id} does not train mixture-of-experts models (moe=False): "
                        "test_moe_policy_is_refused_unless_registered checks it is refused")
        return super().conformance_deselected(test, params)

    @pytest.fixture(scope="class")
    @classmethod
    def moe_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> str:
        from corerl.testing.moe_reference import build_moe_conformance_model

        return build_moe_conformance_model(tmp_path_factory.mktemp("tiny-moe"))

    @pytest.fixture(scope="class")
    @classmethod
    def moe_backend(cls, moe_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        reason = cls.conformance_deselected("test_moe_logprobs_match_transformers", {})
        if reason is not None:  # deselected where corerl's pytest plugin is loaded
            pytest.skip(reason)
        _, engine = cls._build(moe_dir, tmp_path_factory.mktemp("moe-recipe"),
                               [*cls.router_overrides(), *cls.expert_parallel_overrides()])
        try:
            yield engine
        finally:
            engine.shutdown()

    # -- (m1) --------------------------------------------------------------------------

    def test_moe_logprobs_match_transformers(self, moe_backend: Any, moe_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        batch = conformance_batch()
        moe_backend.load_hf(moe_dir)
        reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32), batch)
        assert _max_diff(moe_backend.logprobs(batch), reference) <= self.tolerance

    # -- (m2) --------------------------------------------------------------------------

    def _router_step(self, engine: Any, moe_dir: str) -> tuple[Any, float, dict[str, torch.Tensor], dict[str, float]]:
        """A step of ``engine`` on the conformance batch and the plain PyTorch step's loss,
        parameters and metrics, both with the router's loss terms."""
        from corerl.testing.moe_reference import reference_router_step

        batch = conformance_batch()
        engine.load_hf(moe_dir)
        result = engine.train_step(batch, conformance_loss)
        ref_loss, ref_params, ref_metrics = reference_router_step(
            moe_dir, batch, conformance_loss, micro_batch_rows=2, aux_coeff=self.aux_loss_coeff,
            z_coeff=self.z_loss_coeff, freeze_router=False, lr=result.lr, momentum=MOMENTUM, max_grad_norm=MAX_GRAD_NORM)
        return result, ref_loss, ref_params, ref_metrics

    def test_moe_step_with_router_terms_matches_plain_pytorch(self, moe_backend: Any, moe_dir: str) -> None:
        from corerl.testing.moe_reference import reference_router_step

        result, ref_loss, ref_params, _ = self._router_step(moe_backend, moe_dir)
        _, plain, _ = reference_router_step(
            moe_dir, conformance_batch(), conformance_loss, micro_batch_rows=2, aux_coeff=0.0, z_coeff=0.0,
            freeze_router=False, lr=result.lr, momentum=MOMENTUM, max_grad_norm=MAX_GRAD_NORM)
        gate = "model.layers.0.mlp.gate.weight"
        if self.aux_loss_coeff or self.z_loss_coeff:  # the terms change the step
            assert _max_diff(ref_params[gate], plain[gate]) > 100 * self.step_tolerance
        assert abs(result.loss - ref_loss) <= self.tolerance, (result.loss, ref_loss)
        weights = dict(moe_backend.weight_stream())
        worst, name = max((_max_diff(weights[n], p), n) for n, p in ref_params.items())
        assert worst <= self.step_tolerance, f"{name} differs from the plain PyTorch step's by {worst:.3g}"

    def test_moe_step_reports_the_routers_metrics(self, moe_backend: Any, moe_dir: str) -> None:
        result, _, ref_params, ref_metrics = self._router_step(moe_backend, moe_dir)
        # a loss term whose coefficient is 0 need not be computed (megatron-core skips it)
        unweighted = {key for key, coeff in (("moe/aux_loss", self.aux_loss_coeff), ("moe/z_loss", self.z_loss_coeff))
                      if not coeff}
        contract = self._contract()
        for key, expected in ref_metrics.items():
            if key in unweighted:
                continue
            contract.metric(result.metrics, key, ROUTER_METRICS)
            if self.metrics_match_reference:
                assert result.metrics[key] == pytest.approx(expected, rel=1e-4, abs=1e-6), key
        experts = int(ref_params["model.layers.0.mlp.gate.weight"].shape[0])
        layers = sorted({key.split("/")[1] for key in ref_metrics if key.startswith("moe/layer")})
        assert len(layers) == 2  # both decoder layers of the tiny model route
        for layer in layers:  # each layer's load shares: min <= 1/E <= max, entropy within (0, log E]
            low, high = result.metrics[f"moe/{layer}/load_min"], result.metrics[f"moe/{layer}/load_max"]
            assert 0 <= low <= 1 / experts <= high <= 1
            assert 0 < result.metrics[f"moe/{layer}/load_entropy"] <= math.log(experts) + 1e-6
        assert all(result.metrics[key] > 0 for key in ("moe/aux_loss", "moe/z_loss") if key not in unweighted)

    # -- (m3) --------------------------------------------------------------------------

    def test_moe_weight_stream_and_export_load_into_transformers(self, moe_backend: Any, moe_dir: str,
                                                                 tmp_path: Path) -> None:
        from transformers import AutoModelForCausalLM

        batch = conformance_batch()
        moe_backend.load_hf(moe_dir)
        moe_backend.train_step(batch, conformance_loss)  # so the weights differ from the input checkpoint
        model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
        streamed = {name: tuple(t.shape) for name, t in moe_backend.weight_stream()}
        expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
        assert any(name.endswith("mlp.experts.gate_up_proj") for name in expected)  # transformers' fused experts
        assert set(expected) <= set(streamed), f"missing: {sorted(set(expected) - set(streamed))}"
        assert set(streamed) <= set(model.state_dict()), f"not transformers' names: {sorted(set(streamed) - set(expected))}"
        assert all(streamed[name] == shape for name, shape in expected.items())
        out = tmp_path / "export"
        moe_backend.export_hf(str(out))
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        ours = moe_backend.logprobs(batch)
        assert _max_diff(hf_logprobs(exported, batch), ours) <= self.tolerance
        assert _max_diff(hf_logprobs(model, batch), ours) > 100 * self.tolerance  # the step moved them

    # -- (m4) --------------------------------------------------------------------------

    def test_moe_save_load_continue_equals_uninterrupted(self, moe_backend: Any, moe_dir: str, tmp_path: Path) -> None:
        straight, straight_w, resumed, resumed_w = _save_load_continue(
            moe_backend, moe_dir, conformance_batch(), conformance_batch(seed=1), tmp_path / "ckpt")
        for a, b in zip(straight, resumed, strict=True):
            assert (a.step, a.lr) == (b.step, b.lr)
            assert abs(a.loss - b.loss) <= self.tolerance
        assert max(_max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

    # -- (m5) --------------------------------------------------------------------------

    def test_moe_policy_is_refused_unless_registered(self, moe_dir: str, tmp_path: Path) -> None:
        from corerl.errors import CorerlError

        if self._registration().moe:
            _, selection = self._select(moe_dir, tmp_path, [*self.router_overrides(), *self.expert_parallel_overrides()])
            assert selection.training_backend.id == self.backend_id, selection.training_backend.reason
            return
        with pytest.raises(CorerlError) as refused:
            self._select(moe_dir, tmp_path, [])
        assert refused.value.key == "policy.training_backend" and "\n" not in str(refused.value).strip()
        assert "mixture-of-experts" in str(refused.value)
