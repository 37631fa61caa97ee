#!/usr/bin/env bash
# Run a recipe with the ZeRO-3 preset (DeepSpeed, parameters, gradients and optimizer state
# partitioned over the ranks); KEY=VALUE overrides still apply on top.
#   scripts/launch_zero3.sh RECIPE [KEY=VALUE ...]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 RECIPE [KEY=VALUE ...]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
corerl="$here/.venv/bin/corerl"
[ -x "$corerl" ] || corerl="corerl"
exec "$corerl" run --preset zero3 "$@"
