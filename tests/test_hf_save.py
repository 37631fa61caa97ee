"""Writing a transformers model does not import DeepSpeed (corerl.models.hf_save): 1.5-2 s of CPU
in every process that writes a checkpoint, a run's driver and its exporting rank among them."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from corerl.models.hf_save import save_pretrained
from corerl.models.tiny import build_tiny_model


def test_a_model_is_written_and_reads_back_without_deepspeed_imported(tmp_path, monkeypatch):
    build_tiny_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny", dtype=torch.float32)
    # as in a process that never imported it: accelerate's unwrapping would import it again here
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    save_pretrained(model, tmp_path / "saved")
    assert "deepspeed" not in sys.modules
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


def test_once_deepspeed_is_imported_accelerate_still_looks_for_its_engines(monkeypatch):
    from accelerate.utils import imports, other

    from corerl.models.hf_save import _deepspeed_lookup_only_when_imported

    _deepspeed_lookup_only_when_imported()
    _deepspeed_lookup_only_when_imported()  # twice: the check is wrapped once
    assert other.is_deepspeed_available.__closure__[0].cell_contents is not other.is_deepspeed_available
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    assert not other.is_deepspeed_available()
    monkeypatch.undo()
    pytest.importorskip("deepspeed")  # the fast tier's DeepSpeed tests import it anyway
    assert other.is_deepspeed_available() and imports.is_deepspeed_available()
