"""The presets the dtensor plugin registers: recipe fragments setting its section."""

from pathlib import Path

FOLDER = Path(__file__).parent
FSDP = FOLDER / "fsdp.yaml"
