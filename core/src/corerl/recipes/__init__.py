"""Recipes shipped inside the corerl package (the built-in demo)."""

from pathlib import Path

RECIPES_DIR = Path(__file__).parent
DEMO_RECIPE = RECIPES_DIR / "demo.yaml"
