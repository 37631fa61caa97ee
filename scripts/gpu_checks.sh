#!/usr/bin/env bash
# The checks of a lent GPU machine in one call (see ../shared/gpu/README.md): run from the project
# root there, after `bash ../shared/gpu/bundle.sh trl==1.16.0` here, with `.gpu` carried:
#   source .gpu/setup.sh && bash scripts/gpu_checks.sh [part ...]
# Parts: checks (asynchronous GRPO, ZeRO-3, plan accuracy, side by side), bench (GRPO vs TRL at
# 76M and 605M), big (GRPO vs TRL at Qwen2-1.5B's shape). Default: checks bench.
# Every step has a timeout; the log and the results land in $OUT (gpu.log, results.tgz).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" bench/results/gpu
LOG=$OUT/gpu.log
export CORERL_DEBUG=1 PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: the command's output into the log, its status and time after
  local name=$1 seconds=$2 start rc
  shift 2
  start=$(date +%s)
  echo "=== $name: $*" >>"$LOG"
  timeout "$seconds" "$@" >>"$LOG" 2>&1
  rc=$?
  echo "=== $name: rc=$rc in $(($(date +%s) - start)) s" | tee -a "$LOG"
}

checks() {
  # side by side (none of them is timed): asynchronous GRPO on the GPU, ZeRO-3 at world size 1
  # (then again with TF32 off in cuBLAS: does TF32 explain a difference?), plan accuracy on CUDA
  step async-gpu-test 240 python -m pytest -x -q -p no:cacheprovider --tb=long -rA \
    "tests/test_gpu_runs.py::test_asynchronous_grpo_runs_three_steps_beside_its_generation_worker" &
  (step zero3 200 python -m pytest -q -p no:cacheprovider --tb=short -rA \
     "plugins/deepspeed/tests/test_deepspeed_conformance.py::TestZero3World1OnGpu::test_train_step_matches_plain_pytorch" \
     "plugins/deepspeed/tests/test_deepspeed_conformance.py::TestZero3World1OnGpu::test_save_load_continue_equals_uninterrupted"
   NVIDIA_TF32_OVERRIDE=0 step zero3-no-tf32 150 python -m pytest -q -p no:cacheprovider --tb=short -rA \
     "plugins/deepspeed/tests/test_deepspeed_conformance.py::TestZero3World1OnGpu::test_train_step_matches_plain_pytorch") &
  step plan-accuracy 240 python bench/plan_accuracy.py --hidden 1024 --layers 8 &
  wait
}

bench() {  # timed: nothing else runs beside them
  step grpo-vs-trl-76M 200 python bench/grpo_vs_trl.py --device cuda --shape 76M --precision bfloat16 --steps 5 \
    --contenders trl-no-gc,corerl-hf
  # the hf static KV cache (CUDA graphs) against the dynamic one: fp32 (under bf16 autocast the
  # shared training model decodes with the dynamic cache)
  step grpo-vs-trl-76M-fp32 200 python bench/grpo_vs_trl.py --device cuda --shape 76M --precision float32 --steps 5 \
    --contenders trl-no-gc,corerl-hf,corerl-hf-dynamic
  step grpo-vs-trl-605M 200 python bench/grpo_vs_trl.py --device cuda --shape 605M --precision bfloat16 --steps 5 \
    --contenders trl-no-gc,corerl-hf
}

big() {
  step grpo-vs-trl-1.5B 280 python bench/grpo_vs_trl.py --device cuda --shape qwen2-1.5b --precision bfloat16 \
    --steps 5 --contenders trl-no-gc,corerl-hf
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$LOG" 2>&1
for part in "${@:-checks bench}"; do
  for p in $part; do "$p"; done
done
tar -czf "$OUT/results.tgz" bench/results/gpu "$LOG" 2>/dev/null
echo "=== done"
