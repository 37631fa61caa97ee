"""Training logprobs with the LM head at the loss's positions only, in chunks, against the full
logits: peak memory and time of one forward + backward, at SmolLM2's and Qwen2-1.5B's vocabulary.

    .venv/bin/python bench/head_logprobs.py                 # rows 8, 64 prompt + 64 response tokens
    .venv/bin/python bench/head_logprobs.py --rows 2 --layers 1 --steps 1   # the smallest setting

Each side runs in a fresh process (its peak resident memory is the process's own, ``ru_maxrss``,
minus what it held before the first step) on the same model: the shape's hidden size and
vocabulary, ``--layers`` decoder layers (few, so that the head's share shows), the same batch.
"full logits" is what corerl did before: the model's logits at every position, then the chunked
log-softmax of :mod:`corerl.training.logprobs`; "head at the loss" is ``model_logprobs`` now
(:mod:`corerl.training.head_logprobs`). Writes bench/results/head_logprobs.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

from bench_output import results_path

RESULTS = results_path("head_logprobs.json")
SHAPES = {  # hidden size, heads, kv heads, intermediate, vocabulary, tied
    "smollm2-135m": dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         vocab_size=49152, tie_word_embeddings=True),
    "qwen2-1.5b": dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                       vocab_size=151936, tie_word_embeddings=True),
}
SIDES = ("full logits", "head at the loss")


def _one(side: str, shape: str, rows: int, prompt: int, response: int, layers: int, steps: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from corerl.training.logprobs import batch_logprobs, model_logprobs

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=4096, **SHAPES[shape])
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(0)
    width = prompt + response
    ids = torch.randint(0, config.vocab_size, (rows, width), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.zeros_like(ids)}
    batch["loss_mask"][:, prompt:] = 1
    advantages = torch.randn(rows, 1, generator=gen)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        if side == "full logits":
            logits = model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False).logits
            logprobs = batch_logprobs(logits, dict(batch), batch["attention_mask"])
        else:
            logprobs = model_logprobs(model, dict(batch))
        loss = -(logprobs * batch["loss_mask"] * advantages).sum() / batch["loss_mask"].sum()
        loss.backward()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"median_s": statistics.median(times), "peak_mb": (peak - base) / 1024, "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--one", nargs=2, metavar=("SIDE", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], args.one[1], args.rows, args.prompt, args.response, args.layers,
                              args.steps)))
        return
    rows = []
    for shape in args.shapes.split(","):
        measured = {}
        for side in SIDES:
            out = subprocess.run([sys.executable, __file__, "--one", side, shape, "--rows", str(args.rows),
                                  "--prompt", str(args.prompt), "--response", str(args.response),
                                  "--layers", str(args.layers), "--steps", str(args.steps)],
                                 capture_output=True, text=True, check=True)
            measured[side] = json.loads(out.stdout.strip().splitlines()[-1])
        old, new = measured["full logits"], measured["head at the loss"]
        assert abs(old["loss"] - new["loss"]) <= 1e-3 * max(1.0, abs(old["loss"])), (old, new)  # the same loss
        rows.append({"shape": shape, "vocabulary": SHAPES[shape]["vocab_size"], "full_logits": old,
                     "head_at_loss": new, "memory_ratio": old["peak_mb"] / max(new["peak_mb"], 1e-9),
                     "speedup": old["median_s"] / new["median_s"]})
    print(f"rows {args.rows}, {args.prompt} prompt + {args.response} response tokens, {args.layers} layers; "
          "one forward + backward of a logprob loss")
    print("| shape | vocabulary | full logits: peak MB, s | head at the loss: peak MB, s | memory ratio | speed-up |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        o, n = r["full_logits"], r["head_at_loss"]
        print(f"| {r['shape']} | {r['vocabulary']:,} | {o['peak_mb']:.0f}, {o['median_s']:.3f} | "
              f"{n['peak_mb']:.0f}, {n['median_s']:.3f} | {r['memory_ratio']:.2f}x | {r['speedup']:.2f}x |")
    import torch

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"setup": {"rows": args.rows, "prompt": args.prompt, "response": args.response,
                                             "layers": args.layers, "steps": args.steps, "precision": "float32",
                                             "threads": torch.get_num_threads()},
                                   "machine": {"cpu": platform.machine(), "python": platform.python_version(),
                                               "torch": torch.__version__},
                                   "rows": rows}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
