"""LoRA (policy.lora) in process: every core algorithm trains only the adapter, the KL reference is
the policy with its adapter off (no reference engine, its memory saved), checkpoints hold the
adapter and its optimizer state and resume exactly, final/ is a PEFT adapter folder, and the
merged export computes what the adapter does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.plugin_manager import PluginHost
from corerl.reporting.console import make_console
from corerl.run.context import RunContext
from corerl.testing.conformance import conformance_batch, conformance_loss

ALGORITHMS = {
    "sft": {"data": {"task": "digit_echo"}},
    "grpo": {"data": {"task": "digit_echo"}, "algorithm": {"kl_penalty": 0.05}},
    "ppo": {"data": {"task": "digit_echo"}, "algorithm": {"kl_penalty": 0.05}},
    "dpo": {"data": {"task": "digit_preference"}, "algorithm": {"dpo": {"precompute_reference_logprobs": False}}},
}


def _context(tmp_path: Path, name: str, lora: bool, host: PluginHost) -> RunContext:
    extra = ALGORITHMS[name]
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                   "max_seq_length": 64, "optimizer": {"lr": 0.01},
                   "lora": {"enabled": lora, "dim": 4, "alpha": 8}},
        "algorithm": {"name": name, "batch_size": 4, "num_generations_per_prompt": 2, "max_steps": 1,
                      **extra.get("algorithm", {})},
        "data": extra["data"],
        "run": {"output_dir": str(tmp_path), "name": f"{name}-{lora}", "tensorboard": False},
    }
    config = config_from_mapping(recipe, host)
    return RunContext.open(config, select(config, host), make_console(), host)


def _held_bytes(engine) -> int:
    return sum(sum(rank.values()) for rank in engine.state_bytes())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_core_algorithm_trains_only_the_adapter(tmp_path, name):
    host = PluginHost(env={})
    context = _context(tmp_path, name, True, host)
    try:
        context.start_engines()
        training = context.training
        assert training.adapter_only
        algorithm = context.selection.algorithm.registration.load()(context)
        algorithm.begin()
        probe = conformance_batch()
        base_before = training.base_logprobs(probe)
        adapter_before = training.adapter_weights().tensors()
        algorithm.step()
        adapter_after = training.adapter_weights().tensors()
        assert adapter_before.keys() == adapter_after.keys() and all(".lora_" in k for k in adapter_after)
        assert max(float((adapter_after[k] - adapter_before[k]).abs().max()) for k in adapter_after) > 0
        assert torch.equal(training.base_logprobs(probe), base_before)  # the frozen base did not move
        if name != "sft":  # the reference (KL, DPO's) is the policy with its adapter off: no engine of its own
            policy_engines = [e for e in context.started if getattr(getattr(e, "config", None), "role", None) == "policy"
                              and hasattr(e, "logprobs")]
            assert policy_engines == [training]
    finally:
        context.close(run_failed=False)


def test_the_reference_is_the_adapter_off_policy_and_its_memory_is_saved(tmp_path):
    host = PluginHost(env={})
    held = {}
    for lora in (False, True):
        context = _context(tmp_path, "grpo", lora, host)
        try:
            context.start_engines()
            algorithm = context.selection.algorithm.registration.load()(context)
            algorithm.begin()
            algorithm.step()
            reference = algorithm.grpo.reference
            probe = conformance_batch()
            if lora:  # scores with the base: what the policy was before its adapter trained
                assert torch.equal(reference.logprobs(probe), context.training.base_logprobs(probe))
                assert not torch.equal(reference.logprobs(probe), context.training.logprobs(probe))
            training_engines = [e for e in context.started if hasattr(e, "state_bytes")]
            held[lora] = sum(_held_bytes(e) for e in training_engines)
            counts = (len(training_engines), held[lora])
            assert counts[0] == (1 if lora else 2), counts  # the policy alone, or the policy and a frozen copy
        finally:
            context.close(run_failed=False)
    # no second copy of the weights, and optimizer state for the adapter alone
    assert held[True] < 0.6 * held[False], held


def _engine(tmp_path: Path, optimizer: dict | None = None, **lora):
    from corerl.models.tiny import build_tiny_model
    from corerl.testing import host_with, select_for, write_recipe

    model = build_tiny_model(tmp_path / "model", hidden_size=64)
    recipe = write_recipe(tmp_path / "lora.yaml", {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": str(model), "generation": {"backend": "hf"}, "max_grad_norm": 1.0,
                   "optimizer": optimizer or {"name": "adamw", "lr": 0.01},
                   "lora": {"enabled": True, "dim": 4, "alpha": 8, **lora}},
        "algorithm": {"max_steps": 8},
    })
    config, selection = select_for(host_with(None, "lora-test"), recipe, [])
    return str(model), config, selection.training_backend.registration.create(config=config)


def test_a_checkpoint_holds_the_adapter_and_its_optimizer_state_and_resumes_exactly(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    model, _, engine = _engine(tmp_path)
    first, second = conformance_batch(seed=0), conformance_batch(seed=1)
    try:
        engine.load_hf(model)
        engine.train_step(first, conformance_loss)
        engine.save_checkpoint(str(tmp_path / "ckpt"))
        straight = [engine.train_step(b, conformance_loss).loss for b in (second, first)]
        straight_adapter = engine.adapter_weights().tensors()
        engine.load_hf(model)  # a fresh base, adapter and optimizer
        engine.load_checkpoint(str(tmp_path / "ckpt"))
        resumed = [engine.train_step(b, conformance_loss).loss for b in (second, first)]
        resumed_adapter = engine.adapter_weights().tensors()
    finally:
        engine.shutdown()
    assert resumed == straight
    assert all(torch.equal(straight_adapter[k], resumed_adapter[k]) for k in straight_adapter)
    saved = FileSystemReader(str(tmp_path / "ckpt" / "weights")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys), model_keys[:5]
    # a whole model's checkpoint holds its weights and AdamW's two moments: three times the model
    weights_bytes = sum(p.stat().st_size for p in (tmp_path / "ckpt" / "weights").rglob("*") if p.is_file())
    model_bytes = (Path(model) / "model.safetensors").stat().st_size
    assert weights_bytes < model_bytes, (weights_bytes, model_bytes)


def test_final_is_a_peft_adapter_and_the_merged_export_computes_the_same(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from corerl.testing.reference import hf_logprobs
    from corerl.training.final_export import export_final

    model, config, engine = _engine(tmp_path)
    batch = conformance_batch()
    try:
        engine.load_hf(model)
        for _ in range(3):
            engine.train_step(batch, conformance_loss)
        ours = engine.logprobs(batch)
        config.core.checkpointing.merge_lora_on_export = True
        export_final(engine, config, tmp_path / "final")
    finally:
        engine.shutdown()
    final = tmp_path / "final"
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= {p.name for p in final.iterdir()}
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), str(final))
    assert float((hf_logprobs(adapted, batch) - ours).abs().max()) <= 1e-5
    merged = AutoModelForCausalLM.from_pretrained(str(final / "merged"), dtype=torch.float32)
    assert float((hf_logprobs(merged, batch) - ours).abs().max()) <= 1e-4
    base = hf_logprobs(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), batch)
    assert float((base - ours).abs().max()) > 1e-3  # the adapter trained


def test_lora_settings_become_peft_config():
    from corerl.config.schema import LoraConfig
    from corerl.lora.adapter import peft_config

    every = peft_config(LoraConfig(enabled=True, dim=16, alpha=64, dropout=0.25, exclude_modules=["o_proj"]))
    assert (every.r, every.lora_alpha, every.lora_dropout, every.target_modules, set(every.exclude_modules)) == \
        (16, 64, 0.25, "all-linear", {"o_proj"})
    assert (every.bias, every.use_rslora) == ("none", False)  # the update is (alpha / dim) B A x, no bias
    some = peft_config(LoraConfig(enabled=True, match_all_linear=False, target_modules=["q_proj", "v_proj"]))
    assert set(some.target_modules) == {"q_proj", "v_proj"}


def test_lora_dropout_acts_on_the_adapter_in_training_and_nowhere_else(tmp_path):
    """``policy.lora.dropout`` reaches the adapter: at 0.5 a training step's adapter is not the plain
    PEFT step's without dropout (the masks change B's gradient), at 0 it is (from the same starting
    adapter); outside training nothing is dropped (two logprob passes agree once the adapter computes
    something), and the exported ``adapter_config.json`` says the recipe's dropout."""
    import json

    import attrs

    from corerl.testing.reference import reference_lora_steps

    batch = conformance_batch()
    from_plain = {}
    for dropout in (0.0, 0.5):
        folder = tmp_path / f"dropout-{dropout}"
        model, config, engine = _engine(folder, {"name": "sgd", "lr": 0.5, "momentum": 0.9}, dropout=dropout)
        try:
            engine.load_hf(model)
            start = engine.adapter_weights().tensors()
            result = engine.train_step(batch, conformance_loss)
            trained = engine.adapter_weights().tensors()
            once, twice = engine.logprobs(batch), engine.logprobs(batch)
            engine.export_adapter(str(folder / "adapter"))
        finally:
            engine.shutdown()
        assert torch.equal(once, twice), f"dropout {dropout}: logprobs outside training are not deterministic"
        plain = attrs.evolve(config.core.policy.lora, dropout=0.0)
        _, reference = reference_lora_steps(model, batch, conformance_loss, plain, start, [result.lr])
        assert trained.keys() == reference.keys()
        from_plain[dropout] = max(float((trained[k] - reference[k]).abs().max()) for k in reference)
        written = json.loads((folder / "adapter" / "adapter_config.json").read_text())
        assert written["lora_dropout"] == dropout, written
    assert from_plain[0.0] <= 1e-5, from_plain  # no dropout: the plain PEFT step
    assert from_plain[0.5] > 1e-3, from_plain  # dropout 0.5 on the adapter's input while training
