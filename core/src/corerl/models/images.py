"""The images of a prompt (contract 2.13): :class:`Images`, the prompt that carries them
(:class:`ImagePrompt`) and the helpers that read and attach them. Model facts, below the
engines: :mod:`corerl.generation.contract` (and :mod:`corerl.sdk`) re-export them.

torch is imported inside the functions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch


@attrs.frozen(kw_only=True, eq=False)
class Images:
    """The images of one prompt (contract 2.13), in the order of their image tokens:
    ``pixel_values`` ``[patches, patch features]`` float32 and ``grid_thw`` ``[images, 3]`` long
    as the model's image processor makes them (what the forward pass takes), and ``raw``, each
    image's PNG bytes (for an engine that runs the processor itself, as vLLM does)."""

    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    raw: tuple[bytes, ...] = ()

    def __add__(self, other: Images | None) -> Images:
        """These images followed by ``other``'s (an episode's history then an observation's)."""
        import torch

        if other is None:
            return self
        return Images(pixel_values=torch.cat([self.pixel_values, other.pixel_values]),
                      grid_thw=torch.cat([self.grid_thw, other.grid_thw]), raw=self.raw + other.raw)


class ImagePrompt(list):  # type: ignore[type-arg]
    """A prompt's token ids (a ``list[int]``) that carries its :class:`Images` (contract 2.13):
    what a task returns for a prompt with images, and what a generation backend that reads
    images (``accepts_images = True``) finds in ``generate``'s prompts. Every other reader sees
    a plain list of ids; :func:`images_of` gives a prompt's images or None."""

    def __init__(self, ids: Iterable[int] = (), images: Images | None = None) -> None:
        super().__init__(ids)
        self.images = images

    def __add__(self, other: Any) -> ImagePrompt:  # prompt + completion ids keeps the images
        return ImagePrompt(list.__add__(self, list(other)), self.images)

    def __reduce__(self) -> Any:
        return (ImagePrompt, (list(self), self.images))


def images_of(prompt: Any) -> Images | None:
    """The images a prompt carries (an :class:`ImagePrompt`'s), or None."""
    return getattr(prompt, "images", None)


def with_images(ids: Iterable[int], images: Images | None) -> list[int]:
    """``ids`` as an :class:`ImagePrompt` carrying ``images``, or a plain list where there are none."""
    return list(ids) if images is None else ImagePrompt(ids, images)
