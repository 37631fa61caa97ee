"""Asynchronous GRPO runs end to end (``corerl run``, a generation worker in a Ray actor): with
staleness 0 and the in-order sampler the steps are those of a synchronous run; with staleness 1
no trajectory trained on is older than one version; a generation worker killed mid-run is
restarted and its prompts requeued (and the run stops in one line past the bound); a run
SIGKILLed mid-way resumes from its checkpoint, rebuilding the buffer and training nothing twice;
multi-turn episodes play against the dedicated worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import CORERL, REPO, clean_env, run_corerl, start_held, wait_for_marker

pytestmark = pytest.mark.slow

COMMON = ["sft.max_steps=2", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4", "run.tensorboard=false"]
BASE = [*COMMON, "policy.generation.backend=hf"]
VLLM = [*COMMON, "policy.generation.backend=vllm"]
ASYNC = ["algorithm.async.enabled=true", "policy.generation.colocated.enabled=false",
         "policy.generation.colocated.resources.gpus_per_node=1"]


def rows(run_dir: Path, phase: str = "grpo") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == phase]


def comparable(row: dict) -> dict:
    """What a synchronous step also reports, less timings and the async bookkeeping, and less the gap
    between the engines (a synchronous run here samples with the training model itself: no gap at
    all; the dedicated worker's own copy computes in another process: rounding, checked below)."""
    return {k: v for k, v in row.items() if not k.startswith(("time/", "refit/", "async/", "logprob_mismatch/",
                                                                 "importance_ratio/"))}


def assert_same_steps(want: list[dict], got: list[dict]) -> None:
    assert len(want) == len(got)
    for a, b in zip(map(comparable, want), map(comparable, got), strict=True):
        assert a.keys() == b.keys(), a.keys() ^ b.keys()
        for key, value in a.items():
            if isinstance(value, str):
                assert value == b[key]
            else:  # the tolerance the resume tests use
                assert abs(value - b[key]) <= 1e-6 * max(1.0, abs(value)), (a["step"], key, value, b[key])


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_staleness_0_in_order_trains_exactly_the_steps_of_a_synchronous_run(tmp_path, backend, runs_beside):
    """vllm: the synchronous run samples through ``LLM.generate`` in the engine's actor, the
    asynchronous one steps the engine in the generation worker (in_flight=continue's loop)."""
    steps = ["algorithm.max_steps=5"]
    base = BASE if backend == "hf" else VLLM
    started = runs_beside.start("run", f"run.output_dir={tmp_path}", "run.name=sync", *base, *steps)
    asynchronous = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=async", *base, *steps, *ASYNC,
                              "algorithm.async.max_staleness=0", "algorithm.async.sampler=in_order")
    sync = started.result()
    assert sync.code == 0, sync
    assert asynchronous.code == 0, asynchronous
    assert f"generation: {backend} on a dedicated worker" in asynchronous.out
    got = rows(tmp_path / "async")
    assert_same_steps(rows(tmp_path / "sync"), got)
    assert all(r["async/staleness/max"] == 0 for r in got)
    if backend == "hf":  # the synchronous run samples with the training model itself: no gap
        assert all(r["logprob_mismatch/max"] < 1e-4 and abs(r["importance_ratio/mean"] - 1) < 1e-5 for r in got)
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("sync", "async")]
    assert summaries[0]["held_out_reward_after"] == summaries[1]["held_out_reward_after"]


def test_staleness_1_never_trains_a_trajectory_more_than_one_version_old(tmp_path):
    """On vllm (the hf worker's staleness is the staleness-0 test's and the abort test's)."""
    result = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=one", *VLLM, *ASYNC, "algorithm.max_steps=6",
                        "algorithm.async.max_staleness=1", "algorithm.importance_sampling_correction=true",
                        "algorithm.importance_weight_cap=2.0", "run.tensorboard=true")
    assert result.code == 0, result
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "one" / "tensorboard"), size_guidance={"histograms": 0}).Reload()
    assert len(events.Histograms("grpo/async/staleness")) == 6  # the staleness of each step's groups
    got = rows(tmp_path / "one")
    ages = [age for r in got for age in r["async/staleness"]]  # every group's, read from its token stamps
    assert len(ages) == 6 * 4 and max(ages) <= 1
    assert any(age == 1 for age in ages), "generation never ran ahead of training"
    assert all(r["async/dropped"] == 0 for r in got)  # in order, generation waits instead of overrunning
    # the off-policy metrics of every step: the gap between the engines, the ratios' spread
    for key in ("logprob_mismatch/max", "logprob_mismatch/kl", "importance_ratio/std", "importance_ratio/clipped_share"):
        assert all(key in r for r in got), key
    assert max(r["logprob_mismatch/max"] for r in got) > 1e-3  # stale tokens: the gap is real


