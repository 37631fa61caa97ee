"""Images in a data row's prompt: where they sit in the text, and their pixels.

A row gives its images in two ways:

- an image column (``data.image_key``, one image or a list) next to a text prompt: each image
  takes the next image placeholder of the text (:data:`~corerl.models.vision.IMAGE_PLACEHOLDER`,
  or ``<image>``); a text without placeholders gets them all in front;
- a chat-format prompt (a list of messages) whose ``content`` holds parts
  ``{"type": "image", "image": ...}`` and ``{"type": "text", "text": ...}``, as chat templates
  and NeMo RL's VLM data take them (or ``{"type": "image_url", "image_url": {"url": ...}}``, the
  OpenAI form SkyRL's data files write): each image part becomes a placeholder where it stands.

An image is a path (relative to the data file's folder), bytes, base64 text or a data URL
(:func:`corerl.models.vision.decode_image`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.models.vision import IMAGE_PLACEHOLDER, check_image, decode_image

#: a short placeholder rows may write instead of the Qwen-VL one
SHORT_PLACEHOLDER = "<image>"


def as_images(value: Any) -> list[Any]:
    """A row's image column as a list (one image, a list of them, or nothing)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def message_text(messages: Sequence[Any], where: str) -> tuple[list[dict[str, str]], list[Any]]:
    """Chat messages whose content parts are flattened to text (image parts as placeholders) and
    the images of those parts, in order."""
    flat, images = [], []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ConfigError(f"{where}: message {index} of the prompt is not a {{'role', 'content'}} object",
                              key="data.prompt_key", hint="give chat messages as {'role': ..., 'content': ...}")
        content = message.get("content")
        if isinstance(content, list):
            pieces = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image":
                    pieces.append(IMAGE_PLACEHOLDER)
                    images.append(part.get("image", part.get("url", part.get("path"))))
                elif kind == "image_url":  # the OpenAI form (SkyRL's data): {"image_url": {"url": ...}}
                    pieces.append(IMAGE_PLACEHOLDER)
                    url = part.get("image_url")
                    images.append(url.get("url") if isinstance(url, dict) else url)
                elif kind == "text":
                    pieces.append(str(part.get("text", "")))
                else:
                    raise ConfigError(f"{where}: message {index} has a content part of type {kind!r}",
                                      key="data.prompt_key", hint="content parts are {'type': 'text'}, {'type': 'image'} or {'type': 'image_url'}")
            content = " ".join(pieces)
        flat.append({"role": str(message["role"]), "content": str(content or "")})
    return flat, images


def place_images(text: str, count: int) -> str:
    """``text`` with one :data:`IMAGE_PLACEHOLDER` per image: its own placeholders (the short form
    too) where it has them, else all in front."""
    text = text.replace(SHORT_PLACEHOLDER, IMAGE_PLACEHOLDER)
    return text if IMAGE_PLACEHOLDER in text or count == 0 else " ".join([IMAGE_PLACEHOLDER] * count + [text])


def place_messages(messages: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """``messages`` with one placeholder per image: where their image parts stood, else all in
    front of the first user message."""
    if count == 0 or any(IMAGE_PLACEHOLDER in m["content"] or SHORT_PLACEHOLDER in m["content"] for m in messages):
        return [{**m, "content": m["content"].replace(SHORT_PLACEHOLDER, IMAGE_PLACEHOLDER)} for m in messages]
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    return [{**m, "content": place_images(m["content"], count)} if i == first else m for i, m in enumerate(messages)]


def decode_all(values: Sequence[Any], base: Path | None, where: str, max_pixels: int | None = None) -> list[Any]:
    """Every image of a row as a PIL image (refused in one line naming the row: one past
    ``max_pixels`` pixels too)."""
    return [decode_image(value, image_where(where, number), base, max_pixels) for number, value in enumerate(values, start=1)]


def check_all(values: Sequence[Any], base: Path | None, where: str, max_pixels: int | None = None) -> None:
    """Refuse, decoding no pixels, what :func:`decode_all` would refuse of a row's images
    (:func:`corerl.models.vision.check_image`)."""
    for number, value in enumerate(values, start=1):
        check_image(value, image_where(where, number), base, max_pixels)


def image_where(where: str, number: int) -> str:
    """How a row's ``number``-th image is named in an error line."""
    return f"{where}, image {number}"
