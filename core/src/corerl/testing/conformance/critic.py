"""The critic's checks of the training suite, (j): PPO's critic on the backend (a mixin of
:class:`~corerl.testing.conformance.TrainingBackendConformance`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.testing.conformance.inputs import (
    MAX_GRAD_NORM,
    MOMENTUM,
    value_conformance_batch,
    value_conformance_loss,
    write_conformance_critic,
)
from corerl.testing.conformance.layout import TrainingLayout
from corerl.testing.contract_versions import LOSS_METRICS
from corerl.testing.reference import max_diff, reference_sgd_step

#: the checks that need the backend as a critic engine (:attr:`CriticChecks.critic_checks`, and a
#: registration with ``value_model=True``)
_CRITIC_ENGINE_CHECKS = frozenset({"test_critic_values_match_transformers", "test_critic_step_matches_plain_pytorch",
                                   "test_critic_save_load_continue_equals_uninterrupted",
                                   "test_critic_export_loads_as_a_value_model"})


class CriticChecks(TrainingLayout):
    """(j): as PPO's critic (``role="critic"``, for a registration with ``value_model=True``; others
    are checked to be refused for PPO), values, a clipped-value-loss step, save/load/continue and
    the export, each against plain transformers and PyTorch; in (g)'s packed layout, values and the
    step of each sequence alone."""

    #: whether (j) runs the critic in this layout (a value-model backend may turn it off in
    #: layouts that add nothing new for a critic, to keep its suite short)
    critic_checks: ClassVar[bool] = True

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """(j)'s critic engine checks with ``critic_checks = False`` or for a registration without
        ``value_model`` (whose refusal for PPO is checked instead)."""
        if cls._suite_check(test, CriticChecks) and test in _CRITIC_ENGINE_CHECKS:
            registration = cls._registration_or_none()
            if registration is not None and not registration.value_model:
                return (f"{cls.backend_id} does not train value models (value_model=False): "
                        "test_critic_is_refused_for_ppo_unless_registered_as_a_value_model checks PPO refuses it")
            if not cls.critic_checks:
                return "the critic is checked in this backend's other layouts (critic_checks = False)"
        return super().conformance_deselected(test, params)

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
        assert max_diff(ours, reference) <= self.tolerance

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
        assert max_diff(engine.values(batch), reference) <= self.tolerance
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
        worst, name = max((max_diff(weights[n], p), n) for n, p in ref_params.items())
        assert worst <= 4 * self.tolerance, f"critic step: {name} differs from the reference by {worst:.3g}"
        assert max(max_diff(weights[n], before[n]) for n in ref_params) > 100 * self.tolerance  # the step moved them

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
        assert max_diff(critic.values(first), straight_values) <= self.tolerance

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
        assert max_diff(hf_values(exported, batch), critic.values(batch)) <= self.tolerance

    def _check_packed_critic(self, model_dir: str, tmp_path: Path, section: str) -> None:
        """(j) in (g)'s packed layout: the critic's values and step equal each sequence run alone,
        unpadded (for a registration with ``value_model=True``, where ``critic_checks`` is on)."""
        registration = self._registration()
        if not (registration.value_model and self.critic_checks):
            return
        _, critic = self._build(model_dir, tmp_path, [
            f"policy.{section}.enabled=true", f"policy.{section}.train_mb_tokens=30",
            f"policy.{section}.logprob_mb_tokens=40"], critic=True)
        try:
            self._check_critic_step(critic, write_conformance_critic(model_dir, tmp_path / "critic-model"),
                                    unpadded=True)
        finally:
            critic.shutdown()
