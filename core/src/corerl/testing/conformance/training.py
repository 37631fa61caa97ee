"""The training suite: :class:`TrainingBackendConformance`, the class a backend's layouts subclass,
composed of the checks' mixins: the policy's (:class:`TrainingChecks`: (a)-(i), (k) and (g), here),
the critic's (:class:`~corerl.testing.conformance.critic.CriticChecks`, (j)) and LoRA's
(:class:`~corerl.testing.conformance.lora.LoraChecks`, (l)). The checks are listed in
:mod:`corerl.testing.conformance`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.testing.conformance.critic import CriticChecks
from corerl.testing.conformance.inputs import (
    GRPO_LOSS_VARIANTS,
    MAX_GRAD_NORM,
    MOMENTUM,
    conformance_batch,
    conformance_loss,
    dpo_conformance_loss,
    grpo_conformance_batch,
    grpo_conformance_loss,
    preference_conformance_batch,
    save_load_continue,
)
from corerl.testing.conformance.layout import TrainingLayout
from corerl.testing.conformance.lora import LoraChecks
from corerl.testing.contract_versions import (
    CANDIDATE_LOGPROBS,
    LOSS_METRICS,
    OFFLOAD_MOVES_STATE,
    TOPK_LOGPROBS,
    Requirement,
)
from corerl.testing.offload_check import offload_round_trip
from corerl.testing.reference import (
    at_loss_positions,
    hf_logprobs,
    hf_topk,
    loss_positions,
    max_diff,
    reference_gradients,
    reference_sgd_step,
)

#: a bf16 run's logprobs must differ from the fp32 reference by more than this many times the fp32
#: ``tolerance``: a backend that ignores ``policy.precision=bfloat16`` computes within it
BF16_MIN_FACTOR = 10

#: contract 2.15: ``policy.precision=bfloat16`` computes in bf16 (the lower bound of the bf16 check)
BF16_COMPUTE = Requirement(
    "computing in policy.precision=bfloat16", "2.15",
    "cast the model to the recipe's policy.precision or autocast its forward to it (the backend "
    "template's worker does); where the engine cannot compute in bf16, refuse the recipe at policy.precision (EngineNotAvailable "
    "on this machine, ConfigError in this layout) or set bf16_tolerance = None on that conformance class")

#: the checks :attr:`TrainingChecks.algorithm_checks` governs
_ALGORITHM_VARIANT_CHECKS = frozenset({"test_grpo_loss_variants_match_plain_pytorch",
                                       "test_topk_distillation_matches_plain_pytorch"})


class TrainingChecks(TrainingLayout):
    """The policy's checks of the training suite, (a)-(i), (k) and (g): a mixin of
    :class:`TrainingBackendConformance`, whose layouts set its flags."""

    #: the token-budget micro-batch layouts checked by (g)
    micro_batch_layouts: ClassVar[tuple[str, ...]] = ("packed", "dynamic")
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

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """The checks this layout's flags leave out (:class:`ConformanceLayout`): (c) at world size
        1, (d)'s Adam variant without ``adam_overrides`` or above world size 1, bf16 with
        ``bf16_tolerance = None`` or above world size 1, (i)'s algorithm variants with
        ``algorithm_checks = False``, (g)'s layouts not in ``micro_batch_layouts``, and (k)'s section
        check for a registration without a section."""
        if cls._suite_check(test, TrainingChecks):
            reason = cls._policy_check_deselected(test, params)
            if reason is not None:
                return reason
        return super().conformance_deselected(test, params)

    @classmethod
    def _policy_check_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
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
        if test == "test_enabling_the_section_selects_the_backend":
            registration = cls._registration_or_none()
            if registration is not None and registration.config_section is None:
                return f"{cls.backend_id} has no config section to enable"
        return None

    # -- (a) ---------------------------------------------------------------------------

    def test_logprobs_match_transformers(self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForCausalLM

        backend.load_hf(model_dir)
        ours = backend.logprobs(batch)
        reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
        assert ours.shape == batch["input_ids"].shape
        assert max_diff(at_loss_positions(ours, batch), reference) <= self.tolerance

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
        moved = max(max_diff(weights[n], p) for n, p in ref_params.items())
        assert moved <= self.tolerance, f"weights differ from the reference by {moved:.3g}"
        # (k) the loss's metrics come back summed over micro-batches and ranks (each counts its
        # micro-batch's loss tokens)
        loss_tokens = self._contract().metric(result.metrics, "loss_tokens", LOSS_METRICS)
        assert loss_tokens == float(batch["loss_mask"][:, 1:].sum())
        # (k) one offload then reload: it leaves the engine computing the same logprobs, and
        # state_bytes() (where there is one) reports every rank, each holding parameters and optimizer state
        trip = offload_round_trip(backend, batch, ("optimizer", "parameters"))
        trip.assert_unchanged(self.tolerance)
        if trip.back is not None:
            assert len(trip.back) == backend.conformance_world_size
            assert all(rank["parameters"] > 0 and rank["optimizer"] > 0 for rank in trip.back), trip.back
        # contract 2.15, of the same round trip: the offload moved the state (0 bytes held on the ranks'
        # device meanwhile, the GPU memory freed), and the reload brought back what left
        try:
            trip.assert_state_moved()
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
            assert max_diff(at_loss_positions(backend.logprobs(batch), batch),
                            at_loss_positions(single.logprobs(batch), batch)) <= self.tolerance
            for _ in range(2):
                ours, theirs = backend.train_step(batch, conformance_loss), single.train_step(batch, conformance_loss)
                assert abs(ours.loss - theirs.loss) <= self.tolerance
                assert abs(ours.grad_norm - theirs.grad_norm) <= self.tolerance * max(1.0, theirs.grad_norm)
            ours_w, theirs_w = dict(backend.weight_stream()), dict(single.weight_stream())
            assert ours_w.keys() == theirs_w.keys()
            assert max(max_diff(ours_w[n], theirs_w[n]) for n in ours_w) <= self.tolerance
        finally:
            single.shutdown()

    def _single_rank_overrides(self) -> list[str]:
        """Overrides that turn this layout's parallelism off (world size 1); extend for your sections."""
        return []

    # -- (d) ---------------------------------------------------------------------------

    def test_save_load_continue_equals_uninterrupted(
        self, backend: Any, model_dir: str, batch: dict[str, torch.Tensor], tmp_path: Path
    ) -> None:
        straight, straight_w, resumed, resumed_w = save_load_continue(
            backend, model_dir, batch, conformance_batch(seed=1), tmp_path / "ckpt")
        for a, b in zip(straight, resumed, strict=True):
            assert (a.step, a.lr) == (b.step, b.lr)
            assert abs(a.loss - b.loss) <= self.tolerance
        assert max(max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

    def test_adam_state_survives_save_and_load(self, model_dir: str, tmp_path: Path) -> None:
        """(d) with Adam(W): its moments and step counts come back from the checkpoint."""
        self._skip_if_deselected("test_adam_state_survives_save_and_load")
        _, engine = self._build(model_dir, tmp_path, list(self.adam_overrides))
        try:
            straight, straight_w, resumed, resumed_w = save_load_continue(
                engine, model_dir, conformance_batch(seed=0), conformance_batch(seed=1), tmp_path / "adam")
        finally:
            engine.shutdown()
        assert max(abs(a.loss - b.loss) for a, b in zip(straight, resumed, strict=True)) <= self.tolerance
        assert max(max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

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
        diff = max_diff(at_loss_positions(ours, batch), reference)
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
        assert max_diff(hf_logprobs(exported, batch), at_loss_positions(backend.logprobs(batch), batch)) <= self.tolerance
        original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert max_diff(hf_logprobs(original, batch), at_loss_positions(backend.logprobs(batch), batch)) > self.tolerance
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
        inside = loss_positions(batch)[:, 1:].bool()  # where a student's loss reads the teacher's top-k
        assert top.shape == ids.shape == (*batch["input_ids"].shape, k)
        assert (at_loss_positions(logprobs, batch) - expected["tokens"]).abs().max() <= self.tolerance
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
        moved = max(max_diff(weights[n], p) for n, p in ref_params.items())
        assert moved <= self.tolerance, f"{label} step: weights differ from the reference by {moved:.3g}"
        return result

    # -- (k) ---------------------------------------------------------------------------

    def test_enabling_the_section_selects_the_backend(self, model_dir: str, tmp_path: Path) -> None:
        self._skip_if_deselected("test_enabling_the_section_selects_the_backend")
        registration = self._registration()
        _, selection = self._select(model_dir, tmp_path, ["policy.training_backend=null",
                                                           f"{registration.config_section}.enabled=true"])
        assert selection.training_backend.id == self.backend_id, selection.training_backend.reason

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
            assert max_diff(at_loss_positions(engine.logprobs(batch), batch), reference) <= self.tolerance

            result = engine.train_step(batch, conformance_loss)
            ref_loss, (ref_norm, ref_grads), _ = reference_gradients(
                model_dir, batch, conformance_loss, max_grad_norm=MAX_GRAD_NORM, unpadded=True)
            assert abs(result.loss - ref_loss) <= self.tolerance
            assert abs(result.grad_norm - ref_norm) <= self.tolerance * max(1.0, ref_norm)
            # SGD's first step with momentum moves each weight by lr x its clipped gradient
            after = dict(engine.weight_stream())
            worst = max(max_diff((original[n] - after[n]) / result.lr, g) for n, g in ref_grads.items())
            assert worst <= self.tolerance, f"gradients differ from the unpadded reference by {worst:.3g}"
            self._check_dpo_step(engine, model_dir, unpadded=True)  # (i): pairs kept whole in this layout
        finally:
            engine.shutdown()
        if layout == "packed":  # (j), sequences packed, where the suite checks a critic
            self._check_packed_critic(model_dir, tmp_path, section)


class TrainingBackendConformance(LoraChecks, CriticChecks, TrainingChecks):
    """Base class of a backend's conformance tests; set ``backend_id`` and ``overrides``.

    The checks come from its mixins (listed last first: pytest collects a base class's tests
    before a subclass's, so they run as (a)-(i), (k), (g), then (j), then (l)), each with the
    flags that leave its checks out of a layout: :class:`TrainingChecks` (``micro_batch_layouts``,
    ``algorithm_checks``, ``adam_overrides``, ``bf16_tolerance``),
    :class:`~corerl.testing.conformance.critic.CriticChecks` (``critic_checks``) and
    :class:`~corerl.testing.conformance.lora.LoraChecks` (``lora_checks``); the model and the
    ``tolerance`` are :class:`~corerl.testing.conformance.layout.TrainingLayout`'s."""
