set -x

# DAPO's entry point given a script path, for bench/skyrl_recipes.py's smallest setting.
MAX_PROMPT=256
MAX_RESPONSE=256

uv run --isolated --extra fsdp examples/train/algorithms/dapo/main_dapo.py \
  data.train_data="['$HOME/data/dapo/train.parquet']" \
  trainer.policy.model.path="Qwen/Qwen2.5-0.5B-Instruct" \
  trainer.max_prompt_length=$MAX_PROMPT \
  generator.sampling_params.max_generate_length=$MAX_RESPONSE \
  trainer.algorithm.max_seq_len=$((MAX_PROMPT + MAX_RESPONSE)) \
  environment.env_class=aime \
  "$@"
