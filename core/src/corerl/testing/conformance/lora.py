"""LoRA's check of the training suite, (l) (a mixin of
:class:`~corerl.testing.conformance.TrainingBackendConformance`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from corerl.testing.conformance.inputs import conformance_batch, conformance_loss
from corerl.testing.conformance.layout import TrainingLayout
from corerl.testing.reference import at_loss_positions, hf_logprobs, max_diff, reference_lora_steps


class LoraChecks(TrainingLayout):
    """(l): with ``policy.lora`` (a registration with ``lora=True``), two LoRA steps against two
    plain PEFT steps, the base model untouched, the refit's adapter and the exported PEFT folder;
    a registration without it is refused with ``policy.lora.enabled``, in one line."""

    #: whether (l) runs LoRA in this layout (a backend may turn it off in layouts that add nothing
    #: new for an adapter, to keep its suite short)
    lora_checks: ClassVar[bool] = True
    lora_overrides: ClassVar[list[str]] = ["policy.lora.enabled=true", "policy.lora.dim=4", "policy.lora.alpha=8"]

    @classmethod
    def conformance_deselected(cls, test: str, params: Mapping[str, Any]) -> str | None:
        """(l) with ``lora_checks = False``, for a registration with ``lora`` (without, (l) checks
        the refusal)."""
        if cls._suite_check(test, LoraChecks) and test == "test_lora_step_matches_plain_peft" and not cls.lora_checks:
            registration = cls._registration_or_none()
            if registration is None or registration.lora:  # without lora=True, (l) checks the refusal
                return "LoRA is checked in this backend's other layouts (lora_checks = False)"
        return super().conformance_deselected(test, params)

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
        worst = max(max_diff(trained[n], reference[n]) for n in reference)
        assert worst <= self.tolerance, f"the adapter differs from a plain PEFT step's by {worst:.3g}"
        assert max(max_diff(trained[n], start[n]) for n in start) > 10 * self.tolerance  # it trained
        plain = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
        assert max_diff(at_loss_positions(base, batch), plain) <= self.tolerance  # the base weights did not move
        from safetensors.torch import load_file

        exported = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
        assert exported.keys() == trained.keys()
        # the exported folder's LoRA is the recipe's: rank, scaling numerator and dropout as policy.lora says
        import json

        settings = config.core.policy.lora
        written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
        said = {"r": settings.dim, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout}
        assert {key: written.get(key) for key in said} == said, f"adapter_config.json: {written}"

