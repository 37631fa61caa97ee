"""Writing a Hugging Face checkpoint from full, Hugging Face-named weights (any training backend)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def write_hf_checkpoint(state: dict[str, torch.Tensor], hf_config: Any, source: str, target: str,
                        role: str = "policy") -> None:
    """Save ``state`` as a causal LM of ``hf_config`` (a value model for ``role="critic"``;
    safetensors and config.json) at ``target``, with the tokenizer of the checkpoint folder
    ``source`` when it has one that loads."""
    import torch

    from corerl.models.value_model import auto_model_class

    with torch.device("meta"):
        model = auto_model_class(role).from_config(hf_config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    Path(target).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    copy_tokenizer(source, target)


def export_on_rank_zero(rank: int, state: dict[str, torch.Tensor] | None, hf_config: Any, source: str,
                        target: str, role: str = "policy") -> None:
    """Rank 0 writes the checkpoint of the full ``state`` it gathered (every rank calls this);
    the others wait until it is written."""
    from corerl.distributed.rank_state import barrier

    if rank == 0:
        assert state is not None
        write_hf_checkpoint(state, hf_config, source, target, role)
    barrier()


def copy_tokenizer(source: str, target: str) -> None:
    """Save ``source``'s tokenizer into ``target``; a warning when it has none that loads."""
    from corerl.models.tokenizer import load_tokenizer_folder

    try:
        tokenizer = load_tokenizer_folder(source)
    except (OSError, ValueError) as exc:
        log.warning("no tokenizer exported: %s has none that loads (%s)", source, exc)
        return
    tokenizer.save_pretrained(target)
