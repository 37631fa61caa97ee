#!/usr/bin/env bash
# Set up .venv/ and run the whole test suite (lint, then pytest). Non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
