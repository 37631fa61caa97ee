"""``corerl serve RECIPE``: the engine comes from the recipe's selected training backend.

Selection as ``corerl run`` makes it: the default recipe gets the dtensor backend's adapter
engine (its model build: activation checkpointing from policy.dtensor_cfg), megatron is refused
in one line naming the key to change, and a recipe error is one line, exit 2. The dtensor
adapter engine against :class:`PeftEngine` on the same model and inputs: the same logprobs,
losses and gradients, the same weights after steps and greedy samples (1e-5), weights saved by
one loading into the other; and on it, two adapters interleaved equal each run alone. builtin:tiny-qwen2 on the CPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from corerl.recipes import DEMO_RECIPE  # noqa: E402
from corerl.run.tinker.engine import Datum, LoraSpec, SampleParams  # noqa: E402
from corerl.run.tinker.peft_engine import PeftEngine  # noqa: E402
from corerl.run.tinker.selection import Opened, open_engine  # noqa: E402
from tests.refusals import refused_in_one_line  # noqa: E402
from tests.test_tinker_engine import (  # noqa: E402
    ADAM,
    BASE,
    BATCHES,
    assert_same,
    grads_of,
    interleave,
    run_steps,
    sft_datum,
    weights_of,
)

KEY = "tml-serve-engines-test"
DEEPSPEED = ["policy.deepspeed_cfg.enabled=true"]
#: the default recipe (the demo's), with activation checkpointing: a model build of the backend's own;
#: hf generation, so the service samples in its process (vLLM's sampler has tests of its own:
#: tests/test_tinker_vllm_sampler.py) and these compare training engines alone
RECIPE = [str(DEMO_RECIPE), f"policy.model_name={BASE}", "policy.dtensor_cfg.activation_checkpointing=true",
          "policy.generation.backend=hf"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-engines")


@pytest.fixture(scope="module")
def opened(work: Path) -> Opened:
    return open_engine(RECIPE[0], RECIPE[1:], base_model=None, precision=None, max_adapters=16, work_dir=work)


@pytest.fixture(scope="module")
def reference(work: Path, opened: Opened) -> PeftEngine:
    """PeftEngine on the same base model, loading the very folder the dtensor backend built its model from."""
    engine = PeftEngine(BASE, work_dir=work, device="cpu")
    assert Path(engine.model_path) == Path(opened.engine.model_path)
    return engine


@pytest.fixture(scope="module")
def opened_deepspeed(work: Path) -> Opened:
    """The same recipe with policy.deepspeed_cfg.enabled=true: the deepspeed backend's adapter engine."""
    from corerl.plugin_manager import process_host

    if "deepspeed" not in {b.id for b in process_host().training_backends}:
        pytest.skip("the deepspeed plugin is not installed")
    return open_engine(RECIPE[0], [*RECIPE[1:], *DEEPSPEED], base_model=None, precision=None, max_adapters=16,
                       work_dir=work)


def test_a_default_recipe_serves_on_the_dtensor_adapter_engine(opened: Opened) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    assert opened.training_backend == "dtensor"
    assert isinstance(opened.engine, PeftEngine) and opened.base_model == BASE
    # the model is the backend's build: policy.dtensor_cfg.activation_checkpointing wrapped its layers
    assert any(isinstance(m, CheckpointWrapper) for m in opened.engine._model().modules())
    assert any(line.startswith("training backend dtensor: ") for line in opened.lines)
    assert any("sampling: in this process" in line for line in opened.lines)


