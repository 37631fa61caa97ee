"""The mixture-of-experts checks (m1)-(m5): :class:`MoeConformance`, a class of its own beside a
backend's :class:`~corerl.testing.conformance.TrainingBackendConformance` layouts."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.testing.conformance.inputs import (
    MAX_GRAD_NORM,
    MOMENTUM,
    conformance_batch,
    conformance_loss,
    save_load_continue,
)
from corerl.testing.conformance.layout import BackendLayout
from corerl.testing.contract_versions import ROUTER_METRICS
from corerl.testing.reference import at_loss_positions, hf_logprobs, max_diff

#: the checks that need a mixture-of-experts engine (a registration with ``moe=True``)
_MOE_ENGINE_CHECKS = frozenset({"test_moe_logprobs_match_transformers",
                                "test_moe_step_with_router_terms_matches_plain_pytorch",
                                "test_moe_step_reports_the_routers_metrics",
                                "test_moe_weight_stream_and_export_load_into_transformers",
                                "test_moe_save_load_continue_equals_uninterrupted"})


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
        assert max_diff(at_loss_positions(moe_backend.logprobs(batch), batch), reference) <= self.tolerance

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
            assert max_diff(ref_params[gate], plain[gate]) > 100 * self.step_tolerance
        assert abs(result.loss - ref_loss) <= self.tolerance, (result.loss, ref_loss)
        weights = dict(moe_backend.weight_stream())
        worst, name = max((max_diff(weights[n], p), n) for n, p in ref_params.items())
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
        ours = at_loss_positions(moe_backend.logprobs(batch), batch)
        assert max_diff(hf_logprobs(exported, batch), ours) <= self.tolerance
        assert max_diff(hf_logprobs(model, batch), ours) > 100 * self.tolerance  # the step moved them

    # -- (m4) --------------------------------------------------------------------------

    def test_moe_save_load_continue_equals_uninterrupted(self, moe_backend: Any, moe_dir: str, tmp_path: Path) -> None:
        straight, straight_w, resumed, resumed_w = save_load_continue(
            moe_backend, moe_dir, conformance_batch(), conformance_batch(seed=1), tmp_path / "ckpt")
        for a, b in zip(straight, resumed, strict=True):
            assert (a.step, a.lr) == (b.step, b.lr)
            assert abs(a.loss - b.loss) <= self.tolerance
        assert max(max_diff(straight_w[n], resumed_w[n]) for n in straight_w) <= self.tolerance

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
