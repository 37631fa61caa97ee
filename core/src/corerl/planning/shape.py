"""What a memory estimate needs to know of a model, read from its Hugging Face ``config.json``
(no weights, no transformers import: ``corerl plan`` stays fast on any machine)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from corerl.errors import ConfigError


@attrs.frozen
class ModelShape:
    """A dense Llama/Qwen2-style decoder: sizes, tying, biases, and the parameter counts derived
    from them (exact for those families: the same arithmetic the weights add up to)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    max_positions: int = 4096
    name: str = "model"

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "model") -> ModelShape:
        """The shape of a Hugging Face config dict (a causal LM's ``config.json``)."""
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            qkv_bias = config.get("attention_bias", config.get("model_type") == "qwen2")
            return cls(hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or hidden // heads),
                       intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                       tied=bool(config.get("tie_word_embeddings", False)), qkv_bias=bool(qkv_bias),
                       max_positions=int(config.get("max_position_embeddings") or 4096), name=name)
        except KeyError as exc:
            raise ConfigError(f"{name}: config.json lacks {exc.args[0]!r}, which the memory estimate needs",
                              hint="corerl plan reads dense Llama/Qwen2-style decoders") from None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        """The shape of the Hugging Face checkpoint folder ``folder`` (its ``config.json`` only)."""
        path = Path(folder) / "config.json"
        if not path.exists():
            raise ConfigError(f"{folder} holds no config.json (a Hugging Face checkpoint folder has one)",
                              key="policy.model_name", hint="give a local checkpoint folder; no weights are needed")
        return cls.from_hf_config(json.loads(path.read_text()), name=Path(folder).name)

    @classmethod
    def of_model(cls, model_name: str) -> ModelShape:
        """The shape of ``policy.model_name``: a built-in model's spec, or a checkpoint folder."""
        from corerl.models.tiny import BUILTIN_MODELS

        spec = BUILTIN_MODELS.get(model_name)
        if spec is None:
            return cls.from_folder(model_name)
        hidden, heads = spec["hidden_size"], spec["num_heads"]
        return cls(hidden=hidden, layers=spec["num_layers"], heads=heads, kv_heads=spec["num_kv_heads"],
                   head_dim=hidden // heads, intermediate=2 * hidden, vocab=spec["vocab_size"], tied=True,
                   qkv_bias=True, max_positions=2048, name=model_name)

    # -- parameter counts ------------------------------------------------------------------

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def attention_split(self) -> int:
        """Attention weights a tensor-parallel split divides (q, k, v with their biases, o)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return self.hidden * (q + 2 * kv) + bias + q * self.hidden

    @property
    def mlp(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def layer_norms(self) -> int:
        """The two norms of a layer: replicated across tensor-parallel ranks."""
        return 2 * self.hidden

    @property
    def per_layer(self) -> int:
        return self.attention_split + self.mlp + self.layer_norms

    @property
    def output_layer(self) -> int:
        """The untied output projection (0 when it is the embedding)."""
        return 0 if self.tied else self.embedding

    @property
    def parameters(self) -> int:
        """Every parameter: embedding, layers, final norm and (untied) output projection."""
        return self.embedding + self.layers * self.per_layer + self.hidden + self.output_layer

    def replicated(self, layers: int | None = None) -> int:
        """Parameters tensor parallelism does not split in ``layers`` layers (their norms, and the
        final norm)."""
        return (self.layers if layers is None else layers) * self.layer_norms + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes over all layers (keys and values)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def describe(self) -> str:
        return f"{self.name}: {self.parameters / 1e9:.2f}B parameters ({self.layers} layers, hidden {self.hidden})"
