"""The Tinker service's engine (corerl.run.tinker.peft_engine): many LoRA adapters on one base model.

Each loss against a hand computation from the logprobs the engine returns (and its gradient
against cross_entropy's with the weights the loss's derivative gives), adapters interleaved
against each run alone, a step of one adapter against the other's weights and Adam state,
save/load against the unsaved run, greedy sampling against an independent merged-weight model,
a one-line refusal for each bad input, and the memory an added adapter takes. builtin:tiny-qwen2
on the CPU: seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from corerl.run.tinker.engine import (  # noqa: E402
    AdamParams,
    Datum,
    LoraSpec,
    SampleParams,
    ServiceError,
)
from corerl.run.tinker.peft_engine import LORA_ALPHA, PeftEngine  # noqa: E402

BASE = "builtin:tiny-qwen2"
VOCAB = 128  # tiny-qwen2's


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tinker-engine")


@pytest.fixture(scope="module")
def engine(work: Path) -> PeftEngine:
    return PeftEngine(BASE, work_dir=work, device="cpu", max_adapters=64)  # the tests keep theirs


def sft_datum(tokens: list[int], weights: list[float] | None = None) -> Datum:
    """A next-token datum over ``tokens``: input tokens[:-1], targets tokens[1:]."""
    inputs = {"target_tokens": [float(t) for t in tokens[1:]]}
    inputs["weights"] = weights if weights is not None else [1.0] * (len(tokens) - 1)
    return Datum(tokens=tokens[:-1], inputs=inputs)


BATCHES = [
    [sft_datum([5, 6, 7, 8, 9]), sft_datum([10, 11, 12], [0.0, 1.0])],
    [sft_datum([20, 21, 22, 23, 24, 25, 26])],
    [sft_datum([30, 31, 32]), sft_datum([40, 41, 42, 43], [1.0, 0.5, 2.0])],
]
ADAM = AdamParams(learning_rate=5e-3, weight_decay=0.01, grad_clip_norm=1.0)


def weights_of(engine: PeftEngine, model_id: str, where: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors and optimizer state, as save_state writes them."""
    from safetensors.torch import load_file

    engine.save_state(model_id, where, with_optimizer=True)
    tensors = dict(load_file(str(where / "adapter.safetensors")))
    state = torch.load(where / "optimizer.pt", weights_only=True)
    for index, values in state["state"].items():
        for key, value in values.items():
            tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value)
    return tensors


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    worst = max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
    assert worst <= atol, f"largest difference {worst:g} over {len(a)} tensors"


def grads_of(engine: PeftEngine, model_id: str) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for p in engine._adapters[model_id].params]


# -- losses --


def test_a_fresh_adapter_is_the_base_model(engine: PeftEngine) -> None:
    """B starts at zero: the logprobs equal the base model's own, computed here with transformers."""
    from transformers import AutoModelForCausalLM

    engine.create("fresh", LoraSpec(rank=4, seed=3))
    datum = sft_datum([5, 9, 17, 33, 2, 60])
    got = engine.forward("fresh", [datum], "cross_entropy", None).outputs[0]["logprobs"]
    base = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([datum.tokens])).logits[0].log_softmax(-1)
    want = [float(logits[i, int(t)]) for i, t in enumerate(datum.inputs["target_tokens"])]
    assert got == pytest.approx(want, abs=1e-5)


