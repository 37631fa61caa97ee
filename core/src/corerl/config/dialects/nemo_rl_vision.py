"""What NeMo RL's vision-language (VLM) recipes need of the dialect: which recipe is one, which of
its models and datasets corerl takes, and the reasons it gives for the rest.

corerl trains the Qwen-VL image families (``model_type`` in
:data:`corerl.models.vision.VISION_LANGUAGE_TYPES`) on its dtensor and deepspeed backends; audio,
video and omni models and other vision-language families are refused in one line each (an
engine without a VLM path refuses it in its plugin's section rules, megatron's among them). A
recipe names its model by Hub name: the family is read from the name, as nothing is downloaded
to read a ``config.json`` (a local folder is judged at run start, from its own).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from corerl.config.tree import value_at
from corerl.plugin_manager import process_host
from corerl.registry import DialectSection

#: the families corerl trains on images, as the guide and the refusals name them
SUPPORTED_FAMILIES = "Qwen2-VL, Qwen2.5-VL and Qwen3-VL (dense)"
MODEL_HINT = "give a Qwen2-VL, Qwen2.5-VL or dense Qwen3-VL checkpoint (e.g. Qwen/Qwen2.5-VL-3B-Instruct)"

#: NeMo RL's image datasets (its VLM GRPO and SFT recipes): Hub datasets, refused only at run start
IMAGE_DATASETS = ("clevr-cogent", "geometry3k", "refcoco", "mmpr-tiny")
#: NeMo RL's audio and audio-visual datasets
AUDIO_VIDEO_DATASETS = ("avqa", "audiomcq", "daily-omni", "intent-train", "intent-bench", "twinkstart/mmau")
#: where NeMo RL's recipes name their datasets
DATASET_KEYS = ("data.dataset_name", "data.train.dataset_name", "data.validation.dataset_name",
                "data.default.dataset_name")
#: NeMo RL's data processor for image (and audio/video) rows
VLM_PROCESSOR = "vlm_hf_data_processor"

AUDIO_VIDEO = (f"audio and video inputs are not built into corerl yet (images are, with {SUPPORTED_FAMILIES} "
               "models)")
PROCESSOR_REASON = ("corerl's dataset task formats prompt/answer rows itself, and reads a row's images "
                    f"(data.image_key) with the model's image processor (NeMo RL's {VLM_PROCESSOR})")

_QWEN_VL = re.compile(r"qwen(2|2\.5|3)-vl", re.IGNORECASE)
_MIXTURE = re.compile(r"-a\d+(\.\d+)?b", re.IGNORECASE)  # Qwen's active-parameter tag: 30B-A3B
_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
_PROCESSOR_KEYS = ("data.processor", "data.default.processor", "data.train.processor")


def model_key(raw: dict[str, Any]) -> str:
    """Where the recipe names its model: an evaluation recipe's ``generation.model_name``, else
    ``policy.model_name``."""
    return "generation.model_name" if value_at(raw, "policy") is None and value_at(
        raw, "generation.model_name") is not None else "policy.model_name"


def marker(raw: dict[str, Any]) -> str | None:
    """The key that makes a recipe a vision-language one (None: a text recipe): ``policy.is_vlm``,
    NeMo RL's VLM data processor, or an image, audio or video dataset. (Automodel's
    ``freeze_config`` is no mark: text recipes on multimodal checkpoints, Gemma 4 and Qwen3.5,
    freeze the towers they do not use.)"""
    if value_at(raw, "policy.is_vlm") is True:
        return "policy.is_vlm"
    for key in _PROCESSOR_KEYS:
        if value_at(raw, key) == VLM_PROCESSOR:
            return key
    for key in DATASET_KEYS:
        name = value_at(raw, key)
        if isinstance(name, str) and name.lower() in (*IMAGE_DATASETS, *AUDIO_VIDEO_DATASETS):
            return key
    return None


def is_audio_video_dataset(name: Any) -> bool:
    """Whether ``name`` is one of NeMo RL's audio or audio-visual datasets."""
    return isinstance(name, str) and name.lower() in AUDIO_VIDEO_DATASETS


def model_refusal(name: Any) -> str | None:
    """Why a vision-language recipe's model (a Hub name) is refused, or None where corerl trains it
    or where the name is not a Hub name (a local folder or a built-in model: its ``config.json``
    decides at run start)."""
    if not isinstance(name, str) or not _HUB_NAME.fullmatch(name) or os.path.exists(name):
        return None
    if "omni" in name.lower():
        return f"{name}: audio, video and omni models are not built into corerl yet ({SUPPORTED_FAMILIES} are)"
    if _QWEN_VL.search(name):
        if _MIXTURE.search(name):
            return (f"{name}: Qwen3-VL's mixture-of-experts models (qwen3_vl_moe) are not built into corerl yet "
                    f"({SUPPORTED_FAMILIES} are)")
        return None
    return (f"{name}: corerl trains the vision-language families {SUPPORTED_FAMILIES}; this model's family is not "
            "built in yet")


#: NeMo RL's VLM reward environments (its ``env_name`` and ``env.<name>`` section) -> corerl's
#: built-in environment of the same reward functions (:mod:`corerl.environments.vlm_env`)
VLM_ENVIRONMENTS = {"clevr-cogent": "clevr_cogent", "geometry3k": "geometry3k", "refcoco": "refcoco", "vlm": "vlm"}
#: the keys of NeMo RL's VLM environment sections, each corerl's key of the same name
VLM_ENVIRONMENT_KEYS = ("num_workers", "reward_functions")


def environment_id(name: Any) -> Any:
    """NeMo RL's environment name as corerl's environment id (a VLM one's spelling; others as they are)."""
    return VLM_ENVIRONMENTS.get(name, name) if isinstance(name, str) else name


def vlm_environment_of(path: str) -> str | None:
    """The NeMo RL VLM environment whose section ``path`` lies in (``env.clevr-cogent.num_workers``:
    ``clevr-cogent``), or None."""
    parts = path.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "env" and parts[1] in VLM_ENVIRONMENTS else None


def __getattr__(name: str) -> Any:
    """A name that moved to an engine's plugin with its section (the megatron section's VLM
    refusal), read from the installed plugins' section modules."""
    if not name.startswith("__"):
        for registration in process_host().registry(DialectSection):
            factory = registration.factory
            module = sys.modules.get(factory.split(":")[0]) if isinstance(factory, str) else None
            if module is None and isinstance(factory, str):
                registration.load()
                module = sys.modules.get(factory.split(":")[0])
            if module is not None and hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
