set -x

# A small launch script in SkyRL's shape, for bench/skyrl_recipes.py's smallest setting.
: "${DATA_DIR:="$HOME/data/gsm8k"}"
: "${NUM_GPUS:=1}"

uv run --isolated --extra fsdp -m skyrl.train.entrypoints.main_base \
  data.train_data="['$DATA_DIR/train.parquet']" \
  data.val_data="['$DATA_DIR/validation.parquet']" \
  trainer.algorithm.advantage_estimator="grpo" \
  trainer.policy.model.path="Qwen/Qwen2.5-0.5B-Instruct" \
  trainer.placement.policy_num_gpus_per_node=$NUM_GPUS \
  trainer.train_batch_size=8 \
  trainer.policy_mini_batch_size=8 \
  generator.n_samples_per_prompt=2 \
  environment.env_class=gsm8k \
  $@
