"""``corerl serve`` measured: a Tinker training step through the server against the same step
in-process, and against corerl's own SFT step; throughput with 1, 2 and 4 clients; memory per adapter.

    .venv/bin/python bench/serve.py                                  # builtin:tiny-qwen2 (under a minute on 2 cores)
    .venv/bin/python bench/serve.py --model smollm2-135m-instruct    # the packaged SmolLM2-135M (converted once)

One process holds everything: a :class:`~corerl.run.tinker.peft_engine.PeftEngine` on the base
model (float32), ``corerl serve``'s application over it (uvicorn on a thread, a free loopback
port, one API key), and the official ``tinker`` SDK's clients. The batch is ``--rows`` random
token rows of ``--seq`` tokens, each a ``cross_entropy`` datum (input ``row[:-1]``, targets
``row[1:]``, weight 1); adapters are rank ``--rank`` on the attention and MLP linear layers
(alpha 32); Adam at 1e-4, no gradient clipping.

1. Latency of one step, ``forward_backward`` + ``optim_step`` (median of ``--steps`` after
   ``--warmup``), the three contenders alternating step by step:

   - ``sdk``: the SDK's ``TrainingClient`` through the server (both requests submitted, then both
     futures waited on, as the SDK allows);
   - ``engine``: the same engine's ``forward_backward`` and ``optim_step`` called in-process on an
     adapter of its own: the ratio sdk/engine is the service's overhead (HTTP, protobuf, futures);
   - ``corerl sft``: corerl's own SFT step (``corerl.algorithms.sft.SFT.step``, what
     ``algorithm.name: sft`` runs each step) on the recipe's training backend (selection's pick;
     world size 1, in this process) with ``policy.lora`` at the same rank and alpha, on the same
     rows (prompt ``row[:1]``, response ``row[1:]``: the same predicted tokens).
     ``--no-sft`` leaves it out.

2. Throughput: ``--clients`` (1, 2, 4) SDK clients on threads, each its own ``ServiceClient``
   and adapter, each taking ``--client-steps`` steps; datums per second over the wall time of all
   of them, the median of ``--rounds`` rounds (each round runs every count once). The engine runs
   one call at a time (a lock), so clients share its compute: more clients overlap the service's own work (HTTP, decoding, polling) with the engine's; "engine
   busy" is the share of the wall time spent inside the engine's ``forward_backward`` and
   ``optim_step`` (1.0: the engine is the bottleneck), "engine ms/step" the time inside it per
   step (on a CPU it grows when the clients' threads, in this process here, take CPU and the GIL
   from the engine's).

3. Memory per added adapter: ``engine.adapter_bytes`` and ``optimizer_bytes`` (after a step) of
   one adapter, and the process's resident memory (RSS): its growth from the loaded base model to
   the first adapter created and stepped through the server (the server's and the first step's
   one-off costs with it), then per adapter added after that (each created and stepped). Measured
   first, before any memory is freed that a new adapter could reuse; the throughput phase then
   uses these clients (the first 1, 2, 4 of them), and the latency phase runs last.

On a CPU torch computes with ``--threads`` threads, one by default: the figures are for the
ratios, and with one OpenMP thread per core on cores that other processes share, a step now and
then stalls for seconds at OpenMP's barriers (seen on the 2-core machine these figures come from:
steps of 20 ms and of 2 s in the same run), which no median hides in a throughput. ``--threads 0``
keeps torch's default.

Writes bench/results/serve.json (another ``--model``: serve-<model>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_output import results_path

DEFAULT_MODEL = "builtin:tiny-qwen2"


def results_file(model: str) -> Path:
    """bench/results/serve.json for the default model, serve-<model>.json for another."""
    if model == DEFAULT_MODEL:
        return results_path("serve.json")
    return results_path("serve-" + "".join(c if c.isalnum() or c in "-." else "-" for c in model).strip("-") + ".json")
KEY = "tml-bench-serve-key"
LR = 1e-4


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def make_rows(rows: int, seq: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(4, vocab) for _ in range(seq)] for _ in range(rows)]


def sft_engine(model_dir: Path, work: Path, rank: int, rows: int, seq: int) -> Any:
    """The recipe's training backend (selection's pick, world size 1) with a rank-``rank`` LoRA."""
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe

    recipe = write_recipe(work / "sft.yaml", {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": str(model_dir), "precision": "float32", "max_seq_length": seq,
                   "train_micro_batch_size": rows, "max_grad_norm": None,
                   "optimizer": {"name": "adamw", "lr": LR},
                   "lora": {"enabled": True, "dim": rank, "alpha": 32}},
        "algorithm": {"name": "sft"},
    })
    host = PluginHost(env={})
    config = load_config(recipe, [], host)
    selection = select(config, host)
    training = selection.training_backend.registration.create(config=config)
    training.load_hf(str(model_dir))
    return selection.training_backend.id, training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="the base model (builtin:tiny-qwen2, smollm2-135m-instruct, a folder)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rows", type=int, default=4, help="datums per step")
    parser.add_argument("--seq", type=int, default=64, help="tokens per row")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per contender")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--client-steps", type=int, default=30, help="steps each client takes in a throughput round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (each count once a round); the median")
    parser.add_argument("--no-sft", action="store_true", help="leave out corerl's SFT step")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's CPU threads (0: torch's default, one per core); see the docstring")
    args = parser.parse_args()

    import tinker
    import torch
    from rich.table import Table
    from tinker import types
    from transformers.utils import logging as hf_logging

    from corerl.algorithms.sft import SFT
    from corerl.environments.http_serving import BackgroundServer
    from corerl.reporting.console import make_console
    from corerl.run.tinker.engine import AdamParams, Datum, LoraSpec
    from corerl.run.tinker.peft_engine import PeftEngine
    from corerl.run.tinker.server import build_app
    from corerl.run.tinker.service import Limits, Service

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    os.environ["TINKER_TELEMETRY"] = "0"  # the SDK's telemetry: nothing here would take it
    console = make_console()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="corerl-bench-serve-"))
    engine = PeftEngine(args.model, max_adapters=max(args.clients) + 4, work_dir=work / "model")
    device = str(engine.device)
    rss_start = rss_bytes()  # the base model loaded
    where = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else \
        f"CPU, {threads} torch threads"
    rows = make_rows(args.rows, args.seq, engine.vocab_size)
    ours = [Datum(tokens=r[:-1], inputs={"target_tokens": [float(t) for t in r[1:]], "weights": [1.0] * (len(r) - 1)})
            for r in rows]
    sdk_data = [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)}) for r in rows]
    pairs = [(r[:1], r[1:]) for r in rows]
    adam = AdamParams(learning_rate=LR)
    sdk_adam = types.AdamParams(learning_rate=LR)

    def sync() -> None:
        if engine.device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn: Any) -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    service = Service(engine, work / "state", Limits())
    with BackgroundServer(build_app(service, [KEY]), name="corerl-bench-serve") as server:
        # -- 3. memory per added adapter, first (nothing freed yet whose memory a new adapter could reuse):
        # the clients of phase 2, each its own session and adapter; the first adapter's step pays the
        # one-off costs (autograd's buffers), the others' growth is per adapter
        count = max(args.clients)
        clients = [tinker.ServiceClient(base_url=server.url, api_key=KEY) for _ in range(count)]
        trainers: list[Any] = []
        rss_marks = []
        for i, c in enumerate(clients):
            trainer = c.create_lora_training_client(args.model, rank=args.rank, seed=10 + i).result()
            trainer.forward_backward(sdk_data, "cross_entropy")
            trainer.optim_step(sdk_adam).result()  # the optimizer state is allocated
            trainers.append(trainer)
            rss_marks.append(rss_bytes())
        one = trainers[0].model_id
        memory: dict[str, Any] = {"adapter_bytes": engine.adapter_bytes(one),
                                  "optimizer_bytes": engine.optimizer_bytes(one),
                                  "trainable_parameters": engine.info(one)["trainable_parameters"],
                                  "rss_growth_first_adapter_bytes": rss_marks[0] - rss_start}
        if count > 1:
            memory["rss_growth_per_added_adapter_bytes"] = (rss_marks[-1] - rss_marks[0]) // (count - 1)
            memory["added_adapters"] = count - 1

        # -- 2. throughput with 1, 2, 4 clients, each its own adapter
        busy: list[float] = []  # seconds inside the engine's training calls (it runs one at a time)

        def clocked(method: Any) -> Any:
            def call(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return method(*a, **k)
                finally:
                    busy.append(time.perf_counter() - start)
            return call

        engine.forward_backward = clocked(engine.forward_backward)  # type: ignore[method-assign]
        engine.optim_step = clocked(engine.optim_step)  # type: ignore[method-assign]

        def run(trainer: Any, errors: list[BaseException]) -> None:
            try:
                for _ in range(args.client_steps):
                    fb = trainer.forward_backward(sdk_data, "cross_entropy")
                    step = trainer.optim_step(sdk_adam)
                    fb.result()
                    step.result()
            except BaseException as exc:  # noqa: BLE001 (reported after the join)
                errors.append(exc)

        rounds: dict[int, list[tuple[float, float]]] = {count: [] for count in args.clients}  # (wall, busy)
        for _ in range(args.rounds):  # the counts interleaved: a change in the machine's load hits each alike
            for count in args.clients:
                errors: list[BaseException] = []
                workers = [threading.Thread(target=run, args=(t, errors)) for t in trainers[:count]]
                busy.clear()
                start = time.perf_counter()
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                wall = time.perf_counter() - start
                if errors:
                    raise errors[0]
                rounds[count].append((wall, sum(busy)))
        throughput_rows = []
        for count, measured in rounds.items():
            wall, inside = sorted(measured)[len(measured) // 2]  # the median round by wall time
            datums = count * args.client_steps * args.rows
            throughput_rows.append({"clients": count, "steps_each": args.client_steps, "datums": datums,
                                    "rounds": args.rounds, "seconds": round(wall, 3),
                                    "datums_per_s": round(datums / wall, 2),
                                    "datums_per_s_rounds": [round(datums / w, 2) for w, _ in measured],
                                    "engine_busy": round(inside / wall, 3),
                                    "engine_ms_per_step": round(inside / (count * args.client_steps) * 1e3, 2)})
        for row in throughput_rows:
            row["vs_1_client"] = round(row["datums_per_s"] / throughput_rows[0]["datums_per_s"], 3)
        del engine.forward_backward, engine.optim_step  # the engine's own methods again
        for c in clients:  # the sessions end: their adapters are freed
            c.close("success").result()

        # -- 1. one step's latency: through the server, the engine in-process, corerl's SFT step
        client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        training = client.create_lora_training_client(args.model, rank=args.rank, seed=1).result()
        engine.create("bench-direct", LoraSpec(rank=args.rank, seed=1))
        losses: dict[str, list[float]] = {"sdk": [], "engine": [], "corerl sft": []}

        def sdk_step() -> None:
            fb = training.forward_backward(sdk_data, "cross_entropy")
            step = training.optim_step(sdk_adam)
            losses["sdk"].append(fb.result().metrics["loss:sum"] / len(pairs) / (args.seq - 1))
            step.result()

        def engine_step() -> None:
            out = engine.forward_backward("bench-direct", ours, "cross_entropy", None)
            engine.optim_step("bench-direct", adam)
            losses["engine"].append(out.metrics["loss:sum"] / len(pairs) / (args.seq - 1))

        contenders: dict[str, Any] = {"sdk": sdk_step, "engine": engine_step}
        sft_backend, sft_training = None, None
        if not args.no_sft:
            sft_backend, sft_training = sft_engine(engine.model_path, work, args.rank, args.rows, args.seq)
            torch.set_num_threads(threads)  # the same threads for every contender, whatever the backend set
            sft = SFT(sft_training)
            contenders["corerl sft"] = lambda: losses["corerl sft"].append(sft.step(pairs)["loss"])
        times: dict[str, list[float]] = {name: [] for name in contenders}
        try:
            for rep in range(args.warmup + args.steps):
                for name, step in contenders.items():
                    seconds = timed(step)
                    if rep >= args.warmup:
                        times[name].append(seconds)
        finally:
            if sft_training is not None:
                sft_training.shutdown()
        engine.delete("bench-direct")
        client.close("success").result()
        latency = {name: statistics.median(values) for name, values in times.items()}
        latency_rows = []
        for name, seconds in latency.items():
            latency_rows.append({
                "contender": name, "median_ms": round(seconds * 1e3, 2),
                "min_ms": round(min(times[name]) * 1e3, 2), "max_ms": round(max(times[name]) * 1e3, 2),
                "vs_engine": round(seconds / latency["engine"], 3),
                "vs_corerl_sft": round(seconds / latency["corerl sft"], 3) if "corerl sft" in latency else None,
                "first_loss": round(losses[name][0], 4), "last_loss": round(losses[name][-1], 4)})

    total = time.perf_counter() - started
    setup = {"model": args.model, "device": device, "where": where, "rank": args.rank, "rows": args.rows,
             "seq": args.seq, "warmup": args.warmup, "steps": args.steps, "sft_backend": sft_backend,
             "precision": "float32", "torch_threads": threads, "rss_at_start_bytes": rss_start, "seconds": round(total, 1),
             "command": "python bench/serve.py " + " ".join(sys.argv[1:])}

    table = Table(title=f"one forward_backward(cross_entropy) + optim_step, {args.rows}x{args.seq} tokens, "
                        f"rank {args.rank}, {args.model}, {where} (median of {args.steps})")
    for column in ("contender", "median ms", "min..max ms", "vs engine in-process", "vs corerl SFT step",
                   "loss first -> last"):
        table.add_column(column)
    names = {"sdk": "tinker SDK -> corerl serve", "engine": "PeftEngine in-process",
             "corerl sft": f"corerl SFT step ({sft_backend}, LoRA)"}
    for row in latency_rows:
        table.add_row(names[row["contender"]], f"{row['median_ms']:.1f}", f"{row['min_ms']:.1f}..{row['max_ms']:.1f}",
                      f"{row['vs_engine']:.2f}x", "-" if row["vs_corerl_sft"] is None else f"{row['vs_corerl_sft']:.2f}x",
                      f"{row['first_loss']:.3f} -> {row['last_loss']:.3f}")
    console.print(table)
    table = Table(title=f"throughput: concurrent SDK clients, one adapter each, {args.client_steps} steps each "
                        f"(median of {args.rounds} rounds)")
    for column in ("clients", "datums", "seconds", "datums/s", "vs 1 client", "engine busy", "engine ms/step"):
        table.add_column(column)
    for row in throughput_rows:
        table.add_row(str(row["clients"]), str(row["datums"]), f"{row['seconds']:.2f}", f"{row['datums_per_s']:.1f}",
                      f"{row['vs_1_client']:.2f}x", f"{row['engine_busy'] * 100:.0f}%",
                      f"{row['engine_ms_per_step']:.1f}")
    console.print(table)
    grown = memory.get("rss_growth_per_added_adapter_bytes")
    console.print(f"memory per adapter (rank {args.rank}): weights {memory['adapter_bytes'] / 1e6:.3f} MB, "
                  f"Adam state {memory['optimizer_bytes'] / 1e6:.3f} MB (the engine's count); process RSS: "
                  f"{memory['rss_growth_first_adapter_bytes'] / 1e6:.1f} MB for the server and the first adapter "
                  "and its step" + ("" if grown is None else
                                    f", {grown / 1e6:.2f} MB per adapter added after it ({memory['added_adapters']})"))
    console.print(f"total {total:.1f} s")
    results = results_file(args.model)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"setup": setup, "latency": latency_rows, "throughput": throughput_rows,
                                   "memory_per_adapter": memory}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
