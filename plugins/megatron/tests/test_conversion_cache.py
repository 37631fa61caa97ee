"""Where conversions are kept, reuse, reconversion, and interrupted conversions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corerl_megatron.conversion import store as conversion
from corerl_megatron.conversion.store import COMPLETE, WEIGHTS, checkpoint_root, ensure_converted


def test_the_checkpoint_root_follows_the_documented_order(tmp_path):
    assert checkpoint_root({"CORERL_MEGATRON_CHECKPOINT_DIR": "/a", "NRL_MEGATRON_CHECKPOINT_DIR": "/b"}) == Path("/a")
    assert checkpoint_root({"NRL_MEGATRON_CHECKPOINT_DIR": "/b", "HF_HOME": "/h"}) == Path("/b")
    assert checkpoint_root({"HF_HOME": "/h"}) == Path("/h/corerl")
    assert checkpoint_root({}) == Path("~/.cache/huggingface/corerl").expanduser()


@pytest.fixture
def source(tmp_path):
    from corerl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path / "model", hidden_size=32, num_layers=1)


def test_a_conversion_is_reused_redone_on_change_and_on_force(source, tmp_path):
    root = tmp_path / "converted"
    first = ensure_converted(source, root=root)
    assert (first / COMPLETE).exists() and (first / WEIGHTS).exists()
    stamp = (first / WEIGHTS).stat().st_mtime_ns
    assert ensure_converted(source, root=root) == first and (first / WEIGHTS).stat().st_mtime_ns == stamp
    forced = ensure_converted(source, root=root, force=True)
    assert forced == first and (first / WEIGHTS).stat().st_mtime_ns != stamp
    weights = next(source.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # the source changed
    changed = ensure_converted(source, root=root)
    assert changed != first and (changed / COMPLETE).exists()


def test_a_conversion_interrupted_halfway_is_not_taken_for_a_complete_one(source, tmp_path, monkeypatch):
    root = tmp_path / "converted"
    real = conversion.convert_folder

    def dies_after_writing(src, target, converter_type=None):
        real(src, target, converter_type)
        raise KeyboardInterrupt  # the weights are written, the completion marker is not

    monkeypatch.setattr(conversion, "convert_folder", dies_after_writing)
    with pytest.raises(KeyboardInterrupt):
        ensure_converted(source, root=root)
    assert not any(p.name.startswith(source.name) and (p / COMPLETE).exists() for p in root.iterdir())
    monkeypatch.setattr(conversion, "convert_folder", real)
    done = ensure_converted(source, root=root)
    assert (done / COMPLETE).exists()
    assert [p.name for p in root.iterdir()] == [done.name]  # nothing half-written left behind


def test_an_unknown_architecture_is_a_one_line_config_error(tmp_path):
    from corerl.errors import ConfigError
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1)
    with pytest.raises(ConfigError, match="no Hugging Face -> Megatron table for GPT2LMHeadModel"):
        ensure_converted(model, root=tmp_path / "c", converter_type="GPT2LMHeadModel")