def test_a_deepspeed_recipe_serves_on_the_deepspeed_adapter_engine(opened_deepspeed: Opened, work: Path) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    assert opened_deepspeed.training_backend == "deepspeed"
    assert isinstance(opened_deepspeed.engine, PeftEngine) and opened_deepspeed.base_model == BASE
    assert any(line.startswith("training backend deepspeed: policy.deepspeed_cfg.enabled is true")
               for line in opened_deepspeed.lines)
    model = opened_deepspeed.engine._model()
    # the deepspeed backend's build: no activation checkpointing (policy.dtensor_cfg's is not its), no autocast
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())
    assert opened_deepspeed.engine._forward_context is contextlib.nullcontext
    # bfloat16 as DeepSpeed casts it: the parameters; the buffers (rotary inv_freq) kept in float32,
    # unless the DeepSpeed config's data_types.buffer_dtype says otherwise
    bf16 = open_engine(RECIPE[0], [*RECIPE[1:], *DEEPSPEED], base_model=None, precision="bfloat16", max_adapters=2,
                       work_dir=work).engine._model()
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in bf16.buffers()} == {torch.float32}
    cast = open_engine(RECIPE[0], [*RECIPE[1:], *DEEPSPEED, "policy.deepspeed_cfg.config={data_types: {buffer_dtype: bf16}}"],
                       base_model=None, precision="bfloat16", max_adapters=2, work_dir=work).engine._model()
    assert {b.dtype for b in cast.buffers()} == {torch.bfloat16}
    torch.testing.assert_close(dict(cast.named_parameters()), dict(bf16.named_parameters()), rtol=0, atol=0)


def serve(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from corerl.cli import main

    pytest.importorskip("tinker", reason="the tinker SDK (scripts/setup.sh installs tinker==0.38.0)")
    monkeypatch.setenv("CORERL_SERVE_API_KEY", KEY)
    capsys.readouterr()
    code = main(["serve", *argv])
    return code, capsys.readouterr().err


def test_a_backend_without_adapters_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from corerl.plugin_manager import process_host

    if "megatron" not in {b.id for b in process_host().training_backends}:
        pytest.skip("the megatron plugin is not installed")
    line = refused_in_one_line(serve([*RECIPE, "policy.megatron_cfg.enabled=true"], monkeypatch, capsys),
                               "the megatron training backend serves no Tinker adapters",
                               "use policy.megatron_cfg.enabled=false", "(deepspeed, dtensor", key="policy.megatron_cfg.enabled")
    assert "override" in line  # where the key was set
    refused_in_one_line(serve([*RECIPE, "policy.training_backend=megatron"], monkeypatch, capsys),
                        "serves no Tinker adapters", "set policy.training_backend to one that serves them (deepspeed, dtensor",
                        key="policy.training_backend")


def test_the_deepspeed_adapter_engine_refuses_more_than_one_rank_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], opened_deepspeed: Opened) -> None:
    refused_in_one_line(serve([*RECIPE, *DEEPSPEED, "cluster.gpus_per_node=2"], monkeypatch, capsys),
                        "runs the deepspeed backend in its own process, one rank, and the recipe asks for 2",
                        "set cluster.num_nodes=1 cluster.gpus_per_node=1", key="cluster.gpus_per_node")
    refused_in_one_line(serve([*RECIPE, *DEEPSPEED, "policy.deepspeed_cfg.config={torch_autocast: {enabled: true}}"],
                              monkeypatch, capsys),
                        "without its torch_autocast", key="policy.deepspeed_cfg.config.torch_autocast")


def test_a_recipe_error_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    refused_in_one_line(serve([*RECIPE, "policy.dtensor_cfg.tensor_parallel_size=0"], monkeypatch, capsys),
                        key="policy.dtensor_cfg.tensor_parallel_size")
    refused_in_one_line(serve([str(tmp_path / "missing.yaml")], monkeypatch, capsys), "missing.yaml")


