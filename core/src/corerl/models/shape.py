"""What a memory estimate and validation need to know of a model, read from its Hugging Face
``config.json`` (no weights, no transformers import: ``corerl plan`` stays fast on any machine).
A model fact, below the engines and the planner (``corerl.planning.shape`` re-exports it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from corerl.errors import ConfigError

#: ``config.json`` keys that name a mixture-of-experts model's routed experts, by family
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
#: ``model_type``s whose router picks experts by sigmoid scores plus a per-expert bias
#: (``gate.e_score_correction_bias``: aux-loss-free balancing)
BIASED_ROUTER_TYPES = ("glm4_moe", "glm4_moe_lite", "deepseek_v3", "dots1")


@attrs.frozen
class ModelShape:
    """A Llama/Qwen2-style decoder, dense or a mixture of experts (Qwen2/3-MoE, Mixtral,
    DeepSeek-style): sizes, tying, biases, the experts, and the parameter counts derived from them
    (exact for the dense Llama/Qwen2 and the Qwen3-MoE/Mixtral families: the same arithmetic the
    weights add up to). ``experts`` is 0 on a dense model."""

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
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    moe_layers: int = 0
    qk_norm: bool = False
    #: the router adds a per-expert bias to its sigmoid scores to pick experts (``e_score_correction_bias``)
    router_bias: bool = False
    #: a vision-language checkpoint (its vision tower is not counted in this shape)
    vision: bool = False
    #: the checkpoint's ``model_type`` (a vision-language model's own, not its text config's); None: not said
    model_type: str | None = None

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts (a dense model is one with no experts)."""
        return self.experts > 1

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "model") -> ModelShape:
        """The shape of a Hugging Face config dict (a causal LM's ``config.json``; a vision-language
        model's language model, its ``text_config``: the vision tower is not counted)."""
        from corerl.models.hf_config import is_vision_language, text_config

        vision = is_vision_language(dict(config))
        model_type = dict(config).get("model_type")
        config = text_config(dict(config))
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            layers = int(config["num_hidden_layers"])
            qkv_bias = config.get("attention_bias", config.get("model_type") == "qwen2")
            experts = next((int(config[k]) for k in EXPERT_COUNT_KEYS if config.get(k)), 0)
            expert_intermediate = int(config.get("moe_intermediate_size") or config["intermediate_size"])
            return cls(hidden=hidden, layers=layers, heads=heads,
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or hidden // heads),
                       intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                       tied=bool(config.get("tie_word_embeddings", False)), qkv_bias=bool(qkv_bias),
                       max_positions=int(config.get("max_position_embeddings") or 4096), name=name,
                       experts=experts, experts_per_token=int(config.get("num_experts_per_tok") or 0),
                       expert_intermediate=expert_intermediate if experts else 0,
                       shared_experts=int(config.get("n_shared_experts") or 0),
                       moe_layers=_moe_layer_count(config, layers) if experts else 0,
                       qk_norm=config.get("model_type", "").startswith("qwen3") or bool(config.get("use_qk_norm")),
                       router_bias=bool(experts) and config.get("model_type") in BIASED_ROUTER_TYPES, vision=vision,
                       model_type=model_type)
        except KeyError as exc:
            raise ConfigError(f"{name}: config.json lacks {exc.args[0]!r}, which the memory estimate needs",
                              hint="corerl plan reads dense Llama/Qwen2-style decoders") from None

    @classmethod
    def from_folder(cls, folder: str | Path, overrides: Mapping[str, Any] | None = None) -> ModelShape:
        """The shape of the Hugging Face checkpoint folder ``folder`` (its ``config.json`` only,
        with ``overrides`` laid over it)."""
        path = Path(folder) / "config.json"
        if not path.exists():
            raise ConfigError(f"{folder} holds no config.json (a Hugging Face checkpoint folder has one)",
                              key="policy.model_name", hint="give a local checkpoint folder; no weights are needed")
        return cls.from_hf_config({**json.loads(path.read_text()), **(overrides or {})}, name=Path(folder).name)

    @classmethod
    def of_model(cls, model_name: str, overrides: Mapping[str, Any] | None = None) -> ModelShape:
        """The shape of ``policy.model_name``: a built-in model's spec, or a checkpoint folder
        (with ``overrides``, e.g. ``policy.hf_config_overrides``, laid over its config)."""
        from corerl.models.tiny import BUILTIN_MODELS, builtin_hf_config

        spec = BUILTIN_MODELS.get(model_name)
        if spec is None:
            from corerl.models.gguf import ensure_converted, gguf_source

            source = gguf_source(model_name, None)  # a .gguf file or a packaged model: its converted folder
            return cls.from_folder(str(ensure_converted(source)) if source else model_name, overrides)
        return cls.from_hf_config({**builtin_hf_config(model_name), **(overrides or {})}, name=model_name)

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
    def dense_mlp(self) -> int:
        """One dense MLP's weights (gate, up, down)."""
        return 3 * self.hidden * self.intermediate

    @property
    def expert(self) -> int:
        """One routed expert's weights (gate, up, down)."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def routed_experts(self) -> int:
        """All routed experts of one MoE layer: what expert parallelism divides."""
        return self.experts * self.expert

    @property
    def router(self) -> int:
        """One MoE layer's router (a linear map from the hidden state to a score per expert)."""
        return self.hidden * self.experts

    @property
    def mlp(self) -> float:
        """The MLP weights of an average layer: a dense MLP, or a MoE layer's experts, shared
        experts and router (MoE layers and dense ones averaged over the decoder)."""
        if not self.is_moe:
            return self.dense_mlp
        moe = self.routed_experts + self.shared_experts * self.expert + self.router
        dense_layers = self.layers - self.moe_layers
        return (self.moe_layers * moe + dense_layers * self.dense_mlp) / self.layers

    def mlp_split(self, expert_parallel: int = 1) -> float:
        """MLP weights per layer on one rank when the routed experts are split over
        ``expert_parallel`` ranks (the router and shared experts stay whole)."""
        if not self.is_moe:
            return self.mlp
        return self.mlp - self.moe_layers * self.routed_experts * (1 - 1 / expert_parallel) / self.layers

    @property
    def active_parameters(self) -> int:
        """Parameters one token passes through (its top-k experts, not all of them)."""
        if not self.is_moe:
            return self.parameters
        idle = self.moe_layers * (self.experts - self.experts_per_token) * self.expert
        return self.parameters - idle

    @property
    def layer_norms(self) -> int:
        """The two norms of a layer (and Qwen3's query/key norms): replicated across
        tensor-parallel ranks."""
        return 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

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
        return round(self.embedding + self.layers * self.per_layer + self.hidden + self.output_layer)

    def replicated(self, layers: int | None = None) -> int:
        """Parameters tensor parallelism does not split in ``layers`` layers (their norms, and the
        final norm)."""
        return (self.layers if layers is None else layers) * self.layer_norms + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes over all layers (keys and values)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def describe(self) -> str:
        experts = (f", {self.experts} experts, top-{self.experts_per_token}, "
                   f"{self.active_parameters / 1e9:.2f}B active" if self.is_moe else "")
        return (f"{self.name}: {self.parameters / 1e9:.2f}B parameters ({self.layers} layers, hidden "
                f"{self.hidden}{experts})")


def _moe_layer_count(config: Mapping[str, Any], layers: int) -> int:
    """How many decoder layers route to experts: Qwen's ``decoder_sparse_step`` and
    ``mlp_only_layers``, DeepSeek's ``first_k_dense_replace``; every layer otherwise (Mixtral)."""
    step = int(config.get("decoder_sparse_step") or 1)
    dense = set(config.get("mlp_only_layers") or [])
    first_dense = int(config.get("first_k_dense_replace") or 0)
    return sum(1 for i in range(layers) if i not in dense and i >= first_dense and (i + 1) % step == 0)
