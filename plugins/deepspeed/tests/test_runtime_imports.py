"""What a DeepSpeed rank imports (:mod:`corerl_deepspeed.runtime`): MLflow, which DeepSpeed's
autotuner imports where it is installed, stays out of the import; later it imports as usual."""

from __future__ import annotations

import sys

import pytest

from corerl_deepspeed.runtime import not_importable


def test_a_module_is_not_importable_inside_the_block_and_imports_after(tmp_path, monkeypatch):
    (tmp_path / "corerl_probe_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with not_importable("corerl_probe_module"):
        with pytest.raises(ImportError):
            import corerl_probe_module  # noqa: F401
    assert "corerl_probe_module" not in sys.modules
    import corerl_probe_module

    assert corerl_probe_module.VALUE == 7
    monkeypatch.delitem(sys.modules, "corerl_probe_module")


def test_a_module_imported_already_stays_importable(monkeypatch):
    with not_importable("json"):
        import json

        assert json.dumps([1]) == "[1]"
    assert sys.modules["json"] is json


def test_the_block_restores_the_import_when_it_raises(tmp_path, monkeypatch):
    (tmp_path / "corerl_probe_other.py").write_text("VALUE = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError), not_importable("corerl_probe_other"):
        raise RuntimeError("an import of DeepSpeed that failed")
    import corerl_probe_other

    assert corerl_probe_other.VALUE == 8
    monkeypatch.delitem(sys.modules, "corerl_probe_other")
