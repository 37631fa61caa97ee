"""A vision-language policy on megatron (Qwen2.5-VL, Qwen2-VL): megatron-core's GPTModel as the
language model, with multimodal rotary positions (``position_embedding_type="mrope"``, the text
config's ``mrope_section``), and the vision tower as transformers builds it.

Why the tower is transformers' and not megatron-core's: megatron-core ships no Qwen-VL vision
encoder (its multimodal models are LLaVA-style CLIP/SigLIP/RADIO), and the tower is small beside
the decoder (0.7B of Qwen2.5-VL-7B), so each tensor-parallel rank runs it whole, replicated like
the layer norms; it sits on the first pipeline stage as the GPTModel's ``vision_model``, so DDP,
the optimizer, the weight layout (:mod:`corerl_megatron.training.stage_weights`) and the export
(``model.visual.*``) see it as one more replicated module.

A forward: the word embeddings of the row tokens, the tower's output written at the image tokens
(in row order, as transformers does), handed to GPTModel as ``decoder_input``; the rotary
positions are transformers' own ``get_rope_index`` (``[3, rows, tokens]``: time, height, width).
A rank whose micro-batch holds no image runs the tower on nothing (its parameters get no
gradient, which DDP's buffers take as zeros).
"""

from __future__ import annotations

from typing import Any

import torch

from corerl.sdk import resolve

#: the families whose checkpoints hold a vision tower this module builds, by config model_type
TOWERS = {
    "qwen2_5_vl": "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VisionTransformerPretrainedModel",
    "qwen2_vl": "transformers.models.qwen2_vl.modeling_qwen2_vl:Qwen2VisionTransformerPretrainedModel",
}
_ROPE = {
    "qwen2_5_vl": "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLModel",
    "qwen2_vl": "transformers.models.qwen2_vl.modeling_qwen2_vl:Qwen2VLModel",
}


def is_vision_language(hf: Any) -> bool:
    """Whether the Hugging Face config ``hf`` is one of :data:`TOWERS`' vision-language models."""
    return getattr(hf, "model_type", None) in TOWERS


def mrope_section(hf: Any) -> list[int]:
    """The text config's multimodal rotary split of each head's rotated channels (time, height, width)."""
    text = hf.get_text_config()
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return list(params["mrope_section"])


def build_tower(hf: Any, dtype: torch.dtype) -> Any:
    """The vision tower of ``hf`` (weights copied in afterwards), in ``dtype``, on the rank's device."""
    tower = resolve(TOWERS[hf.model_type], what="vision tower")._from_config(hf.vision_config)
    for param in tower.parameters():  # the rotary buffers stay float32, as transformers and vLLM keep them
        param.data = param.data.to(dtype)
    if torch.cuda.is_available():
        tower = tower.cuda(torch.cuda.current_device())
    return tower


class VisionInputs:
    """Builds a vision-language micro-batch's rotary positions and ``decoder_input``."""

    def __init__(self, hf: Any) -> None:
        self.image_token_id = int(hf.image_token_id)
        with torch.device("meta"):  # transformers' get_rope_index reads the config only: no weights
            self.rope = resolve(_ROPE[hf.model_type], what="rotary positions")(hf)

    def inputs(self, gpt: Any, mb: dict[str, torch.Tensor], first_stage: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[3, rows, tokens]`` rotary positions of the micro-batch (text rows: the token index on
        all three) and, on the first stage, its ``decoder_input`` ``[tokens, rows, hidden]``: the word
        embeddings with the tower's output at the image tokens (None on a later stage)."""
        from corerl.sdk import image_inputs

        ids = mb["input_ids"]
        extra = image_inputs(mb, self.image_token_id)  # nothing for a batch without images
        image = ids == self.image_token_id  # none: every row is text
        positions, _ = self.rope.get_rope_index(ids, image.long(), image_grid_thw=extra.get("image_grid_thw"),
                                                attention_mask=mb["attention_mask"])
        if not first_stage:
            return positions.to(ids.device), None
        embeddings = gpt.embedding(input_ids=ids, position_ids=None)  # [s, b, h]
        if "pixel_values" not in extra:
            return positions.to(ids.device), embeddings
        tower = gpt.vision_model
        pixels = extra["pixel_values"].to(ids.device, next(tower.parameters()).dtype)
        features = tower(pixels, grid_thw=extra["image_grid_thw"].to(ids.device))
        features = getattr(features, "pooler_output", features)  # transformers 5: the merged patches
        if int(image.sum()) != features.shape[0]:
            raise ValueError(f"the micro-batch has {int(image.sum())} image tokens and its images "
                             f"{features.shape[0]} merged patches")
        # the rows' image tokens in row order, as the tower returns the images' patches
        order = image.reshape(-1).nonzero().flatten()
        rows, width = ids.shape
        flat = embeddings.transpose(0, 1).reshape(rows * width, -1)
        flat = flat.index_put((order,), features.to(flat.dtype))
        return positions.to(ids.device), flat.reshape(rows, width, -1).transpose(0, 1).contiguous()


def average_tower_gradients(gpt: Any, group: Any, size: int) -> None:
    """Average a trained tower's gradients over the tensor-parallel ranks: each runs the tower whole
    on the same images, but a GPU's attention and convolution kernels need not be deterministic, so
    the copies could drift apart (the export reads the first rank's)."""
    import torch.distributed as dist

    tower = getattr(gpt, "vision_model", None)
    if tower is None or size <= 1:
        return
    for param in tower.parameters():
        grad = getattr(param, "main_grad", None)
        if param.requires_grad and grad is not None:
            dist.all_reduce(grad, group=group)
            grad.div_(size)
