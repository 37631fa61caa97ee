"""Where ``corerl serve RECIPE`` samples: the recipe's generation backend's ``adapter_sampler`` when
its registration names one (vllm; sampled for real in tests/test_tinker_vllm_sampler.py, slow
tier), else the adapter engine with torch in this process (hf). Sampler weights are a PEFT folder
PEFT itself loads to the engine's logprobs; what :class:`PeftEngine` hands a sampler (plain values,
the exported folder), what it refuses before (a rank above the sampler's, weights of another base
model, a request longer than the sampler's context), and an adapter on the output projection,
which the sampler does not take, sampled here.
builtin:tiny-qwen2 on the CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from corerl.recipes import DEMO_RECIPE  # noqa: E402
from corerl.run.tinker.engine import LoraSpec, SampledSequence, SampleParams, ServiceError  # noqa: E402
from corerl.run.tinker.peft_engine import PeftEngine  # noqa: E402
from corerl.run.tinker.selection import open_engine  # noqa: E402
from tests.test_tinker_engine import BASE, BATCHES, run_steps, sft_datum  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tinker-adapter-sampler")


def test_the_vllm_backend_registers_an_adapter_sampler_and_hf_none() -> None:
    from corerl.plugin_manager import process_host

    backends = {b.id: b for b in process_host().generation_backends}
    assert backends["hf"].adapter_sampler is None
    if "vllm" in backends:
        assert backends["vllm"].adapter_sampler == "corerl_vllm.adapter_sampler:build"


def test_a_recipe_sampling_with_hf_samples_in_this_process(work: Path) -> None:
    opened = open_engine(str(DEMO_RECIPE), [f"policy.model_name={BASE}", "policy.generation.backend=hf"],
                         base_model=None, precision=None, max_adapters=2, work_dir=work)
    assert opened.engine.sampler is None and opened.sampling_backend is None
    (line,) = [line for line in opened.lines if line.startswith("sampling: ")]
    assert line.startswith("sampling: in this process, by the adapter engine with torch in float32 (generation "
                           "backend hf takes no adapter per request")
    opened.engine.create("any-rank", LoraSpec(rank=48))  # no sampler's limit on ranks


def test_sampler_weights_are_a_peft_folder_peft_loads(work: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = PeftEngine(BASE, work_dir=work, device="cpu")
    engine.create("peft", LoraSpec(rank=4, train_unembed=True, seed=3))
    run_steps(engine, "peft", BATCHES)
    engine.export_sampler("peft", tmp_path / "s")
    folder = tmp_path / "s"
    assert (folder / "adapter_model.safetensors").stat().st_ino == (folder / "adapter.safetensors").stat().st_ino
    datum = sft_datum([3, 9, 27, 81, 50, 7])
    want = engine.forward("peft", [datum], "cross_entropy", None).outputs[0]["logprobs"]
    base = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([datum.tokens])).logits[0].float()
    targets = torch.tensor([int(t) for t in datum.inputs["target_tokens"]])
    got = (logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]).tolist()
    assert got == pytest.approx(want, abs=1e-5)
    # exported again after a step: the PEFT file follows (the same tensors again, no stale copy)
    run_steps(engine, "peft", BATCHES[:1])
    engine.export_sampler("peft", folder)
    assert (folder / "adapter_model.safetensors").stat().st_ino == (folder / "adapter.safetensors").stat().st_ino


class Recorder:
    """A sampler that answers a fixed sequence and records what it was asked (the engine behind a
    real one is vLLM's, tested in the slow tier)."""

    takes_unembed = False
    max_length = 12

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def sample(self, adapter: str | None, prompt: list[int], num_samples: int, **params: Any) -> list[dict[str, Any]]:
        self.calls.append((adapter, prompt, num_samples, params))
        return [{"tokens": [4, 5], "logprobs": [-0.5, -1.5], "stop_reason": "stop"}] * num_samples


def test_the_engine_hands_a_sampler_plain_values_and_refuses_what_it_cannot_take(work: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    engine = PeftEngine(BASE, work_dir=work, device="cpu", sampler=recorder, max_rank=8)
    with pytest.raises(ServiceError, match=r"^lora_config\.rank 16 is more than this server samples: use 1 to 8, or restart it with a larger --max-lora-rank$"):
        engine.create("wide", LoraSpec(rank=16))
    engine.create("a", LoraSpec(rank=8, seed=1))
    run_steps(engine, "a", BATCHES[:1])
    engine.export_sampler("a", tmp_path / "a")
    for name in ("adapter_model.safetensors", "adapter_config.json"):  # weights exported before PEFT files were
        (tmp_path / "a" / name).unlink()
    params = SampleParams(max_tokens=3, temperature=0.5, top_k=4, seed=9, stop_tokens=[7], stop_strings=["x"],
                          stop_at_eos=False)
    assert engine.sample(tmp_path / "a", [1, 2], 2, params) == [SampledSequence([4, 5], [-0.5, -1.5], "stop")] * 2
    assert engine.sample(None, [3], 1, params) == [SampledSequence([4, 5], [-0.5, -1.5], "stop")]
    assert recorder.calls == [(str(tmp_path / "a"), [1, 2], 2, dataclasses.asdict(params)),
                              (None, [3], 1, dataclasses.asdict(params))]
    assert (tmp_path / "a" / "adapter_config.json").is_file() and (tmp_path / "a" / "adapter_model.safetensors").is_file()
    # refused before the sampler is asked
    with pytest.raises(ServiceError, match=r"exceeds the sampler's context of 12 \(the server's recipe sets it: policy\.max_seq_length\)$"):
        engine.sample(None, [1] * 10, 1, params)
    other = PeftEngine("builtin:tiny-qwen2-small", work_dir=work, device="cpu")
    other.create("b", LoraSpec(rank=2))
    other.export_sampler("b", tmp_path / "b")
    with pytest.raises(ServiceError, match=r"^these weights are for base model 'builtin:tiny-qwen2-small'"):
        engine.sample(tmp_path / "b", [1], 1, params)
    assert len(recorder.calls) == 2
    # an adapter on the output projection, which this sampler does not take: sampled here with torch
    engine.create("u", LoraSpec(rank=4, train_unembed=True, seed=2))
    run_steps(engine, "u", BATCHES[:1])
    engine.export_sampler("u", tmp_path / "u")
    greedy = SampleParams(max_tokens=3, temperature=0.0, stop_at_eos=False)
    alone = PeftEngine(BASE, work_dir=work, device="cpu")
    assert engine.sample(tmp_path / "u", [1, 2], 1, greedy) == alone.sample(tmp_path / "u", [1, 2], 1, greedy)
    assert len(recorder.calls) == 2
