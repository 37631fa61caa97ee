"""A vision-language batch's images as row fields, and back as the forward pass's inputs.

Every batch field is cut by rows (data-parallel shards, micro-batches, mini-batches), so each
row's images travel as two row-aligned fields, zero-padded across rows:

- ``pixel_values`` ``[B, most patches, patch features]``: the row's patches, then zeros;
- ``image_grid_thw`` ``[B, most images, 3]``: the row's image grids, then zero rows.

:func:`image_inputs` joins the rows of a micro-batch back into what a Qwen-VL forward takes (all
the patches of the rows, one grid row per image, in row order). These fields are per row, not per
token: micro-batching keeps them whole (:data:`IMAGE_FIELDS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from corerl.generation.contract import Images

#: the batch fields that hold images, per row (never cut along the tokens)
IMAGE_FIELDS = ("pixel_values", "image_grid_thw")


def image_fields(per_row: Sequence[Images | None]) -> dict[str, torch.Tensor]:
    """The :data:`IMAGE_FIELDS` of rows holding ``per_row`` images (None: a row without any);
    nothing where no row has an image."""
    import torch

    present = [images for images in per_row if images is not None]
    if not present:
        return {}
    features = int(present[0].pixel_values.shape[-1])
    patches = max(int(images.pixel_values.shape[0]) for images in present)
    count = max(int(images.grid_thw.shape[0]) for images in present)
    pixels = torch.zeros((len(per_row), patches, features), dtype=torch.float32)
    grids = torch.zeros((len(per_row), count, 3), dtype=torch.long)
    for row, images in enumerate(per_row):
        if images is not None:
            pixels[row, : images.pixel_values.shape[0]] = images.pixel_values
            grids[row, : images.grid_thw.shape[0]] = images.grid_thw
    return {"pixel_values": pixels, "image_grid_thw": grids}


def image_inputs(batch: dict[str, torch.Tensor], image_token_id: int | None) -> dict[str, Any]:
    """The keywords a Qwen-VL forward takes for ``batch``'s images: ``pixel_values`` (every row's
    patches, in row order), ``image_grid_thw`` (one row per image) and ``mm_token_type_ids`` (1 on
    image tokens; Qwen3-VL's rotary positions need it); nothing for a batch without images."""
    if "pixel_values" not in batch:
        return {}
    import torch

    grids = batch["image_grid_thw"]
    sizes = grids.prod(dim=-1)  # [B, images]: each image's patches; 0 on a padding row
    real, patches = sizes > 0, sizes.sum(dim=-1)  # patches: [B], each row's
    pixels = [batch["pixel_values"][row, : int(patches[row])] for row in range(grids.shape[0])]
    out: dict[str, Any] = {}
    if int(real.sum()):
        out["pixel_values"] = torch.cat(pixels)
        out["image_grid_thw"] = grids[real]
    if image_token_id is not None:
        out["mm_token_type_ids"] = (batch["input_ids"] == image_token_id).long()
    return out


def image_token_id(model: Any) -> int | None:
    """The image token of ``model`` (a Hugging Face model, inside PEFT or FSDP wrappers too), or None."""
    for holder in (model, getattr(model, "module", None)):  # a DeepSpeed engine holds the model as .module
        value = getattr(getattr(holder, "config", None), "image_token_id", None)
        if value is not None:
            return int(value)
    return None