def test_each_loss_equals_a_hand_computation(engine: PeftEngine) -> None:
    engine.create("losses", LoraSpec(rank=4, seed=5))
    tokens = [5, 6, 7, 8, 9, 10]
    targets = [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    logp = engine.forward("losses", [Datum(tokens, {"target_tokens": targets})], "cross_entropy",
                          None).outputs[0]["logprobs"]
    # sampler logprobs chosen so that the ratios are 0.5, 1.0, 1.1, 1.5, 5.0, 0.9
    ratios = [0.5, 1.0, 1.1, 1.5, 5.0, 0.9]
    q = [lp - math.log(r) for lp, r in zip(logp, ratios, strict=True)]
    adv = [1.0, -1.0, 2.0, 1.0, -0.5, -2.0]
    weights = [0.0, 1.0, 0.5, 2.0, 1.0, 1.0]

    def clip(r: float, low: float, high: float) -> float:
        return min(max(r, low), high)

    want = {
        "cross_entropy": [-w * lp for w, lp in zip(weights, logp, strict=True)],
        "importance_sampling": [-r * a for r, a in zip(ratios, adv, strict=True)],
        "ppo": [-min(r * a, clip(r, 0.8, 1.2) * a) for r, a in zip(ratios, adv, strict=True)],
        "cispo": [-clip(r, 0.0, 4.0) * lp * a for r, lp, a in zip(ratios, logp, adv, strict=True)],
    }
    for loss_fn, expected in want.items():
        inputs = {"target_tokens": targets}
        inputs.update({"weights": weights} if loss_fn == "cross_entropy" else {"logprobs": q, "advantages": adv})
        out = engine.forward("losses", [Datum(tokens, inputs)], loss_fn, None)
        assert out.outputs[0]["logprobs"] == pytest.approx(logp, abs=1e-6), loss_fn
        assert out.outputs[0]["elementwise_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-5), loss_fn
        assert out.metrics["loss:sum"] == pytest.approx(sum(expected), rel=1e-4, abs=1e-5), loss_fn
        assert all(key.count(":") == 1 for key in out.metrics)
    # the thresholds from loss_fn_config, and per datum from an input of the same name
    config = {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}
    inputs = {"target_tokens": targets, "logprobs": q, "advantages": adv}
    ppo = engine.forward("losses", [Datum(tokens, inputs)], "ppo", config)
    assert ppo.metrics["loss:sum"] == pytest.approx(
        sum(-min(r * a, clip(r, 0.95, 1.05) * a) for r, a in zip(ratios, adv, strict=True)), rel=1e-4)
    per_datum = dict(inputs, clip_low_threshold=[0.0], clip_high_threshold=[1.05])
    cispo = engine.forward("losses", [Datum(tokens, per_datum)], "cispo", None)
    assert cispo.metrics["loss:sum"] == pytest.approx(
        sum(-clip(r, 0.0, 1.05) * lp * a for r, lp, a in zip(ratios, logp, adv, strict=True)), rel=1e-4)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_policy_losses_have_the_gradient_their_definition_gives(engine: PeftEngine, loss_fn: str) -> None:
    """d loss / d logp is -r*A (importance sampling; ppo where unclipped, 0 where the clip binds)
    and -clip(r)*A (cispo, the ratio detached): the same gradient as cross_entropy with those
    weights, on a second adapter with the same initial weights."""
    spec = LoraSpec(rank=4, seed=11)
    engine.create(f"{loss_fn}-pg", spec)
    engine.create(f"{loss_fn}-ce", spec)
    tokens, targets = [5, 6, 7, 8, 9], [6.0, 7.0, 8.0, 9.0, 10.0]
    logp = engine.forward(f"{loss_fn}-pg", [Datum(tokens, {"target_tokens": targets})], "cross_entropy",
                          None).outputs[0]["logprobs"]
    ratios, adv = [0.5, 1.1, 1.5, 5.0, 0.9], [1.0, 2.0, 1.0, -0.5, -2.0]
    q = [lp - math.log(r) for lp, r in zip(logp, ratios, strict=True)]
    if loss_fn == "importance_sampling":
        weights = [r * a for r, a in zip(ratios, adv, strict=True)]
    elif loss_fn == "ppo":  # the clipped term is the minimum (and constant) where it binds
        weights = [0.0 if min(max(r, 0.8), 1.2) * a < r * a else r * a for r, a in zip(ratios, adv, strict=True)]
    else:
        weights = [min(max(r, 0.0), 4.0) * a for r, a in zip(ratios, adv, strict=True)]
    engine.forward_backward(f"{loss_fn}-pg", [Datum(tokens, {"target_tokens": targets, "logprobs": q,
                                                             "advantages": adv})], loss_fn, None)
    engine.forward_backward(f"{loss_fn}-ce", [Datum(tokens, {"target_tokens": targets, "weights": weights})],
                            "cross_entropy", None)
    for got, want in zip(grads_of(engine, f"{loss_fn}-pg"), grads_of(engine, f"{loss_fn}-ce"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert any(float(g.abs().max()) > 0 for g in grads_of(engine, f"{loss_fn}-pg"))


def test_cross_entropy_is_linear_in_the_weights(engine: PeftEngine) -> None:
    spec = LoraSpec(rank=4, seed=7)
    for name in ("lin-1", "lin-2", "lin-sum"):
        engine.create(name, spec)
    tokens = [5, 6, 7, 8, 9, 10, 11]
    w1, w2 = [1.0, 0.0, 2.0, 0.5, 0.0, 1.0], [0.0, 3.0, -1.0, 0.5, 1.0, 0.0]
    combined = [a + 2 * b for a, b in zip(w1, w2, strict=True)]
    loss1 = engine.forward_backward("lin-1", [sft_datum(tokens, w1)], "cross_entropy", None).metrics["loss:sum"]
    loss2 = engine.forward_backward("lin-2", [sft_datum(tokens, w2)], "cross_entropy", None).metrics["loss:sum"]
    both = engine.forward_backward("lin-sum", [sft_datum(tokens, combined)], "cross_entropy", None)
    assert both.metrics["loss:sum"] == pytest.approx(loss1 + 2 * loss2, rel=1e-5)
    grads = zip(grads_of(engine, "lin-1"), grads_of(engine, "lin-2"), grads_of(engine, "lin-sum"), strict=True)
    for g1, g2, g in grads:
        torch.testing.assert_close(g, g1 + 2 * g2, rtol=1e-4, atol=1e-4 * float(g.abs().max()))


def test_gradients_accumulate_until_the_step(engine: PeftEngine) -> None:
    """Two forward_backward calls on halves give the gradient of one call on the whole batch."""
    spec = LoraSpec(rank=4, seed=13)
    engine.create("acc-split", spec)
    engine.create("acc-whole", spec)
    engine.forward_backward("acc-split", BATCHES[0][:1], "cross_entropy", None)
    engine.forward_backward("acc-split", BATCHES[0][1:], "cross_entropy", None)
    engine.forward_backward("acc-whole", BATCHES[0], "cross_entropy", None)
    for a, b in zip(grads_of(engine, "acc-split"), grads_of(engine, "acc-whole"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


# -- many adapters --


def run_steps(engine: PeftEngine, model_id: str, batches: list[list[Datum]]) -> list[float]:
    losses = []
    for batch in batches:
        losses.append(engine.forward_backward(model_id, batch, "cross_entropy", None).metrics["loss:sum"])
        engine.optim_step(model_id, ADAM)
    return losses


def interleave(engine: Any, spec_a: LoraSpec, spec_b: LoraSpec, batches_b: list[Any]) -> tuple[list[float], list[float]]:
    """Adapters ``inter-a`` (on BATCHES) and ``inter-b`` (on ``batches_b``) created and trained
    interleaved: A forward-backward, B forward-backward, A step, B step, ...; their losses."""
    engine.create("inter-a", spec_a)
    engine.create("inter-b", spec_b)
    losses_a, losses_b = [], []
    for batch_a, batch_b in zip(BATCHES, batches_b, strict=True):
        losses_a.append(engine.forward_backward("inter-a", batch_a, "cross_entropy", None).metrics["loss:sum"])
        losses_b.append(engine.forward_backward("inter-b", batch_b, "cross_entropy", None).metrics["loss:sum"])
        engine.optim_step("inter-a", ADAM)
        engine.optim_step("inter-b", ADAM)
    return losses_a, losses_b


def test_interleaved_adapters_equal_each_run_alone(engine: PeftEngine, work: Path, tmp_path: Path) -> None:
    spec_a = LoraSpec(rank=4, seed=21)
    spec_b = LoraSpec(rank=8, train_mlp=False, train_unembed=True, seed=22)
    batches_b = list(reversed(BATCHES))
    losses_a, losses_b = interleave(engine, spec_a, spec_b, batches_b)
    alone = PeftEngine(BASE, work_dir=work, device="cpu")
    alone.create("a", spec_a)
    assert run_steps(alone, "a", BATCHES) == pytest.approx(losses_a, abs=1e-6)
    alone.delete("a")
    alone.create("b", spec_b)
    assert run_steps(alone, "b", batches_b) == pytest.approx(losses_b, abs=1e-6)
    assert_same(weights_of(engine, "inter-b", tmp_path / "ib"), weights_of(alone, "b", tmp_path / "b"))
    alone.delete("b")
    alone.create("a", spec_a)
    run_steps(alone, "a", BATCHES)
    assert_same(weights_of(engine, "inter-a", tmp_path / "ia"), weights_of(alone, "a", tmp_path / "a"))
    assert engine.info("inter-a")["steps"] == engine.info("inter-b")["steps"] == len(BATCHES)


def test_a_step_leaves_another_adapter_alone(engine: PeftEngine, tmp_path: Path) -> None:
    engine.create("still", LoraSpec(rank=4, seed=31))
    engine.create("moving", LoraSpec(rank=4, seed=32))
    run_steps(engine, "still", BATCHES[:1])  # it has Adam state now
    engine.forward_backward("still", BATCHES[1], "cross_entropy", None)  # and a pending gradient
    pending = grads_of(engine, "still")
    before = weights_of(engine, "still", tmp_path / "before")
    moving_before = weights_of(engine, "moving", tmp_path / "moving-before")
    run_steps(engine, "moving", BATCHES)
    assert_same(weights_of(engine, "still", tmp_path / "after"), before, atol=0.0)
    for a, b in zip(grads_of(engine, "still"), pending, strict=True):
        assert torch.equal(a, b)
    moved = weights_of(engine, "moving", tmp_path / "moving-after")
    assert any(not torch.equal(moved[k], v) for k, v in moving_before.items() if "lora_B" in k)


def test_save_and_load_state_resume_the_same_run(engine: PeftEngine, tmp_path: Path) -> None:
    spec = LoraSpec(rank=4, seed=41)
    engine.create("saved", spec)
    run_steps(engine, "saved", BATCHES[:2])
    engine.save_state("saved", tmp_path / "state", with_optimizer=True)
    run_steps(engine, "saved", BATCHES[2:] + BATCHES[:1])
    engine.load_state("resumed", tmp_path / "state", with_optimizer=True)
    assert engine.info("resumed")["steps"] == 2 and engine.info("resumed")["rank"] == 4
    run_steps(engine, "resumed", BATCHES[2:] + BATCHES[:1])
    assert_same(weights_of(engine, "resumed", tmp_path / "r"), weights_of(engine, "saved", tmp_path / "s"), atol=0.0)
    # without the optimizer Adam starts again, and the run differs; into an existing id it replaces it
    engine.load_state("resumed", tmp_path / "state", with_optimizer=False)
    assert engine.optimizer_bytes("resumed") == 0
    run_steps(engine, "resumed", BATCHES[2:] + BATCHES[:1])
    fresh = weights_of(engine, "resumed", tmp_path / "f")
    saved = weights_of(engine, "saved", tmp_path / "s2")
    assert any(not torch.allclose(fresh[k], saved[k]) for k in fresh if "lora_B" in k)


def test_greedy_sampling_is_the_adapters_argmax(engine: PeftEngine, tmp_path: Path) -> None:
    """Temperature 0 through the exported weights equals step-by-step argmax of a model built here:
    the base model with the exported LoRA merged into its weights (W + alpha/r * B A), no cache."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec = LoraSpec(rank=4, seed=51)
    engine.create("greedy", spec)
    pattern = [5, 9, 14, 20, 27, 35, 44, 54, 65, 77]
    for _ in range(15):
        engine.forward_backward("greedy", [sft_datum(pattern)], "cross_entropy", None)
        engine.optim_step("greedy", AdamParams(learning_rate=5e-3))
    engine.export_sampler("greedy", tmp_path / "sampler")
    prompt = [5, 9, 14]
    [sampled] = engine.sample(tmp_path / "sampler", prompt, 1,
                              SampleParams(max_tokens=6, temperature=0.0, stop_at_eos=False))

    reference = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32).eval()
    tensors = load_file(str(tmp_path / "sampler" / "adapter.safetensors"))
    with torch.no_grad():
        for key, a in tensors.items():
            if key.endswith(".lora_A.weight"):
                b = tensors[key.replace(".lora_A.", ".lora_B.")]
                module = reference.get_submodule(key.removeprefix("base_model.model.").removesuffix(".lora_A.weight"))
                module.weight += (LORA_ALPHA / spec.rank) * b @ a
        ids, want_tokens, want_logprobs = list(prompt), [], []
        for _ in range(6):
            logprobs = reference(input_ids=torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            token = int(logprobs.argmax())
            want_tokens.append(token)
            want_logprobs.append(float(logprobs[token]))
            ids.append(token)
    assert sampled.tokens == want_tokens and sampled.stop_reason == "length"
    assert sampled.logprobs == pytest.approx(want_logprobs, abs=1e-4)
    assert want_tokens != engine.sample(None, prompt, 1, SampleParams(max_tokens=6, temperature=0.0,
                                                                       stop_at_eos=False))[0].tokens
    # a stop token ends the sample and is kept in it
    assert want_tokens == pattern[3:9]  # the adapter learned the pattern, which the base model does not follow
    [stopped] = engine.sample(tmp_path / "sampler", prompt, 1, SampleParams(
        max_tokens=6, temperature=0.0, stop_tokens=[want_tokens[2]], stop_at_eos=False))
    assert stopped.tokens == want_tokens[:3] and stopped.stop_reason == "stop"


def test_sampling_is_seeded_and_reports_its_logprobs(engine: PeftEngine) -> None:
    params = SampleParams(max_tokens=5, temperature=0.7, top_k=20, seed=4, stop_at_eos=False)
    first = engine.sample(None, [5, 6, 7], 3, params)
    assert first == engine.sample(None, [5, 6, 7], 3, params)
    assert len({tuple(s.tokens) for s in first}) > 1
    # logprobs of the tokens under the distribution sampled from (logits / temperature)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for seq in first:
            logits = base(input_ids=torch.tensor([[5, 6, 7, *seq.tokens]])).logits[0, 2:-1]
            want = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(seq.tokens)[:, None]).squeeze(-1)
            assert seq.logprobs == pytest.approx(want.tolist(), abs=1e-4)


# -- refusals --


def bad_calls(engine: PeftEngine, tmp_path: Path) -> dict[str, object]:
    ok = sft_datum([5, 6, 7])
    rl = {"target_tokens": [6.0, 7.0], "logprobs": [-1.0, -1.0], "advantages": [1.0, 1.0]}
    other = tmp_path / "other-base"
    engine.export_sampler("bad-ok", other)
    state = json.loads((other / "state.json").read_text())
    (other / "state.json").write_text(json.dumps(dict(state, base_model="Qwen/Qwen3-8B")))
    weights_only = tmp_path / "weights-only"
    engine.save_state("bad-ok", weights_only, with_optimizer=False)
    corrupt = tmp_path / "corrupt"
    engine.save_state("bad-ok", corrupt)
    (corrupt / "adapter.safetensors").write_bytes(b"not a safetensors file")
    return {
        "unknown model": lambda: engine.forward("nobody", [ok], "cross_entropy", None),
        "unknown model step": lambda: engine.optim_step("nobody", AdamParams()),
        "unknown model info": lambda: engine.info("nobody"),
        "existing id": lambda: engine.create("bad-ok", LoraSpec(rank=4)),
        "rank 0": lambda: engine.create("bad-r0", LoraSpec(rank=0)),
        "rank too large": lambda: engine.create("bad-rbig", LoraSpec(rank=100_000)),
        "no layers": lambda: engine.create("bad-none", LoraSpec(rank=4, train_mlp=False, train_attn=False)),
        "unknown loss": lambda: engine.forward("bad-ok", [ok], "dro", None),
        "gspo": lambda: engine.forward_backward("bad-ok", [ok], "gspo", None),
        "unknown config key": lambda: engine.forward("bad-ok", [Datum([5, 6], rl)], "ppo", {"clip_ratio": 0.2}),
        "config for cross_entropy": lambda: engine.forward("bad-ok", [ok], "cross_entropy", {"clip_low_threshold": 1}),
        "low above high": lambda: engine.forward("bad-ok", [Datum([5, 6], rl)], "cispo",
                                                 {"clip_low_threshold": 2.0, "clip_high_threshold": 1.0}),
        "token out of vocabulary": lambda: engine.forward("bad-ok", [Datum([5, VOCAB], ok.inputs)],
                                                          "cross_entropy", None),
        "negative token": lambda: engine.forward("bad-ok", [Datum([-1, 5], ok.inputs)], "cross_entropy", None),
        "target out of vocabulary": lambda: engine.forward(
            "bad-ok", [Datum([5, 6], {"target_tokens": [6.0, 999.0]})], "cross_entropy", None),
        "too long": lambda: engine.forward("bad-ok", [Datum([5] * (engine.max_length + 1),
                                                            {"target_tokens": [5.0] * (engine.max_length + 1)})],
                                           "cross_entropy", None),
        "no tokens": lambda: engine.forward("bad-ok", [Datum([], {"target_tokens": []})], "cross_entropy", None),
        "missing input": lambda: engine.forward("bad-ok", [Datum([5, 6], {"target_tokens": [6.0, 7.0]})],
                                                "importance_sampling", None),
        "unknown input": lambda: engine.forward("bad-ok", [Datum([5, 6], dict(ok.inputs, mask=[1.0, 1.0]))],
                                                "cross_entropy", None),
        "input length": lambda: engine.forward("bad-ok", [Datum([5, 6, 7], rl)], "importance_sampling", None),
        "not finite": lambda: engine.forward("bad-ok", [Datum([5, 6], dict(rl, advantages=[1.0, math.nan]))],
                                             "importance_sampling", None),
        "bad beta": lambda: engine.optim_step("bad-ok", AdamParams(beta1=1.0)),
        "negative lr": lambda: engine.optim_step("bad-ok", AdamParams(learning_rate=-1.0)),
        "no saved state": lambda: engine.load_state("bad-load", tmp_path / "nothing", True),
        "state without optimizer": lambda: engine.load_state("bad-load", weights_only, True),
        "another base model": lambda: engine.load_state("bad-load", other, False),
        "sampler of another base model": lambda: engine.sample(other, [5], 1, SampleParams(max_tokens=2)),
        "corrupt weights": lambda: engine.load_state("bad-load", corrupt, True),
        "corrupt sampler weights": lambda: engine.sample(corrupt, [5], 1, SampleParams(max_tokens=2)),
        "no sampler weights": lambda: engine.sample(tmp_path / "nothing", [5], 1, SampleParams(max_tokens=2)),
        "prompt out of vocabulary": lambda: engine.sample(None, [VOCAB], 1, SampleParams(max_tokens=2)),
        "empty prompt": lambda: engine.sample(None, [], 1, SampleParams(max_tokens=2)),
        "prompt and max_tokens too long": lambda: engine.sample(None, [5], 1,
                                                                SampleParams(max_tokens=engine.max_length)),
        "no samples": lambda: engine.sample(None, [5], 0, SampleParams(max_tokens=2)),
        "negative temperature": lambda: engine.sample(None, [5], 1, SampleParams(max_tokens=2, temperature=-1)),
        "top_p 0": lambda: engine.sample(None, [5], 1, SampleParams(max_tokens=2, top_p=0.0)),
    }


def test_each_bad_input_is_one_line_for_the_user(engine: PeftEngine, tmp_path: Path) -> None:
    engine.create("bad-ok", LoraSpec(rank=4, seed=1))
    failures = []
    for what, call in bad_calls(engine, tmp_path).items():
        try:
            call()  # type: ignore[operator]
        except ServiceError as exc:
            if exc.category != "user" or "\n" in str(exc) or not str(exc):
                failures.append(f"{what}: {exc.category} {str(exc)!r}")
        else:
            failures.append(f"{what}: accepted")
    assert not failures, failures
    # nothing half-made is left behind: the refused ids do not exist, the good one still works
    for model_id in ("bad-r0", "bad-rbig", "bad-none", "bad-load"):
        with pytest.raises(ServiceError):
            engine.info(model_id)
    assert engine.forward("bad-ok", [sft_datum([5, 6, 7])], "cross_entropy", None).metrics["loss:sum"] > 0


def test_the_adapter_limit_is_one_line(work: Path) -> None:
    small = PeftEngine(BASE, work_dir=work, device="cpu", max_adapters=1)
    small.create("one", LoraSpec(rank=2, seed=0))
    with pytest.raises(ServiceError, match="at most|already") as caught:
        small.create("two", LoraSpec(rank=2, seed=0))
    assert caught.value.category == "user"
    small.delete("one")
    small.create("two", LoraSpec(rank=2, seed=0))
    assert small.info("two")["steps"] == 0


# -- memory --


def test_memory_per_added_adapter(engine: PeftEngine) -> None:
    """An adapter of rank r on the attention and MLP linears holds r*(in+out) float32 values per
    layer; the model's parameters grow by exactly that, and Adam's state is twice that (plus a step
    counter per tensor) after the first step."""
    def parameter_bytes() -> int:
        return sum(p.numel() * p.element_size() for p in engine._model().parameters())

    lines = []
    for rank in (2, 8, 32):
        before = parameter_bytes()
        engine.create(f"mem-{rank}", LoraSpec(rank=rank, seed=rank))
        added = parameter_bytes() - before
        size = engine.adapter_bytes(f"mem-{rank}")
        want = sum(rank * (engine._linear(name).in_features + engine._linear(name).out_features)
                   for kind in ("attn", "mlp") for name in engine._targets[kind]) * 4
        run_steps(engine, f"mem-{rank}", BATCHES[:1])
        optimizer = engine.optimizer_bytes(f"mem-{rank}")
        tensors = len(engine._adapters[f"mem-{rank}"].params)
        lines.append(f"rank {rank}: adapter {size} B (model parameters +{added} B), Adam state {optimizer} B, "
                     f"total {size + optimizer} B per added adapter on {BASE}")
        assert size == want == added, "; ".join(lines)
        assert 2 * size <= optimizer <= 2 * size + tensors * 8, "; ".join(lines)
    info = engine.info("mem-8")
    assert info["adapter_bytes"] == engine.adapter_bytes("mem-8") and info["trainable_parameters"] * 4 == info[
        "adapter_bytes"], "; ".join(lines)
    print("\n".join(lines))
