"""The megatron backend's own LoRA adapters (corerl_megatron.training.lora) against PEFT's on the
same tiny model as a Hugging Face model: one megatron rank in this process (gloo, world size 1).
Tensor and pipeline parallelism are checked by the conformance suite's LoRA check at TP=2 and PP=2
(two optimizer steps against plain PEFT steps, plugins/megatron/tests/test_megatron_conformance.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from corerl.errors import ConfigError, EngineNotAvailable
from tests.megatron_recipe import megatron_config

LORA = ["policy.lora.enabled=true", "policy.lora.dim=4", "policy.lora.alpha=8", "policy.lora.match_all_linear=false",
        # k_proj and up_proj left out: their rows of the fused layers get no adapter
        "policy.lora.target_modules=[q_proj,v_proj,o_proj,gate_proj,down_proj]"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    # grouped-query attention (4 heads over 2 key/value heads): linear_qkv interleaves q, k, v per group
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), family="llama", hidden_size=64, num_layers=2,
                                num_heads=4, num_kv_heads=2))


@pytest.fixture(scope="module")
def worker(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A megatron rank in this process (world size 1), its adapters set to random non-zero values."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from corerl.sdk import free_port
    from corerl_megatron.training.worker import MegatronWorker

    config = megatron_config(model_dir, tmp_path_factory.mktemp("recipe"), LORA)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MASTER_ADDR", "127.0.0.1")
        patch.setenv("MASTER_PORT", str(free_port()))
        rank = MegatronWorker(rank=0, world_size=1, config=config, threads=1,
                              checkpoint_dir=str(tmp_path_factory.mktemp("conversions")))
        try:
            rank.load_hf(model_dir)
            generator = torch.Generator().manual_seed(3)
            with torch.no_grad():
                for name, param in rank.model.module.named_parameters():
                    if ".lora_B." in name:
                        param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            yield rank
        finally:
            parallel_state.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()


def _peft_model(model_dir: str, worker: Any, adapter: dict[str, torch.Tensor]) -> Any:
    """The Hugging Face model wrapped by PEFT as policy.lora says, holding ``adapter``."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from corerl.lora.adapter import peft_config

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(hf, peft_config(worker.config.core.policy.lora, model_dir))
    assert set(get_peft_model_state_dict(model)) == set(adapter)  # PEFT's names and adapted modules exactly
    set_peft_model_state_dict(model, adapter)
    return model


