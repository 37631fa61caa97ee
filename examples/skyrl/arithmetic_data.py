"""Write GSM8K-layout Parquet files of two-term arithmetic questions, for the SkyRL demo.

    .venv/bin/python examples/skyrl/arithmetic_data.py --output_dir runs/skyrl-data

SkyRL's GSM8K launch scripts read ``$DATA_DIR/train.parquet`` and ``$DATA_DIR/validation.parquet``
as SkyRL's own GSM8K dataset script writes them: a ``prompt`` of chat messages, ``env_class``
``gsm8k``, ``reward_spec.ground_truth`` and ``extra_info``. GSM8K itself comes from a model hub,
which this machine cannot reach, so the questions here are sums of two digits, which a 135M model
can learn on a CPU in minutes; skyrl-gym's ``gsm8k`` environment scores them as it scores GSM8K
(the number after ``####`` must equal the ground truth).

Each prompt is a short chat: one worked question and its answer in the ``#### N`` form, then the
question to answer. SmolLM2-135M-Instruct, asked with the instruction alone, writes ``#### N`` in
about one reply in ten and gets none right (48 questions, 4 samples each, temperature 1); with the
worked example it writes the form in about 60% and is right in about half: a reward GRPO can
raise in minutes on a CPU.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

INSTRUCTION = "Reply in the form #### N."
#: the worked question shown before each one (its sum is never the only answer the model sees)
EXAMPLE = ("What is 2 + 3?", "2 + 3 = 5\n#### 5")


def rows(count: int, seed: int, split: str) -> list[dict]:
    """``count`` questions ``a + b`` (one digit each), in SkyRL's GSM8K row layout."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        a, b, sign = rng.randint(0, 9), rng.randint(0, 9), "+"
        answer = a + b
        question = f"What is {a} {sign} {b}?"
        out.append({
            "data_source": "corerl/arithmetic",
            "prompt": [{"role": "user", "content": f"{EXAMPLE[0]} {INSTRUCTION}"},
                       {"role": "assistant", "content": EXAMPLE[1]},
                       {"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": index, "answer": f"#### {answer}", "question": question},
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="where train.parquet and validation.parquet go")
    parser.add_argument("--train_rows", type=int, default=512)
    parser.add_argument("--validation_rows", type=int, default=64)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", args.train_rows, 1), ("validation", args.validation_rows, 2)):
        pq.write_table(pa.Table.from_pylist(rows(count, seed, split)), folder / f"{split}.parquet")
        print(f"wrote {folder / f'{split}.parquet'} ({count} rows)")


if __name__ == "__main__":
    main()
