"""Vision-language models: which checkpoints are one (read by :mod:`corerl.models.hf_config`), the
tiny Qwen2.5-VL / Qwen3-VL built in code (:mod:`corerl.models.tiny`; both re-exported here), and
how images become a prompt's pixel values and image tokens.

A Qwen-VL prompt holds one ``<|image_pad|>`` placeholder per image (between ``<|vision_start|>``
and ``<|vision_end|>``); :class:`ImageEncoder` runs the checkpoint's image processor over the
images and repeats each placeholder once per merged patch, which is what transformers'
``Qwen2VLProcessor`` does. We do it ourselves because that processor class refuses to be built
without torchvision, and the registry's torchvision is a CUDA build that fails on a CPU machine;
the image processor itself (``Qwen2VLImageProcessorPil``, through ``AutoImageProcessor``) needs
only PIL.

torch, transformers and PIL are imported inside the functions.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.errors import ConfigError

# Hugging Face config reading lives in corerl.models.hf_config; these names stay importable here
from corerl.models.hf_config import (  # noqa: F401
    VISION_LANGUAGE_TYPES,
    is_vision_language,
    read_hf_config,
    text_config,
    vision_token_ids,
)

# the tiny vision-language models are built in corerl.models.tiny; these names stay importable here
from corerl.models.tiny import (  # noqa: F401
    TINY_IMAGE_PROCESSOR,
    VISION_TOKENS,
    VISION_WORDS,
    save_tiny_image_processor,
    tiny_vl_config,
    tiny_vl_vocabulary,
)

if TYPE_CHECKING:
    from corerl.models.images import Images

#: the placeholder of one image in a Qwen-VL prompt's text (the vision tokens: :data:`VISION_TOKENS`)
IMAGE_PLACEHOLDER = "<|vision_start|> <|image_pad|> <|vision_end|>"


def auto_model_class(model_path: str | Path) -> Any:
    """The transformers auto class that loads the policy at ``model_path``: image-text-to-text for
    a vision-language checkpoint, causal LM for the rest."""
    from corerl.models.hf_config import auto_model_class as for_role

    return for_role("policy", read_hf_config(model_path))


def vision_parameter_names(model: Any) -> list[str]:
    """The names of the vision tower's parameters (the encoder and its patch merger) in ``model``,
    a Qwen-VL model, inside a PEFT or FSDP wrapper too."""
    return [name for name, _ in model.named_parameters() if ".visual." in f".{name}"]


def vision_tower_frozen(config: Any) -> bool:
    """Whether a run keeps the vision tower fixed: ``policy.freeze_vision_tower`` as
    :func:`with_vision_default` resolved it (frozen where still unset)."""
    chosen = config.core.policy.freeze_vision_tower
    return True if chosen is None else bool(chosen)


def with_vision_default(config: Any, samples: bool) -> Any:
    """``config`` with an unset ``policy.freeze_vision_tower`` resolved: frozen for an algorithm
    that samples from the policy (RL, on-policy distillation: a few thousand rewards should not
    move the encoder), trained for one that learns from fixed data (SFT, DPO), as NeMo RL does."""
    import attrs

    policy = config.core.policy
    if policy.freeze_vision_tower is not None:
        return config
    core = attrs.evolve(config.core, policy=attrs.evolve(policy, freeze_vision_tower=samples))
    return attrs.evolve(config, core=core)


def freeze_vision_tower(model: Any, config: Any) -> int:
    """Take the vision tower's parameters out of training (``requires_grad`` off, so no optimizer
    holds them) where :func:`vision_tower_frozen` says so; returns how many were frozen."""
    if not vision_tower_frozen(config):
        return 0
    names = set(vision_parameter_names(model))
    for name, parameter in model.named_parameters():
        if name in names:
            parameter.requires_grad_(False)
    return len(names)


def decode_image(value: Any, where: str, base: Path | None = None, max_pixels: int | None = None) -> Any:
    """One image of a data row or an observation as an RGB ``PIL.Image``: a PIL image, a numpy
    array ``[H, W, 3]`` of uint8, raw image bytes (Parquet), a ``{"bytes": ...}`` or
    ``{"path": ...}`` dict (Hugging Face datasets' image column), a ``data:image/...;base64,``
    URL or base64 text (JSONL), or a file path (relative to ``base``, the data file's folder).
    An image of more than ``max_pixels`` pixels (``data.max_image_pixels``) is refused before
    it is decoded, as is a decompression bomb."""
    return _open(_source(value, where, base), where, max_pixels, decode=True)


def check_image(value: Any, where: str, base: Path | None = None, max_pixels: int | None = None) -> None:
    """Refuse, in one line naming ``where``, what :func:`decode_image` would refuse (a missing
    file, one that is not an image, a truncated or corrupt one, one past ``max_pixels``),
    without decoding the pixels: the header is read and the file's structure checked
    (``PIL.Image.verify``: a PNG's chunk checksums)."""
    _open(_source(value, where, base), where, max_pixels, decode=False)


def _source(value: Any, where: str, base: Path | None) -> Any:
    """What :func:`_open` opens: a PIL image, a file ``Path`` or a ``BytesIO`` of image bytes."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return _source(value["bytes"], where, base)
        if value.get("path") is not None:
            return _source(str(value["path"]), where, base)
        raise ConfigError(f"{where}: an image dict needs 'bytes' or 'path', got keys {sorted(value)}",
                          key="data.image_key", hint="give the image as a path, bytes or base64 text")
    if isinstance(value, (bytes, bytearray)):
        return io.BytesIO(bytes(value))
    if isinstance(value, str):
        if value.startswith("data:image/"):
            return io.BytesIO(base64.b64decode(value.split(",", 1)[-1]))
        path = Path(value) if base is None or Path(value).is_absolute() else base / value
        if path.is_file():
            return path
        data = _base64(value)
        if data is not None:  # base64 text without the data URL prefix
            return io.BytesIO(data)
        raise ConfigError(f"{where}: image file {str(path)!r} does not exist", key="data.image_key",
                          hint="image paths are relative to the data file's folder; give base64 text or bytes instead")
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        import numpy as np

        return Image.fromarray(np.asarray(value, dtype=np.uint8))
    raise ConfigError(f"{where}: cannot read an image from a {type(value).__name__}", key="data.image_key",
                      hint="give the image as a path, bytes, base64 text or a uint8 [H, W, 3] array")


def _base64(text: str) -> bytes | None:
    """The bytes ``text`` encodes in base64 where it is base64 of an image (PNG, JPEG, GIF, WebP
    or BMP by their signatures), else None: a missing file's name is not mistaken for an image."""
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    signatures = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM")
    return data if data.startswith(signatures) else None


#: the pixel limit of an image without a ``data.max_image_pixels``, in multiples of the image
#: processor's ``max_pixels`` (the size it resizes every image down to)
PROCESSOR_PIXELS_FACTOR = 4
PIXELS_KEY = "data.max_image_pixels"


def _open(source: Any, where: str, max_pixels: int | None, decode: bool) -> Any:
    """``source`` opened (its header read), its size held to ``max_pixels`` and then decoded
    (``decode``, an RGB image) or verified (None); PIL's decompression bomb refusal included."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    what = f"image file {source}" if isinstance(source, Path) else "the image"
    if isinstance(source, Image.Image):
        image = source
    else:
        try:
            with warnings.catch_warnings():  # past PIL's warning size: held to max_pixels below
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(source)
        except Image.DecompressionBombError as error:
            raise ConfigError(f"{where}: {what} is refused as a decompression bomb ({error})", key=PIXELS_KEY,
                              hint="shrink the image; corerl opens no image past PIL's limit "
                                   f"({2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels)") from None
        except (UnidentifiedImageError, OSError) as error:
            raise ConfigError(f"{where}: {what} is not a readable image ({error})", key="data.image_key",
                              hint="give PNG or JPEG data") from None
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        raise ConfigError(f"{where}: {what} is {width} x {height} pixels ({width * height}), more than the "
                          f"{max_pixels} {PIXELS_KEY} allows", key=PIXELS_KEY,
                          hint=f"shrink the image, or raise {PIXELS_KEY} (unset: {PROCESSOR_PIXELS_FACTOR} x the "
                               "image processor's max_pixels, which it resizes every image to anyway)")
    if isinstance(source, Image.Image):
        return image.convert("RGB") if decode else None
    try:
        if not decode:
            image.verify()  # no pixels decoded: the file's structure and checksums
            return None
        image.load()
    except (OSError, SyntaxError) as error:  # PIL says a corrupt PNG chunk with SyntaxError
        raise ConfigError(f"{where}: {what} is not a readable image ({error})", key="data.image_key",
                          hint="give PNG or JPEG data") from None
    return image.convert("RGB")


def processor_max_pixels(model_path: str | Path) -> int | None:
    """The ``max_pixels`` of the image processor saved in ``model_path`` (``preprocessor_config.json``:
    ``max_pixels``, or ``size.longest_edge`` as transformers 5 saves it), None where it says none."""
    path = Path(model_path) / "preprocessor_config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = saved.get("size") if isinstance(saved.get("size"), dict) else {}
    value = saved.get("max_pixels") or size.get("longest_edge")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def image_pixel_limit(max_image_pixels: int | None, processor_pixels: int | None) -> int | None:
    """The pixel limit of a run's images: ``data.max_image_pixels``, else
    :data:`PROCESSOR_PIXELS_FACTOR` times the image processor's ``max_pixels`` (none where neither
    is known: PIL's decompression bomb limit holds alone)."""
    if max_image_pixels is not None:
        return max_image_pixels
    return PROCESSOR_PIXELS_FACTOR * processor_pixels if processor_pixels else None


def png_bytes(image: Any) -> bytes:
    """``image`` (a PIL image) as PNG bytes: how a sample keeps its raw images."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class ImageEncoder:
    """The image side of a vision-language checkpoint: its image processor, its image token and
    how many tokens one image becomes. Built once per run from the model folder."""

    def __init__(self, model_path: str | Path, tokenizer: Any) -> None:
        from transformers import AutoImageProcessor

        config = read_hf_config(model_path) or {}
        if not is_vision_language(config):
            raise ConfigError(f"{model_path} is not a vision-language model "
                              f"(model_type {config.get('model_type')!r}), so it cannot read images",
                              key="policy.model_name",
                              hint=f"use a model of the families {', '.join(VISION_LANGUAGE_TYPES)} "
                                   "(builtin:tiny-vl), or give text-only data")
        try:
            self.processor = AutoImageProcessor.from_pretrained(str(model_path))
        except (OSError, ValueError, ImportError) as error:
            raise ConfigError(f"the image processor of {model_path} cannot be built: "
                              f"{str(error).splitlines()[0]}", key="policy.model_name",
                              hint="the folder needs a preprocessor_config.json of a Qwen-VL image processor") from None
        self.image_token_id = int(config["image_token_id"])
        self.merge = int(getattr(self.processor, "merge_size", 2))
        self.tokenizer = tokenizer
        self.processor_pixels = processor_max_pixels(model_path)  # what data.max_image_pixels defaults from

    def encode(self, images: Sequence[Any], where: str) -> Images:
        """The pixel values and grids of ``images`` (PIL images), with their PNG bytes."""
        from corerl.models.images import Images

        out = self.processor(images=list(images), return_tensors="pt")
        return Images(pixel_values=out["pixel_values"].float(), grid_thw=out["image_grid_thw"].long(),
                      raw=tuple(png_bytes(image) for image in images))

    def tokens_per_image(self, images: Images) -> list[int]:
        """How many image tokens each image takes in the prompt (its merged patches)."""
        return [int(row.prod()) // (self.merge * self.merge) for row in images.grid_thw]

    def expand(self, ids: Sequence[int], images: Images | None, where: str, key: str | None = None) -> list[int]:
        """``ids`` with each image placeholder (one image token) repeated once per merged patch of
        its image; refused (naming ``key``, the setting whose data holds the prompt) where the
        placeholders and the images (None: none) do not match one to one."""
        counts = [] if images is None else self.tokens_per_image(images)
        places = [i for i, token in enumerate(ids) if token == self.image_token_id]
        check_placeholders(len(places), len(counts), where, key)
        out: list[int] = []
        for token in ids:
            out.extend([token] * counts.pop(0) if token == self.image_token_id else [token])
        return out

    def expand_text(self, text: str, images: Images) -> str:
        """``text`` with each placeholder's image token written once per merged patch, as
        :meth:`expand` does to the ids (what the expanded ids decode to)."""
        token = str(self.tokenizer.convert_ids_to_tokens(self.image_token_id))
        first, *after = text.split(token)
        runs = [" ".join([token] * count) for count in self.tokens_per_image(images)]
        return first + "".join(run + rest for run, rest in zip(runs, after, strict=True))


#: the image token a Qwen-VL prompt's text holds once per image (inside :data:`IMAGE_PLACEHOLDER`)
IMAGE_TOKEN = "<|image_pad|>"


def check_placeholders(placeholders: int, images: int, where: str, key: str | None) -> None:
    """Refuse a prompt whose image placeholders and images do not match one to one, in one line
    naming the row (``where``) and ``key``."""
    if placeholders != images:
        raise ConfigError(f"{where}: the prompt holds {placeholders} image placeholders for {images} images", key=key,
                          hint=f"put one {IMAGE_PLACEHOLDER!r} in the prompt text per image of the row")


def image_facts(model_name: str, gguf_file: str | None = None) -> tuple[bool | None, int | None]:
    """Whether the model ``policy.model_name`` names reads images, and its image processor's
    ``max_pixels``, without building or converting it: ``(None, None)`` for a GGUF file or
    packaged model (known once converted)."""
    from corerl.models.gguf import PACKAGED
    from corerl.models.tiny import BUILTIN_MODELS, VL_FAMILIES

    if model_name in BUILTIN_MODELS:
        vision = BUILTIN_MODELS[model_name].get("family") in VL_FAMILIES
        return vision, int(TINY_IMAGE_PROCESSOR["max_pixels"]) if vision else None
    if gguf_file or model_name.endswith(".gguf") or model_name in PACKAGED:
        return None, None
    vision = is_vision_language(read_hf_config(model_name))
    return vision, processor_max_pixels(model_name) if vision else None
