"""The presets the megatron plugin registers: recipe fragments setting its section."""

from pathlib import Path

FOLDER = Path(__file__).parent
MEGATRON_TP = FOLDER / "megatron_tp.yaml"