def _watch(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _kill_worker_after_steps(tmp_path: Path, name: str, extra: list[str], after: int = 2,
                            base: list[str] = BASE) -> tuple[int, str]:
    """Run, SIGKILL the generation worker once ``after`` GRPO steps are logged; exit code and output."""
    proc = subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", f"run.name={name}", *base, *ASYNC,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(),
                            cwd=REPO, start_new_session=True)
    lines: list[str] = []
    reader = _watch(proc, lines)
    deadline = time.monotonic() + 300
    metrics = tmp_path / name / "metrics.jsonl"
    while not (metrics.exists() and len(rows(tmp_path / name)) >= after):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (pid,) = {int(m) for line in lines for m in re.findall(r"dedicated worker \(pid (\d+)", line)}
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def test_a_generation_worker_that_dies_is_restarted_and_its_prompts_requeued(tmp_path):
    """On vllm: the restarted worker starts its engine again (hf's worker restarts in the next test)."""
    code, out = _kill_worker_after_steps(tmp_path, "restarted", ["algorithm.max_steps=8"], base=VLLM)
    assert code == 0, out
    assert "generation worker (pid" in out and "died; starting it again (1 of 3 restarts)" in out
    got = rows(tmp_path / "restarted")
    assert [r["step"] for r in got] == list(range(1, 9))  # every step trained a whole batch
    assert all(len(r["async/staleness"]) == 4 for r in got)
    assert got[-1]["async/generation_restarts"] == 1


def test_past_max_generation_failures_the_run_stops_in_one_line(tmp_path):
    code, out = _kill_worker_after_steps(tmp_path, "stopped", ["algorithm.max_steps=30",
                                                                "algorithm.async.max_generation_failures=0"])
    assert code == 1, out
    (line,) = [line for line in out.splitlines() if line.startswith("corerl: error:")]
    assert line.startswith("corerl: error: algorithm.async.max_generation_failures: the generation worker died once, "
                           "more than algorithm.async.max_generation_failures=0 allows"), line
    assert "Traceback" not in out


