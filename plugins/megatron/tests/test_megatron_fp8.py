"""FP8 training on megatron (``policy.megatron_cfg.fp8_cfg``, NeMo RL's key of that name): on a GPU
with Transformer Engine, megatron-core runs Transformer Engine's layers' matrix multiplications in
FP8. The logprobs move off the bfloat16 run's by FP8's rounding and stay near them, and a step
trains to finite weights. Where the machine cannot run it the refusal is one line at the key
(tests/test_megatron_options.py, tests/test_nemo_rl_keys_act.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corerl.testing.conformance import TrainingBackendConformance

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MEGATRON = ["policy.megatron_cfg.enabled=true", "cluster.gpus_per_node=1", "policy.precision=bfloat16"]


class _Layout(TrainingBackendConformance):
    backend_id = "megatron"


def test_fp8_matrix_multiplications_stay_near_the_bfloat16_run_and_train(tmp_path: Path) -> None:
    import torch

    from corerl.models.tiny import build_tiny_model
    from corerl.testing.conformance.inputs import conformance_batch, conformance_loss
    from corerl.testing.reference import at_loss_positions, max_diff

    pytest.importorskip("transformer_engine", reason="FP8 training runs in Transformer Engine's layers")
    # FP8 GEMMs want dimensions divisible by 16
    model_dir = str(build_tiny_model(tmp_path / "m", family="llama", hidden_size=256, num_layers=2, num_heads=4,
                                     num_kv_heads=2, vocab_size=256))
    batch = conformance_batch(rows=8, length=32, vocab=256)
    found = {}
    for fp8 in (False, True):
        _, engine = _Layout._build(model_dir, tmp_path / str(fp8), [
            *MEGATRON, f"policy.megatron_cfg.fp8_cfg.enabled={str(fp8).lower()}",
            "policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise"])
        try:
            engine.load_hf(model_dir)
            found[fp8] = at_loss_positions(engine.logprobs(batch), batch)
            engine.train_step(batch, conformance_loss)
            assert all(torch.isfinite(t).all() for _, t in engine.weight_stream())
        finally:
            engine.shutdown()
    gap = max_diff(found[True], found[False])
    print(f"\nFP8 (e4m3, tensorwise) logprobs vs bfloat16: max |difference| {gap:.3g}")
    assert 0 < gap < 0.5
