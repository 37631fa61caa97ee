#!/usr/bin/env bash
# Set up .venv/ and run the whole test suite: lint, the fast tier, then the slow tier (see
# conftest.py). Non-zero exit on any failure. With arguments, one pytest run with them
# (e.g. `bash scripts/test.sh -m "not slow"` for the fast tier alone, `-m gpu` on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
echo "== fast tier: unit tests and world-size-1 conformance =="
.venv/bin/python -m pytest -m "not slow"
echo "== slow tier: subprocess runs, Ray groups, world size 2 =="
.venv/bin/python -m pytest -m slow --durations=25