def _kill_at(tmp_path: Path, point: str, args: list[str]) -> tuple[int, list[Path]]:
    """The run killed (SIGKILL, its whole process group) at ``point``: the killed driver's pid, and
    its weight files in shared memory seen just before the kill."""
    from corerl.generation.shared_weights import _shm_dir

    markers = tmp_path / f"markers-{point.replace(':', '_')}"
    proc = start_held(tmp_path, markers, point, args)
    wait_for_marker(markers, point, proc)
    weight_files = list(Path(_shm_dir()).glob(f"corerl-weights-{proc.pid}-*"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return proc.pid, weight_files


def test_a_sigkilled_async_run_resumes_from_where_its_buffer_stood(tmp_path):
    """On vllm (tests/test_recovery.py recovers an hf asynchronous run from five faults)."""
    args = [*VLLM, *ASYNC, "algorithm.max_steps=6", "algorithm.async.max_staleness=1",
            "checkpointing.enabled=true", "checkpointing.save_period=2", "checkpointing.keep_last=1"]
    # killed after GRPO step 3 is logged (its checkpoint, at step 2 of GRPO, holds the buffer's position),
    # with generation one batch ahead
    killed, weight_files = _kill_at(tmp_path, "grpo:step:3", args)
    assert weight_files  # the driver had pushed weights through shared memory when it was killed
    state = json.loads(next((tmp_path / "killed" / "checkpoints").glob("step_*/async_state.json")).read_text())
    # at the checkpoint after GRPO step 2, batches 0 and 1 were trained: a resumed run draws from batch 2,
    # and nothing of it or later batches had been trained
    assert state == {"first_batch": 2, "settled": []}
    resumed = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=killed", *args)
    assert resumed.code == 0, resumed
    assert "resuming from step 4" in resumed.out  # 2 SFT + 2 GRPO steps
    got = rows(tmp_path / "killed")
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert max(age for r in got for age in r["async/staleness"]) <= 1
    assert not any(path.exists() for path in weight_files)  # a later run removed them (the killer cannot)


def test_multi_turn_episodes_of_several_batches_play_at_once_against_the_dedicated_worker(tmp_path):
    result = run_corerl("run", str(REPO / "examples" / "configs" / "grpo_tools_demo.yaml"),
                        f"run.output_dir={tmp_path}", "run.name=tools", "sft.max_steps=5", "algorithm.max_steps=4",
                        "run.tensorboard=false", *ASYNC, "algorithm.async.max_inflight_prompts=32")
    assert result.code == 0, result
    got = rows(tmp_path / "tools")
    assert len(got) == 4 and all(r["env/episodes"] == 16 * 8 for r in got)  # whole batches of episodes
    assert all(r["async/staleness/max"] <= 1 for r in got)


def _logprobs_under(model, sample) -> list[float]:
    """Each completion token's logprob under ``model`` given everything before it (a plain forward)."""
    import torch

    ids = torch.tensor([[*sample.prompt_ids, *sample.completion_ids]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    return logp.gather(-1, ids[0, 1:, None])[len(sample.prompt_ids) - 1:, 0].tolist()


@pytest.mark.parametrize(("backend", "tolerance"), [("hf", 1e-3), ("vllm", 5e-2)])
def test_abort_resumes_each_cut_request_from_its_tokens_on_the_dedicated_worker(tmp_path, backend, tolerance):
    """``in_flight=abort`` through the real worker: weights pushed while 16 long requests run cut the
    call short; each request resumes from its tokens under the new version and ends as it would
    (at a stop token or the token budget), its stamps old then new. The weights pushed differ from
    the ones loaded (the final norm's weight times 20: the same model, 20 times sharper), and every
    token's logged logprob is the one the weights of its stamped version give, not the other's. On vllm
    the engine is split over 2 tensor-parallel ranks in the worker's actor (vLLM's worker processes):
    each push reaches both ranks."""
    import threading

    from transformers import AutoModelForCausalLM

    from corerl.asynchronous.engine import DedicatedGeneration
    from corerl.asynchronous.settings import AsyncSettings
    from corerl.config import config_from_mapping
    from corerl.generation.contract import SamplingSettings
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost

    shape = {"hidden_size": 64} if backend == "hf" else {"hidden_size": 128, "num_heads": 4, "num_kv_heads": 2}
    model = str(build_tiny_model(tmp_path / "model", num_layers=2, vocab_size=128, **shape))  # vLLM: head_dim 32
    host = PluginHost(discover=backend != "hf", env={})
    split = {"vllm_cfg": {"tensor_parallel_size": 2}} if backend == "vllm" else {}
    config = config_from_mapping({"policy": {"model_name": model, "max_seq_length": 512, "generation": {
        "backend": backend, "colocated": {"enabled": False, "resources": {"gpus_per_node": 1}}, **split}}}, host)
    engine = DedicatedGeneration(host.generation_backends.get(backend), config, AsyncSettings(enabled=True,
                                                                                             in_flight="abort"))
    loaded = AutoModelForCausalLM.from_pretrained(model).eval()
    sharper = AutoModelForCausalLM.from_pretrained(model).eval()
    with __import__("torch").no_grad():
        sharper.model.norm.weight.mul_(20.0)
    # version 0 is the model loaded; odd versions push the sharper weights, even ones the loaded weights again
    by_version = {0: loaded}
    try:
        engine.load_hf(model)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=400, seed=3, stop_token_ids=(127,))
        mixed = []
        for version in (1, 2, 3):  # the push lands mid-call unless the machine is very slow to start it
            by_version[version] = sharper if version % 2 else loaded
            weights = [(n, t.clone()) for n, t in by_version[version].state_dict().items()]
            pusher = threading.Timer(0.3, engine.push, args=(weights, version))
            pusher.start()
            groups = engine.generate([[1, 2, 3]] * 16, sampling, 1)
            pusher.join()
            gaps: dict[bool, list[float]] = {False: [], True: []}
            for (sample,) in groups:
                assert len(sample.versions) == len(sample.completion_ids) == len(sample.logprobs)
                assert sample.finish_reason == "stop" or len(sample.completion_ids) == 400
                assert list(sample.versions) == sorted(sample.versions)  # old tokens, then new ones
                assert set(sample.versions) <= {version - 1, version}, sample.versions
                assert sample.prompt_ids == (1, 2, 3)
                under = {v: _logprobs_under(by_version[v], sample) for v in set(sample.versions)}
                other = {v: _logprobs_under(sharper if by_version[v] is loaded else loaded, sample) for v in under}
                for i, (logged, v) in enumerate(zip(sample.logprobs, sample.versions, strict=True)):
                    assert abs(logged - under[v][i]) <= tolerance, (version, i, v, logged, under[v][i])
                    gaps[v == version].append(abs(logged - other[v][i]))
            # the check above tells the two weights apart: what each version generated is, on average,
            # far from what the other weights give (the tokens after the push included)
            for after_push, seen in gaps.items():
                assert not seen or sum(seen) / len(seen) > 20 * tolerance, (version, after_push, sum(seen) / len(seen))
            mixed += [s for (s,) in groups if len(set(s.versions)) > 1]
            if mixed:
                break
        assert mixed, "no push landed while requests were running"
        assert gaps[True], "no token was generated under the pushed weights"
    finally:
        engine.shutdown()