@pytest.mark.parametrize("backend", ["dtensor", "deepspeed"])
def test_the_backend_adapter_engine_computes_what_peft_engine_does(backend: str, request: pytest.FixtureRequest,
                                                                   reference: PeftEngine, tmp_path: Path) -> None:
    """Same spec and seed on both: the same logprobs, losses and gradients (importance sampling
    too), and after optimizer steps the same weights and Adam state and greedy samples, within 1e-5."""
    opened = request.getfixturevalue("opened" if backend == "dtensor" else f"opened_{backend}")
    engines = {backend: opened.engine, "peft": reference}
    spec = LoraSpec(rank=4, seed=51)
    rl = Datum(tokens=[3, 9, 27, 81 % 128, 50], inputs={
        "target_tokens": [9.0, 27.0, 81.0, 50.0, 7.0], "logprobs": [-4.0, -5.0, -3.5, -4.5, -6.0],
        "advantages": [1.0, -0.5, 2.0, 0.0, 1.5]})
    for engine in engines.values():
        engine.create("same", spec)
    outs = {name: e.forward("same", BATCHES[0], "cross_entropy", None) for name, e in engines.items()}
    for a, b in zip(outs[backend].outputs, outs["peft"].outputs, strict=True):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)
    for batch, loss_fn in ((BATCHES[0], "cross_entropy"), ([rl], "importance_sampling"), (BATCHES[1], "cross_entropy")):
        losses = {name: e.forward_backward("same", batch, loss_fn, None).metrics["loss:sum"]
                  for name, e in engines.items()}
        assert losses[backend] == pytest.approx(losses["peft"], abs=1e-5)
        for a, b in zip(grads_of(engines[backend], "same"), grads_of(engines["peft"], "same"), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        steps = {name: e.optim_step("same", ADAM) for name, e in engines.items()}
        assert steps[backend]["grad_norm"] == pytest.approx(steps["peft"]["grad_norm"], abs=1e-5)
    assert_same(weights_of(engines[backend], "same", tmp_path / backend), weights_of(engines["peft"], "same",
                                                                                  tmp_path / "p"), atol=1e-5)
    after = {name: e.forward("same", [sft_datum([60, 61, 62, 63])], "cross_entropy", None).outputs[0]["logprobs"]
             for name, e in engines.items()}
    assert after[backend] == pytest.approx(after["peft"], abs=1e-5)
    # greedy samples from each one's exported weights: the same tokens and logprobs
    samples = {}
    for name, engine in engines.items():
        engine.export_sampler("same", tmp_path / f"sampler-{name}")
        samples[name] = engine.sample(tmp_path / f"sampler-{name}", [2, 5, 9, 13], 1,
                                      SampleParams(max_tokens=6, temperature=0.0, stop_at_eos=False))[0]
    assert samples[backend].tokens == samples["peft"].tokens
    assert samples[backend].logprobs == pytest.approx(samples["peft"].logprobs, abs=1e-5)
    # a state saved on one loads into the other (dtensor's activation checkpointing wrapper is not in the names)
    reference.load_state(f"from-{backend}", tmp_path / backend, with_optimizer=True)
    assert reference.forward(f"from-{backend}", [sft_datum([60, 61, 62, 63])], "cross_entropy",
                             None).outputs[0]["logprobs"] == pytest.approx(after[backend], abs=1e-5)
    for engine in engines.values():
        engine.delete("same")
    reference.delete(f"from-{backend}")


def test_two_adapters_interleaved_on_the_dtensor_engine_equal_each_alone(opened: Opened, tmp_path: Path) -> None:
    engine = opened.engine
    spec_a = LoraSpec(rank=4, seed=61)
    spec_b = LoraSpec(rank=8, train_mlp=False, train_unembed=True, seed=62)
    batches_b = list(reversed(BATCHES))
    losses_a, losses_b = interleave(engine, spec_a, spec_b, batches_b)
    interleaved = {"a": weights_of(engine, "inter-a", tmp_path / "ia"), "b": weights_of(engine, "inter-b", tmp_path / "ib")}
    engine.delete("inter-a")
    engine.delete("inter-b")
    for name, spec, batches, losses in (("a", spec_a, BATCHES, losses_a), ("b", spec_b, batches_b, losses_b)):
        engine.create(f"alone-{name}", spec)
        assert run_steps(engine, f"alone-{name}", batches) == pytest.approx(losses, abs=1e-6)
        assert_same(weights_of(engine, f"alone-{name}", tmp_path / name), interleaved[name])
        assert engine.info(f"alone-{name}")["steps"] == len(BATCHES)
        engine.delete(f"alone-{name}")
