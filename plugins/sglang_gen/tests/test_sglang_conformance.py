"""sglang through the generation conformance suite, on a GPU with SGLang installed
(``pip install './plugins/sglang_gen[gpu]'``): greedy and sampled tokens against transformers,
untempered logprobs, stop ids, seeds per request, refits in place. SGLang has no CPU build on
PyPI: a machine without a GPU refuses the backend (test_sglang_settings.py)."""

from __future__ import annotations

import importlib.util

import pytest

from corerl.testing.generation_conformance import GenerationBackendConformance

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                 reason="SGLang is not installed: pip install './plugins/sglang_gen[gpu]'")]


class TestSglang(GenerationBackendConformance):
    backend_id = "sglang"
    # a small engine beside whatever else the GPU holds; no CUDA graphs: the suite's engine starts once
    overrides = ["policy.generation.sglang_cfg.mem_fraction_static=0.3",
                 "policy.generation.sglang_cfg.disable_cuda_graph=true"]

    def test_the_engine_sleeps_and_wakes_with_its_weights(self, engine, model_dirs):
        """Colocated, the engine frees its GPU memory while training runs; it samples as before after
        waking (its weights come back from their host copy)."""
        from corerl.sdk import SamplingSettings
        from corerl.testing.generation_conformance import PROMPTS

        sampling = SamplingSettings(temperature=0.0, max_new_tokens=8, stop_token_ids=(3,))
        before = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        engine.sleep()
        engine.wake()
        assert [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)] == before
