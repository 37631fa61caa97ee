"""Attention over packed rows that computes each sequence's block only.

transformers' own path for packed rows (``position_ids`` restarting at 0, no mask) builds a
block-diagonal ``[T, T]`` mask and runs attention over the whole row: the blocks between
sequences are computed and thrown away, so a row of 1,024 tokens costs a 1,024-token
attention whatever it holds. This attention function cuts the row at the restarts and runs
causal SDPA per sequence, like flash-attention's variable-length kernel, on any device.

:func:`register` makes it available as ``attn_implementation="corerl_segments"``. A model
loaded with it must only see right-padded or packed rows: transformers builds no mask for a
custom attention, and causal attention alone keeps right padding from reaching real tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NAME = "corerl_segments"


def _segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    starts = (position_ids == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], int(position_ids.shape[-1])]
    return list(zip(starts, ends, strict=True))


def segment_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA per sequence of each row; ``query`` ``[B, H, T, D]``, ``key``/``value``
    ``[B, Hkv, T, D]``; returns ``[B, T, H, D]`` as transformers' attention functions do."""
    import torch

    if attention_mask is not None:
        raise ValueError(f"the {NAME} attention takes no mask: use it for right-padded or packed rows only")
    position_ids = kwargs.get("position_ids")
    rows = query.shape[0]
    if position_ids is None:
        position_ids = torch.arange(query.shape[2], device=query.device).expand(rows, -1)
    gqa = key.shape[1] != query.shape[1]
    dropout = dropout if module.training else 0.0
    outputs = []
    for row in range(rows):
        pieces = [
            torch.nn.functional.scaled_dot_product_attention(
                query[row : row + 1, :, start:end], key[row : row + 1, :, start:end], value[row : row + 1, :, start:end],
                dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa,
            )
            for start, end in _segments(position_ids[row if position_ids.shape[0] > 1 else 0])
        ]
        outputs.append(torch.cat(pieces, dim=2))
    return torch.cat(outputs, dim=0).transpose(1, 2).contiguous(), None


def register() -> str:
    """Make :func:`segment_attention` loadable as ``attn_implementation=NAME``; returns NAME."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, segment_attention)
    return NAME
