"""A model trained with sequence parallelism decodes without it: megatron-core's
``set_model_to_sequence_parallel`` turns every layer's flag off for the decoding and back on after,
an error in the decoding included. Here a CPU model at world size 1 (megatron-core's local spec
cannot be built with the flag on: its flags are set as an SP-trained model's are), in a fresh
process (megatron-core keeps process-wide parallel state); the decoding itself with tensor and
sequence parallelism on two GPUs is tests/test_megatron_generation.py's gpu class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

CHECK = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    from megatron.core.transformer.utils import set_model_to_sequence_parallel
    from corerl_megatron.conversion.convert import Shape, hf_to_megatron
    from corerl_megatron.conversion.families import family_of
    from corerl_megatron.generation.rank_decode import _without_sequence_parallel
    from corerl_megatron.training.model import build_gpt, transformer_config
    from corerl_megatron.training.parallel import init_parallel

    def flags(model):
        found = [m.sequence_parallel for m in model.modules() if hasattr(m, "sequence_parallel")]
        return sorted(set(found)), len(found), model.config.sequence_parallel

    if __name__ == "__main__":
        init_parallel(rank=0, world_size=1, tensor=1, pipeline=1)
        hf_model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
        hf = hf_model.config
        family = family_of(hf.architectures[0])
        shape = Shape.from_hf_config(hf, family)
        model = build_gpt(hf, transformer_config(hf, qkv_bias=shape.qkv_bias))
        model.load_state_dict(hf_to_megatron(dict(hf_model.state_dict()), family, shape), strict=False)
        ids = torch.randint(4, hf.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(9).expand(2, -1)
        with torch.no_grad():
            plain = model(ids, positions, attention_mask=None)
        set_model_to_sequence_parallel(model, True)  # as a model trained with sequence parallelism
        trained = flags(model)
        with _without_sequence_parallel(model):
            decoding = flags(model)
            with torch.no_grad():
                same = bool(torch.equal(model(ids, positions, attention_mask=None), plain))
        after = flags(model)
        try:
            with _without_sequence_parallel(model):
                raise KeyError("a decoding that fails")
        except KeyError:
            pass
        print(json.dumps({"trained": trained, "decoding": decoding, "after": after, "after_error": flags(model),
                          "same_logits": same}))
    """
)


def test_decoding_switches_sequence_parallelism_off_and_back_on(tmp_path):
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", family="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    script = tmp_path / "check.py"
    script.write_text(CHECK, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(model)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    trained_flags, count, trained_config = result["trained"]
    assert trained_flags == [True] and count > 4 and trained_config is True  # the layers' flags, the embedding's
    assert result["decoding"] == [[False], count, False] and result["same_logits"]
    assert result["after"] == result["after_error"] == [[True], count, True]

