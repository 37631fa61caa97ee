# Writes the data files (a script that trains nothing: counted apart).
uv run examples/train/gsm8k/gsm8k_dataset.py --output_dir "$HOME/data/gsm8k"
