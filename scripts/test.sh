#!/usr/bin/env bash
# Set up .venv/ and run the whole test suite: lint, the fast tier, then the slow tier (see
# conftest.py), each tier's wall time printed after it. Non-zero exit on any failure. With
# arguments, one pytest run with them (e.g. `bash scripts/test.sh -m "not slow"` for the fast tier
# alone, `-m gpu -n 8` on a GPU machine). Budget on CI's 2-core machine: 40 minutes in all
# (docs/testing.md says how a new slow test pays for itself).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh
echo "== set-up: $((SECONDS - start)) s"
# Every process of the suite runs beside others (two pytest workers, each run's driver, ranks and
# engines) on few cores: one OpenMP thread each. Two-thread processes spin-wait for each other's
# cores instead (measured on 2 cores, the GRPO and PPO demo tests side by side: 272 s, 156 s with
# one thread; the fast tier at -n 2: 147 s, 86 s). Ray's actors get one already.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Python's default: each module compiled once, read back by every later process. An environment
# that turns it off (PYTHONDONTWRITEBYTECODE, set in this project's sandbox) makes each of the
# suite's hundreds of processes compile corerl's modules and each pytest worker rewrite every test
# module again (collection alone: 18 s of CPU without the files, 12 s with them).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check .
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
tier=$SECONDS
echo "== fast tier: unit tests and world-size-1 conformance =="
.venv/bin/python -m pytest -m "not slow" -n 2
echo "== fast tier: $((SECONDS - tier)) s"
tier=$SECONDS
echo "== slow tier: subprocess runs, Ray groups, world size 2 =="
# longest scope first (conftest.py orders them by tests/slow_durations.json): xdist keeps that order
.venv/bin/python -m pytest -m slow -n 2 --dist loadscope --no-loadscope-reorder --durations=60
echo "== slow tier: $((SECONDS - tier)) s; the whole suite, set-up included: $((SECONDS - start)) s"
