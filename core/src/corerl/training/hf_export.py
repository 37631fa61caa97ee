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
    ``source`` when it has one that loads.

    ``state`` holds the transformers model's in-memory names (``model.state_dict()``'s: a mixture
    of experts' fused ``mlp.experts.gate_up_proj``), which ``save_pretrained`` writes back under
    the checkpoint's names, or already the checkpoint's names (per-expert tensors), written as
    they are: either way the folder holds what ``from_pretrained`` reads."""
    import torch

    from corerl.models.hf_save import save_pretrained
    from corerl.models.value_model import auto_model_class

    with torch.device("meta"):
        model = auto_model_class(role, hf_config).from_config(hf_config, dtype=torch.float32)
    Path(target).mkdir(parents=True, exist_ok=True)
    if set(state) <= set(model.state_dict()):
        model.load_state_dict(state, strict=True, assign=True)
        model.tie_weights()
        save_pretrained(model, target)
    else:
        _write_checkpoint_named(state, model, hf_config, role, target)
    copy_tokenizer(source, target)


def _write_checkpoint_named(state: dict[str, torch.Tensor], model: Any, hf_config: Any, role: str,
                            target: str) -> None:
    """Write ``state``, already under the checkpoint's names, as ``model.safetensors`` beside the
    config; a name the checkpoint of ``hf_config`` does not have, or one it lacks, is refused."""
    from safetensors.torch import save_file

    from corerl.training.weights import CheckpointNaming

    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if getattr(hf_config, "tie_word_embeddings", False) else set()
    expected = {name for name, _ in CheckpointNaming(hf_config, role)(model.state_dict().items())} - tied
    unexpected, missing = sorted(set(state) - expected - tied), sorted(expected - set(state))
    if unexpected or missing:
        raise ValueError(f"the weights do not fit {type(model).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    save_file({name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items() if name not in tied},
              str(Path(target) / "model.safetensors"), metadata={"format": "pt"})
    hf_config.save_pretrained(target)
    if model.can_generate():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(hf_config).save_pretrained(target)


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
