#!/usr/bin/env bash
# Set up .venv/ and run the built-in demo recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/corerl run "$@"
