"""Reading a Hugging Face checkpoint's ``config.json``: whether it is a vision-language model,
its language model's part, the token ids its images take, and the transformers auto class that
loads it. No torch or transformers at import (transformers is imported inside
:func:`auto_model_class`); :mod:`corerl.models.vision` and :mod:`corerl.models.value_model`
re-export these names from their old homes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Hugging Face ``model_type`` values of the vision-language families corerl trains
VISION_LANGUAGE_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def is_vision_language(hf_config: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's ``config.json`` dict describes a vision-language model corerl trains."""
    return bool(hf_config) and hf_config.get("model_type") in VISION_LANGUAGE_TYPES


def read_hf_config(model_path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` of a local checkpoint folder, or None where there is none."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text()))


def text_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a checkpoint's config (a VLM nests it under ``text_config``)."""
    nested = hf_config.get("text_config")
    return {**hf_config, **nested} if isinstance(nested, dict) else hf_config


def vision_token_ids(hf_config: dict[str, Any] | None) -> list[int]:
    """The token ids a vision-language model's images take (image, video, vision start and end):
    generation never samples them (a completion holding one would count as an image). Empty for
    a text-only model."""
    if not is_vision_language(hf_config):
        return []
    assert hf_config is not None
    keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [int(hf_config[key]) for key in keys if hf_config.get(key) is not None]


def auto_model_class(role: str = "policy", hf_config: Any = None) -> Any:
    """The transformers auto class a training backend loads for ``role``: the policy's causal LM
    (image-text-to-text where ``hf_config``, a config object or a ``config.json`` dict, is a
    vision-language model's), or the critic's token-classification value model."""
    import transformers

    if role == "critic":
        return transformers.AutoModelForTokenClassification
    kind = hf_config.get("model_type") if isinstance(hf_config, dict) else getattr(hf_config, "model_type", None)
    if kind in VISION_LANGUAGE_TYPES:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM
