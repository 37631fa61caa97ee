"""What a finished run writes to ``final/``: the trained policy, whole or as its LoRA adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def export_final(training: Any, config: Any, work: Path) -> None:
    """``final/`` (written in ``work``): a Hugging Face checkpoint, or with ``policy.lora`` a PEFT
    adapter folder (and, with ``checkpointing.merge_lora_on_export``, the merged model in
    ``final/merged``)."""
    if not getattr(training, "adapter_only", False):
        training.export_hf(str(work))
        return
    training.export_adapter(str(work))
    if config.core.checkpointing.merge_lora_on_export:
        training.export_hf(str(work / "merged"))


def final_kind(training: Any, config: Any) -> str:
    """What :func:`export_final` wrote, in words."""
    if not getattr(training, "adapter_only", False):
        return "Hugging Face checkpoint"
    merged = " and the merged model in final/merged" if config.core.checkpointing.merge_lora_on_export else ""
    return f"PEFT LoRA adapter{merged}"
