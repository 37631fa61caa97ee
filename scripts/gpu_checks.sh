#!/usr/bin/env bash
# The checks of a lent GPU machine in one call (see ../shared/gpu/README.md): run from the project
# root there, after `bash ../shared/gpu/bundle.sh trl==1.16.0` here, with `.gpu` carried:
#   source .gpu/setup.sh && bash scripts/gpu_checks.sh [part ...]
# Parts: decode (the hf backend's bf16 decode copy on CUDA), bench (GRPO vs TRL in bf16 at 76M with
# the dynamic cache beside, 605M, Qwen2-1.5B's shape), plan (plan accuracy on CUDA), async
# (asynchronous GRPO beside its generation worker), zero3 (the ZeRO-3 world-size-1 checks), distill
# (forward and mixed top-k distillation on the GPU; the second names the teacher's own cluster keys,
# which on one GPU are the policy's shape and so share its pool: an own pool needs a second GPU),
# episodes (the tool demo with hf generation, and the request-seed and multi-turn checks, on CUDA),
# vlm (the vision-language tests and the VL demo on CUDA, in float32 and bfloat16).
# PLAN_LAYOUTS picks plan's layouts (comma-separated labels of bench/memory.py; default: all five).
# Default: decode bench plan. Every step has a timeout, cut to what is left before
# GPU_DEADLINE_S (seconds from the start, default 540); the log and the results land in $OUT
# (gpu.log, results.tgz).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" bench/results/gpu
LOG=$OUT/gpu.log
export CORERL_DEBUG=1 PYTHONUNBUFFERED=1
DEADLINE=$(($(date +%s) + ${GPU_DEADLINE_S:-540}))

step() {  # step NAME SECONDS COMMAND...: the command's output into the log, its status and time after
  local name=$1 seconds=$2 start rc
  shift 2
  start=$(date +%s)
  if ((start + seconds > DEADLINE)); then seconds=$((DEADLINE - start)); fi
  if ((seconds < 10)); then echo "=== $name: skipped (deadline)" | tee -a "$LOG"; return; fi
  echo "=== $name: $*" >>"$LOG"
  timeout "$seconds" "$@" >>"$LOG" 2>&1
  rc=$?
  echo "=== $name: rc=$rc in $(($(date +%s) - start)) s" | tee -a "$LOG"
}

decode() {  # the bf16 decode copy's own test on CUDA (static cache, CUDA graphs)
  step decode-copy 120 python -m pytest -x -q -p no:cacheprovider --tb=long -rA \
    "tests/test_shared_weights.py::test_a_bfloat16_training_model_decodes_through_a_16_bit_copy_with_the_static_cache"
}

bench() {  # timed: nothing else runs beside them
  step grpo-vs-trl-76M 170 python bench/grpo_vs_trl.py --device cuda --shape 76M --precision bfloat16 --steps 5 \
    --contenders trl-no-gc,corerl-hf,corerl-hf-dynamic
  step grpo-vs-trl-605M 150 python bench/grpo_vs_trl.py --device cuda --shape 605M --precision bfloat16 --steps 5 \
    --contenders trl-no-gc,corerl-hf
  step grpo-vs-trl-1.5B 200 python bench/grpo_vs_trl.py --device cuda --shape qwen2-1.5b --precision bfloat16 \
    --steps 5 --contenders trl-no-gc,corerl-hf
}

plan() {  # one layout a step, so a slow one costs only itself (on an H200: dtensor and ZeRO-3 took under 45 s each)
  local layout layouts
  IFS=, read -ra layouts <<<"${PLAN_LAYOUTS:-dtensor FSDP2,deepspeed ZeRO-1,deepspeed ZeRO-2,deepspeed ZeRO-3,megatron TP=2}"
  for layout in "${layouts[@]}"; do
    step "plan-accuracy $layout" 150 python bench/plan_accuracy.py --hidden 1024 --layers 8 --layouts "$layout"
    cp bench/results/gpu/plan_accuracy.json "$OUT/plan_accuracy-${layout//[ =]/_}.json" 2>/dev/null
  done
}

async() {
  step async-gpu-test 240 python -m pytest -x -q -p no:cacheprovider --tb=long -rA \
    "tests/test_gpu_runs.py::test_asynchronous_grpo_runs_three_steps_beside_its_generation_worker"
}

distill() {  # an untrained built-in teacher: the CUDA path of the top-k losses, not the learning (the CPU demo shows that)
  local common=(examples/configs/distillation_demo.yaml algorithm.distillation.teacher_model=builtin:tiny-qwen2
    algorithm.distillation.topk_logits_k=8 algorithm.max_steps=4 policy.generation.backend=hf run.output_dir="$OUT/runs" checkpointing.enabled=false)
  step distill-forward 120 corerl run "${common[@]}" algorithm.distillation.kl_type=forward run.name=forward
  step distill-mixed-teacher-cluster 90 corerl run "${common[@]}" algorithm.distillation.kl_type=mixed run.name=mixed \
    algorithm.distillation.teacher_overrides.cluster.gpus_per_node=1
}

episodes() {  # multi-turn episodes that never wait for each other, with per-request seeds, on CUDA
  step episodes-tools-demo 150 corerl run examples/configs/grpo_tools_demo.yaml policy.generation.backend=hf \
    run.output_dir="$OUT/runs" run.name=tools checkpointing.enabled=false
  step episodes-request-seeds 150 python -m pytest -q -p no:cacheprovider --tb=short -rA tests/test_hf_generation.py \
    tests/test_environments.py -k "request_seed or same_prompt_twice or grouped or never_wait or masked"
}

vlm() {  # images through hf generation and the dtensor training model on CUDA
  step vlm-tests 150 python -m pytest -q -p no:cacheprovider --tb=short -rA tests/test_vision.py
  step vlm-demo 200 corerl run examples/configs/grpo_vl_demo.yaml run.output_dir="$OUT/runs" run.name=vl \
    checkpointing.enabled=false
  step vlm-demo-bf16 120 corerl run examples/configs/grpo_vl_demo.yaml run.output_dir="$OUT/runs" run.name=vl-bf16 \
    checkpointing.enabled=false policy.precision=bfloat16 algorithm.max_steps=30
}

zero3() {
  step zero3 200 python -m pytest -q -p no:cacheprovider --tb=short -rA \
    "plugins/deepspeed/tests/test_deepspeed_conformance.py::TestZero3World1OnGpu::test_train_step_matches_plain_pytorch" \
    "plugins/deepspeed/tests/test_deepspeed_conformance.py::TestZero3World1OnGpu::test_save_load_continue_equals_uninterrupted"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$LOG" 2>&1
for part in "${@:-decode bench plan}"; do
  for p in $part; do "$p"; done
done
tar -czf "$OUT/results.tgz" bench/results/gpu "$LOG" 2>/dev/null
echo "=== done"