def _megatron_logits(worker: Any, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    return worker.model.module(ids, positions, attention_mask=None)


def test_adapters_give_peft_logits_and_gradients(worker: Any, model_dir: str) -> None:
    from corerl_megatron.training.lora import peft_tensors

    adapter = worker.adapter_state()
    assert adapter is not None and not any("k_proj" in n or "up_proj" in n for n in adapter)
    assert any(".q_proj.lora_B." in n for n in adapter) and all(n.startswith("base_model.model.model.layers.")
                                                                for n in adapter)
    reference = _peft_model(model_dir, worker, adapter)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    weights = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(6))
    # as train_step does: after an optimizer step each param.grad is its main_grad (megatron's
    # optimizer points it there), and a backward would then add each gradient twice
    worker.model.zero_grad_buffer()
    worker.optimizer.zero_grad()
    ours = _megatron_logits(worker, ids)
    (ours * weights).sum().backward()
    theirs = reference(input_ids=ids).logits
    (theirs * weights).sum().backward()
    assert (ours - theirs).abs().max() < 1e-4
    plain = reference.get_base_model()
    with reference.disable_adapter():  # the adapters matter: the base model's logits are far off
        assert (plain(input_ids=ids).logits - theirs).abs().max() > 1e-2
    group = worker.ps.get_tensor_model_parallel_group()
    grads = peft_tensors(worker.model.module, worker.layout.numbering, group, 1, of=lambda p: p.main_grad)
    named = {n.replace(".default.", "."): p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert set(named) == set(grads)  # only the adapters take gradients, on both
    worst = max((grads[n] - named[n]).abs().max() / named[n].abs().max() for n in named)
    assert worst < 1e-4, f"adapter gradients differ from PEFT's by {worst:.3g} (relative)"
    assert not any(p.requires_grad for n, p in worker.model.module.named_parameters() if ".lora_" not in n)
    worker.model.zero_grad_buffer()


def _train_step(worker: Any) -> dict[str, torch.Tensor]:
    """One optimizer step on a fixed micro-batch; returns the micro-batch."""
    ids = torch.randint(1, 128, (2, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[:, 0] = 0  # position 0 holds no logprob
    mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}

    def loss_fn(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float) -> tuple[Any, dict]:
        return -(logprobs * batch["loss_mask"]).sum() / normaliser, {}

    worker.train_step([mb], loss_fn, float(ids.numel()))
    return mb


def test_a_step_trains_only_the_adapters_and_the_export_is_the_merged_model(worker: Any, model_dir: str,
                                                                             tmp_path: Path) -> None:
    from transformers import AutoConfig

    from corerl.lora.adapter import base_hf_state, config_dict, merged_hf_state
    from corerl_megatron.conversion.convert import megatron_to_hf

    module = worker.model.module
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    mb = _train_step(worker)
    ids = mb["input_ids"]
    after = dict(module.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved and all(".lora_" in n for n in moved), sorted(moved)[:3]
    assert any(".lora_A." in n for n in moved) and any(".lora_B." in n for n in moved)
    # the weights a generation engine gets whole (and final/merged): W + scale B A, as PEFT merges
    adapter = worker.adapter_state()
    merged = megatron_to_hf(worker.full_state_dict(), worker.family, worker.shape)
    from safetensors.torch import load_file

    base = load_file(str(Path(model_dir) / "model.safetensors"))
    hf_config = AutoConfig.from_pretrained(model_dir)
    expected = merged_hf_state(base_hf_state(base), adapter, hf_config,
                               config_dict(worker.config.core.policy.lora, model_dir))
    assert set(merged) <= set(expected)
    worst = max((merged[n] - expected[n]).abs().max() for n in merged)
    assert worst < 1e-5
    q = "model.layers.1.self_attn.q_proj"
    scale = worker.config.core.policy.lora.alpha / worker.config.core.policy.lora.dim
    by_hand = base[f"{q}.weight"] + scale * adapter[f"base_model.model.{q}.lora_B.weight"] @ adapter[
        f"base_model.model.{q}.lora_A.weight"]
    assert torch.allclose(merged[f"{q}.weight"], by_hand, atol=1e-6)
    k = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(merged[k], base[k])  # not a target: untouched
    # the KL reference: the base model's logprobs, the adapters switched off for the call only
    plain = worker.base_logprobs([mb])[0]
    tuned = worker.logprobs([mb])[0]
    assert (plain - tuned).abs().max() > 1e-3
    with torch.no_grad():
        from transformers import AutoModelForCausalLM

        from corerl.sdk import batch_logprobs

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        expected_plain = batch_logprobs(hf(input_ids=ids).logits, dict(mb), mb["attention_mask"])
    assert (plain - expected_plain).abs().max() < 1e-4


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state(worker: Any, tmp_path: Path) -> None:
    from corerl.sdk import load_plain

    # its own step: under xdist this test may run in a process where the step test above did not
    _train_step(worker)
    sidecar = worker.save_state(str(tmp_path))
    saved = load_plain(str(tmp_path / "megatron_rank0.pt"))
    assert saved["model"] and all(".lora_" in n for n in saved["model"])  # the frozen base is read again at load_hf
    module = worker.model.module
    trained = {n: p.detach().clone() for n, p in module.named_parameters() if ".lora_" in n}
    inner = worker.optimizer.optimizer  # only the adapters are in the optimizer, each with state from the step
    assert [len(g["params"]) for g in inner.param_groups] == [len(trained)] and len(inner.state) == len(trained)
    moments = {id(p): {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in inner.state.items()}
    with torch.no_grad():
        for name, param in module.named_parameters():
            if ".lora_" in name:
                param.zero_()
        for values in inner.state.values():
            for value in values.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    value.zero_()
    worker.load_state(str(tmp_path), sidecar)
    assert all(torch.equal(p.detach(), trained[n]) for n, p in module.named_parameters() if ".lora_" in n)
    restored = {id(p): s for p, s in worker.optimizer.optimizer.state.items()}
    assert restored.keys() == moments.keys()
    assert all(torch.equal(restored[i][k], v) for i, kept in moments.items() for k, v in kept.items())


def test_targets_map_to_megatron_layers() -> None:
    from corerl_megatron.lora_targets import chosen

    class Lora:
        def __init__(self, targets: list[str], every: bool = False, exclude: tuple[str, ...] = ()) -> None:
            self.target_modules, self.match_all_linear, self.exclude_modules = targets, every, list(exclude)

    assert chosen(Lora(["q_proj", "v_proj"]), 2) == {(i, "self_attention.linear_qkv"): ("self_attn.q_proj",
                                                                                       "self_attn.v_proj")
                                                    for i in range(2)}
    assert chosen(Lora(["linear_fc1"]), 1) == {(0, "mlp.linear_fc1"): ("mlp.gate_proj", "mlp.up_proj")}
    every = chosen(Lora(["all-linear"]), 1)
    assert sum(len(p) for p in every.values()) == 7 and every == chosen(Lora([], every=True), 1)
    assert chosen(Lora(["layers.1.mlp.down_proj"]), 2) == {(1, "mlp.linear_fc2"): ("mlp.down_proj",)}
    assert (0, "self_attention.linear_proj") not in chosen(Lora([], every=True, exclude=("o_proj",)), 1)


FUSED = ["policy.lora.enabled=true", "policy.lora.dim=4", "policy.lora.alpha=8", "policy.megatron_cfg.lora_type=lora"]


@pytest.fixture(scope="module")
def fused_worker(worker: Any, model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second rank in this process (the first one's parallel state) with lora_type: lora, every layer
    adapted, its adapters' B random."""
    from corerl_megatron.training.worker import MegatronWorker

    config = megatron_config(model_dir, tmp_path_factory.mktemp("fused"), FUSED)
    rank = MegatronWorker(rank=0, world_size=1, config=config, threads=1,
                          checkpoint_dir=str(tmp_path_factory.mktemp("fused-conversions")))
    rank.load_hf(model_dir)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, param in rank.model.module.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return rank


def test_fused_adapters_are_peft_adapters_sharing_a_and_give_their_logits_and_gradients(fused_worker: Any,
                                                                                      model_dir: str) -> None:
    """lora_type: lora (Megatron-Bridge's LoRA): one A and B over linear_qkv's and linear_fc1's rows.
    As PEFT adapters that is q, k, v (gate, up) with one A between them and B's rows split: the same
    function, and A's gradient the sum of theirs."""
    from corerl_megatron.training.lora import peft_tensors

    worker = fused_worker
    assert sum(".lora_A." in n for n, _ in worker.model.module.named_parameters()) == 2 * 4  # four adapters a layer
    adapter = worker.adapter_state()
    for i in range(2):
        a = {p: adapter[f"base_model.model.model.layers.{i}.{p}.lora_A.weight"]
             for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")}
        assert torch.equal(a["self_attn.q_proj"], a["self_attn.v_proj"]) and torch.equal(a["mlp.gate_proj"],
                                                                                         a["mlp.up_proj"])
    reference = _peft_model(model_dir, worker, adapter)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    weights = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(6))
    # as train_step does: after an optimizer step each param.grad is its main_grad (megatron's
    # optimizer points it there), and a backward would then add each gradient twice
    worker.model.zero_grad_buffer()
    worker.optimizer.zero_grad()
    ours = _megatron_logits(worker, ids)
    (ours * weights).sum().backward()
    theirs = reference(input_ids=ids).logits
    (theirs * weights).sum().backward()
    assert (ours - theirs).abs().max() < 1e-4
    grads = peft_tensors(worker.model.module, worker.layout.numbering, worker.ps.get_tensor_model_parallel_group(), 1,
                         of=lambda p: p.main_grad)
    named = {n.replace(".default.", "."): p.grad for n, p in reference.named_parameters() if p.grad is not None}
    expected = dict(named)
    for i in range(2):  # the shared A's gradient: the sum of the projections' A gradients
        for group in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
            names = [f"base_model.model.model.layers.{i}.{p}.lora_A.weight" for p in group]
            total = sum(named[n] for n in names)
            expected.update({n: total for n in names})
    assert set(grads) == set(expected)
    worst = max((grads[n] - expected[n]).abs().max() / expected[n].abs().max() for n in expected)
    assert worst < 1e-4, f"adapter gradients differ from PEFT's by {worst:.3g} (relative)"
    worker.model.zero_grad_buffer()


def test_fused_adapters_merge_as_peft_merges_them(fused_worker: Any, model_dir: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from corerl.lora.adapter import base_hf_state, config_dict, merged_hf_state
    from corerl_megatron.conversion.convert import megatron_to_hf

    worker = fused_worker
    merged = megatron_to_hf(worker.full_state_dict(), worker.family, worker.shape)
    expected = merged_hf_state(base_hf_state(load_file(str(Path(model_dir) / "model.safetensors"))),
                               worker.adapter_state(), AutoConfig.from_pretrained(model_dir),
                               config_dict(worker.config.core.policy.lora, model_dir))
    assert max((merged[n] - expected[n]).abs().max() for n in merged) < 1e-5


REFUSED = [
    (["policy.megatron_cfg.lora_type=lora", "policy.lora.match_all_linear=false", "policy.lora.target_modules=[q_proj]"],
     "builtin:tiny-qwen2", ConfigError, "policy.lora.target_modules", "linear_qkv one adapter over all its"),
    (["policy.lora.match_all_linear=false", "policy.lora.target_modules=[q_proj,lm_head]"], "builtin:tiny-qwen2",
     ConfigError, "policy.lora.target_modules", "'lm_head' names no linear layer"),
    ([], "builtin:tiny-moe", EngineNotAvailable, "policy.lora.enabled", "dense decoder layers only"),
    (["policy.lora.dropout=0.1", "policy.megatron_cfg.tensor_model_parallel_size=2", "cluster.gpus_per_node=2"],
     "builtin:tiny-qwen2", EngineNotAvailable, "policy.lora.dropout", "dropout with tensor parallelism"),
]


@pytest.mark.parametrize(("overrides", "model", "error", "key", "said"), REFUSED)
def test_what_the_adapters_do_not_cover_is_refused_in_one_line(tmp_path, overrides, model, error, key, said) -> None:
    from corerl_megatron.support import check_supported

    with pytest.raises(error) as raised:
        check_supported(megatron_config(model, tmp_path, ["policy.lora.enabled=true", *overrides]))
    assert raised.value.key == key and said in str(raised.value) and "\n" not in str(raised.value)


def test_a_dense_lora_recipe_is_taken(tmp_path) -> None:
    from corerl_megatron.support import check_supported

    check_supported(megatron_config("builtin:tiny-qwen2", tmp_path, [*LORA, "policy.megatron_cfg.tensor_model_parallel_size=2",
                                                             "cluster.gpus_per_node=2"]))



def test_wildcard_targets_match_whole_names_as_megatron_bridge_writes_them() -> None:
    from corerl_megatron.lora_targets import chosen

    class Lora:
        target_modules, match_all_linear, exclude_modules = ["*self_attn*"], False, ["*layers.1.*"]

    assert chosen(Lora(), 2) == {(0, "self_attention.linear_qkv"): ("self_attn.q_proj", "self_attn.k_proj",
                                                                   "self_attn.v_proj"),
                                 (0, "self_attention.linear_proj"): ("self_attn.o_proj",)}


def test_sequence_parallelism_is_refused_with_lora_on_any_machine(tmp_path) -> None:
    from corerl_megatron.support import check_supported

    with pytest.raises(EngineNotAvailable) as raised:
        check_supported(megatron_config("builtin:tiny-qwen2", tmp_path, [
            "policy.lora.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=2",
            "policy.megatron_cfg.sequence_parallel=true", "cluster.gpus_per_node=2"]))
    assert raised.value.key == "policy.megatron_cfg.sequence_parallel" and "LoRA adapters" in str(raised.value)


def test_a_nemo_rl_peft_section_naming_targets_adapts_those_only(tmp_path) -> None:
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    base = Path(__file__).resolve().parents[3] / "tests" / "data" / "nemo_rl" / "base_grpo.yaml"
    recipe = tmp_path / "megatron_lora.yaml"
    head = (f"defaults: {base}\npolicy:\n  dtensor_cfg:\n    enabled: false\n  megatron_cfg:\n    enabled: true\n"
            "    tensor_model_parallel_size: 1\n    peft:\n      enabled: true\n      dim: 8\n      alpha: 16\n")
    recipe.write_text(head + "      target_modules: [linear_qkv]\n")
    lora = load_config(recipe, [], PluginHost()).core.policy.lora
    assert (lora.enabled, lora.target_modules, lora.match_all_linear) == (True, ["linear_qkv"], False)
    recipe.write_text(head)  # no targets: every linear layer, as in Megatron-Bridge
    config = load_config(recipe, [], PluginHost())
    assert config.core.policy.lora.match_all_linear
    assert config.section("policy.megatron_cfg").lora_type == "lora"  # Megatron-Bridge's LoRA, as NeMo RL builds it


def test_a_skyrl_megatron_lora_script_gets_skyrl_s_lora_type(tmp_path) -> None:
    from corerl.config import load_config
    from corerl.errors import ConfigErrors
    from corerl.plugin_manager import PluginHost

    script = tmp_path / "run_lora.sh"
    script.write_text("uv run -m skyrl.train.entrypoints.main_base trainer.strategy=megatron "
                      "trainer.policy.model.path=builtin:tiny-qwen2 trainer.policy.model.lora.rank=8 \"$@\"\n")
    key = "trainer.policy.megatron_config.lora_config.lora_type"
    assert load_config(script, [], PluginHost(), environ={}).section("policy.megatron_cfg").lora_type == "lora"
    said = load_config(script, [f"{key}=canonical_lora"], PluginHost(), environ={})
    assert said.section("policy.megatron_cfg").lora_type == "canonical_lora"
    with pytest.raises(ConfigErrors, match="'dora' LoRA type is not built into"):
        load_config(script, [f"{key}=dora"], PluginHost(), environ={})


def test_a_mixture_of_experts_is_refused_at_load_where_validation_could_not_read_it(worker, tmp_path) -> None:
    """A hub model's config is read first at start-up: the rank refuses it there, in one line."""
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
    from corerl_megatron.training.worker import MegatronWorker

    folder = str(build_tiny_model(tmp_path / "moe", **BUILTIN_MODELS["builtin:tiny-moe"]))
    rank = MegatronWorker(rank=0, world_size=1, config=megatron_config("builtin:tiny-qwen2", tmp_path, LORA), threads=1,
                          checkpoint_dir=str(tmp_path / "conversions"))  # the process's parallel state, as it is
    with pytest.raises(EngineNotAvailable) as raised:
        rank.load_hf(folder)
    assert raised.value.key == "policy.lora.enabled" and "mixture of experts" in str(raised.value)


def test_the_exported_adapter_folder_loads_with_peft_and_gives_our_logits(worker: Any, model_dir: str,
                                                                          tmp_path: Path) -> None:
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    worker.export_adapter(str(tmp_path / "adapter"))
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(written["target_modules"]) == ["down_proj", "gate_proj", "o_proj", "q_proj", "v_proj"]
    assert (written["r"], written["lora_alpha"]) == (4, 8)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(hf, str(tmp_path / "adapter"))
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        assert (loaded(input_ids=ids).logits - _megatron_logits(worker, ids)).abs().max() < 1e-4


def test_peft_and_vllm_read_the_targets_by_their_hugging_face_names() -> None:
    from corerl_megatron.lora_targets import peft_targets

    class Lora:
        def __init__(self, targets: list[str], every: bool = False, exclude: tuple[str, ...] = ()) -> None:
            self.target_modules, self.match_all_linear, self.exclude_modules = targets, every, list(exclude)

    assert peft_targets(Lora(["linear_qkv"]), 2) == ["k_proj", "q_proj", "v_proj"]
    assert peft_targets(Lora([], every=True), 2) == peft_targets(Lora(["linear_qkv", "linear_proj", "linear_fc1",
                                                                       "linear_fc2"]), 2) == "all-linear"
    assert peft_targets(Lora(["*"], exclude=("*layers.1.*",)), 2) == ["down_proj", "gate_proj", "k_proj", "o_proj",
                                                                     "q_proj", "up_proj", "v_proj"]


TP2 = ["policy.megatron_cfg.tensor_model_parallel_size=2", "cluster.gpus_per_node=2"]


def _against_peft(worker: Any, model_dir: str) -> dict[str, float] | None:
    """Every rank calls it (collectives): the largest differences from PEFT of the logits, the adapter
    gradients (relative; a fused A's against the sum of its projections') and the merged weights,
    on the first rank, and the optimizer's gradient norm against theirs; None elsewhere. The adapters'
    B are random first (a split B differs by rank)."""
    import zlib

    from safetensors.torch import load_file
    from transformers import AutoConfig

    from corerl.lora.adapter import base_hf_state, config_dict, merged_hf_state
    from corerl_megatron.conversion.convert import megatron_to_hf
    from corerl_megatron.training.lora import peft_tensors

    with torch.no_grad():
        for name, param in worker.model.module.named_parameters():
            if ".lora_B." in name:
                split = param.tensor_model_parallel
                seed = zlib.crc32(name.encode()) + (worker.tp_rank if split else 0)
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * 0.2)
    adapter = worker.adapter_state()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    weights = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(6))
    # as train_step does: after an optimizer step each param.grad is its main_grad (megatron's
    # optimizer points it there), and a backward would then add each gradient twice
    worker.model.zero_grad_buffer()
    worker.optimizer.zero_grad()
    ours = _megatron_logits(worker, ids)
    (ours * weights).sum().backward()
    grads = peft_tensors(worker.model.module, worker.layout.numbering, worker.ps.get_tensor_model_parallel_group(),
                         worker.tp, of=lambda p: p.main_grad)
    worker.optimizer.prepare_grads()  # the main gradients the optimizer clips by, and their norm
    norm = float(worker.optimizer.get_grad_norm())
    merged = worker.full_state_dict()
    if worker.rank != 0:
        return None
    reference = _peft_model(model_dir, worker, adapter)
    theirs = reference(input_ids=ids).logits
    (theirs * weights).sum().backward()
    named = {n.replace(".default.", "."): p.grad for n, p in reference.named_parameters() if p.grad is not None}
    expected = dict(named)
    if worker.settings.lora_type == "lora":
        for parent in {n.rsplit(".", 3)[0] for n in named}:  # ...layers.0.self_attn, ...layers.0.mlp
            for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
                names = [f"{parent}.{p}.lora_A.weight" for p in group]
                if all(n in named for n in names):
                    expected.update({n: sum(named[m] for m in names) for n in names})
    assert set(grads) == set(expected)
    shared = ("k_proj.lora_A", "v_proj.lora_A", "up_proj.lora_A") if worker.settings.lora_type == "lora" else ()
    want_norm = sum(float(g.square().sum()) for n, g in expected.items() if not any(x in n for x in shared)) ** 0.5
    hf = megatron_to_hf(merged, worker.family, worker.shape)
    want = merged_hf_state(base_hf_state(load_file(str(Path(model_dir) / "model.safetensors"))), adapter,
                           AutoConfig.from_pretrained(model_dir), config_dict(worker.config.core.policy.lora, model_dir))
    return {"logits": float((ours - theirs).abs().max()),
            "gradients": float(max((grads[n] - expected[n]).abs().max() / expected[n].abs().max() for n in expected)),
            "merged": float(max((hf[n] - want[n]).abs().max() for n in hf)),
            "grad_norm": abs(norm - want_norm) / want_norm}  # a replicated tensor counted once


def _tensor_parallel_rank(rank: int, model_dir: str, configs: dict[str, Any], port: int, out: str) -> None:
    """One of two gloo ranks (tensor parallel 2): both layouts' adapters against PEFT's."""
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from corerl_megatron.training.worker import MegatronWorker

    found = {}
    for kind, config in configs.items():
        worker = MegatronWorker(rank=rank, world_size=2, config=config, threads=1,
                                checkpoint_dir=str(Path(out).parent / f"conversions-{kind}"))
        worker.load_hf(model_dir)
        found[kind] = _against_peft(worker, model_dir)
    if rank == 0:
        Path(out).write_text(json.dumps(found))


def test_tensor_parallel_2_adapters_match_peft_on_two_ranks(model_dir: str, tmp_path: Path) -> None:
    """Column-parallel layers' B split by rows (a fused linear_fc1's as its [gate_r; up_r] weight), row-parallel
    layers' A split by columns, on 2 gloo ranks: logits, gradients, the gradient norm the optimizer clips by
    and the merged weights as PEFT's."""
    import json

    import torch.multiprocessing as mp

    from corerl.sdk import free_port

    configs = {"canonical_lora": megatron_config(model_dir, tmp_path / "c", [*LORA, *TP2]),
               "lora": megatron_config(model_dir, tmp_path / "f", [*FUSED, *TP2])}
    out = tmp_path / "found.json"
    mp.spawn(_tensor_parallel_rank, args=(model_dir, configs, free_port(), str(out)), nprocs=2)
    found = json.loads(out.read_text())
    for kind, diffs in found.items():
        assert diffs["logits"] < 1e-4 and diffs["gradients"] < 1e-4 and diffs["merged"] < 1e-5, (kind, diffs)
        assert diffs["grad_norm"] < 1e-5, (kind, diffs)
