"""``corerl serve RECIPE`` with ``policy.generation.backend=vllm`` samples through vLLM, one engine on
the base model taking each request's adapter (``corerl_vllm.adapter_sampler``, the vllm backend's
``adapter_sampler``), and gives the in-process torch sampler's greedy tokens (logprobs within 1e-3)
for the base model and for two differently trained adapters asked for in turn (A, B, A), and for
an adapter exported again after a step (the same folder, new weights); an adapter on the output
projection, which vLLM does not adapt, is sampled in process. builtin:tiny-qwen2 in
float32 on the CPU; one vLLM engine for the module (it starts in tens of seconds: the slow tier).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("vllm")

from corerl.recipes import DEMO_RECIPE  # noqa: E402
from corerl.run.tinker.engine import AdamParams, LoraSpec, SampleParams, ServiceError  # noqa: E402
from corerl.run.tinker.peft_engine import PeftEngine  # noqa: E402
from corerl.run.tinker.selection import Opened, open_engine  # noqa: E402
from tests.test_tinker_engine import BASE, sft_datum  # noqa: E402

PROMPT = [2, 5, 9, 13]
#: what each adapter is taught to say after PROMPT: greedy decoding tells the adapters apart
TAUGHT = {"a": [40, 41, 42, 43, 44, 45], "b": [70, 71, 72, 73, 74, 75]}
#: learning rates that teach each adapter its continuation in 12 steps
RATES = {"a": 3e-3, "b": 1e-2}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tinker-vllm")


@pytest.fixture(scope="module")
def served_vllm(work: Path) -> Iterator[Opened]:
    opened = open_engine(str(DEMO_RECIPE), [f"policy.model_name={BASE}", "policy.precision=float32",
                                            "policy.generation.backend=vllm"],
                         base_model=None, precision=None, max_adapters=4, work_dir=work, max_rank=16)
    try:
        yield opened
    finally:
        opened.engine.close()


def teach(engine: PeftEngine, model_id: str, what: list[int], rate: float, steps: int = 12) -> None:
    for _ in range(steps):
        engine.forward_backward(model_id, [sft_datum(PROMPT + what)], "cross_entropy", None)
        engine.optim_step(model_id, AdamParams(learning_rate=rate))


def test_vllm_samples_each_request_s_adapter_as_the_in_process_sampler_does(served_vllm: Opened, work: Path) -> None:
    from corerl_vllm.adapter_sampler import VllmAdapterSampler

    engine = served_vllm.engine
    assert isinstance(engine, PeftEngine) and isinstance(engine.sampler, VllmAdapterSampler)
    assert served_vllm.sampling_backend == "vllm"
    assert any(line.startswith("sampling: by generation backend vllm") for line in served_vllm.lines)
    # a rank above the engine's is refused when the client is created, in one line
    with pytest.raises(ServiceError, match=r"^lora_config\.rank 32 is more than this server samples: use 1 to 16"):
        engine.create("too-wide", LoraSpec(rank=32))

    reference = PeftEngine(BASE, work_dir=work, device="cpu")  # torch in this process, on the same folder
    assert Path(reference.model_path) == Path(engine.model_path)
    engine.create("a", LoraSpec(rank=4, seed=1))
    engine.create("b", LoraSpec(rank=8, train_mlp=False, seed=2))
    teach(engine, "a", TAUGHT["a"], RATES["a"])
    teach(engine, "b", TAUGHT["b"], RATES["b"])
    folders = {name: work / f"sampler-{name}" for name in ("a", "b")}
    for name, folder in folders.items():
        engine.export_sampler(name, folder)
        assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}

    greedy = SampleParams(max_tokens=6, temperature=0.0, stop_at_eos=False)
    got: dict[str, list[int]] = {}
    for name in ("base", "a", "b", "a"):  # interleaved: each request its own adapter
        folder = folders.get(name)
        (want,) = reference.sample(folder, PROMPT, 1, greedy)
        samples = engine.sample(folder, PROMPT, 2, greedy)
        for sample in samples:
            assert sample.tokens == want.tokens, name
            assert sample.logprobs == pytest.approx(want.logprobs, abs=1e-3), name
            assert sample.stop_reason == "length"
        got[name] = want.tokens
    assert len({tuple(tokens) for tokens in got.values()}) == 3, got  # the adapters matter
    assert got["a"][:2] == TAUGHT["a"][:2] and got["b"][:2] == TAUGHT["b"][:2]

    # an adapter on the output projection (which vLLM does not adapt): sampled in this process instead
    engine.create("u", LoraSpec(rank=4, train_unembed=True, seed=3))
    teach(engine, "u", TAUGHT["a"], RATES["b"], steps=4)
    engine.export_sampler("u", work / "sampler-u")
    assert engine.sample(work / "sampler-u", PROMPT, 1, greedy) == reference.sample(work / "sampler-u", PROMPT, 1, greedy)
    assert str((work / "sampler-u").resolve()) not in engine.sampler._ids  # vLLM never saw it

    # a stop token ends a sample, kept as its last, on both
    stop = SampleParams(max_tokens=6, temperature=0.0, stop_tokens=[TAUGHT["b"][1]], stop_at_eos=False)
    (want,) = reference.sample(folders["b"], PROMPT, 1, stop)
    (sample,) = engine.sample(folders["b"], PROMPT, 1, stop)
    assert sample.tokens == want.tokens == TAUGHT["b"][:2] and sample.stop_reason == want.stop_reason == "stop"

    # new weights in the same folder: vLLM samples the new ones
    teach(engine, "a", TAUGHT["b"], RATES["b"], steps=6)
    engine.export_sampler("a", folders["a"])
    (want,) = reference.sample(folders["a"], PROMPT, 1, greedy)
    (sample,) = engine.sample(folders["a"], PROMPT, 1, greedy)
    assert want.tokens != got["a"], "the step changed nothing: the reload is not tested"
    assert sample.tokens == want.tokens and sample.logprobs == pytest.approx(want.logprobs, abs=1e-3)

    # at temperature 1 a seed repeats its samples; each of n differs (its own stream)
    seeded = SampleParams(max_tokens=8, temperature=1.0, seed=7, stop_at_eos=False)
    first = engine.sample(folders["b"], PROMPT, 3, seeded)
    assert [s.tokens for s in engine.sample(folders["b"], PROMPT, 3, seeded)] == [s.tokens for s in first]
    assert len({tuple(s.tokens) for s in first}) > 1
    assert all(lp <= 0 for s in first for lp in s.logprobs) and all(len(s.logprobs) == 8 for s in first)
