"""The presets the deepspeed plugin registers: recipe fragments setting its section."""

from pathlib import Path

FOLDER = Path(__file__).parent
ZERO2 = FOLDER / "zero2.yaml"
ZERO3 = FOLDER / "zero3.yaml"
ZERO3_OFFLOAD = FOLDER / "zero3_offload.yaml"
