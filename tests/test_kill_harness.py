"""The kill harness: a short run is SIGKILLed (its whole process group) at points spread over its
whole life, chosen from the run's own progress markers (``corerl.progress_markers``: the run
stops at the named marker until it is killed, so the kill lands exactly there); after each kill
the same command runs again, and the run that finally completes must match an uninterrupted
one, step for step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corerl.complete_folders import is_complete
from tests.conftest import clean_env, run_corerl, start_held, wait_for_marker
from tests.recovery_runs import assert_same_steps
from tests.refusals import refused_in_one_line

# 2 SFT + 3 GRPO steps, a checkpoint after every step (keep_last 1 prunes at every save), hf
# generation on the training model: about 7 s a run
ARGS = ["sft.max_steps=2", "algorithm.max_steps=3", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
        "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1",
        "policy.generation.backend=hf"]

# in the order a run reaches them; each one is where the next attempt is killed, one a recovery
# path: a folder's "begin" (its work folder made, still empty) recovers as its "filled" does (so
# base_model's and final's "begin" are left out), sft:step:1 starts over as the kill in the first
# checkpoint's save does, and a kill at step 4's save, at GRPO step 3 or in step 5's save resumes
# from a GRPO checkpoint and cuts the log as grpo:step:2's next attempt does
KILL_POINTS = [
    "folder:base_model:filled",    # model build: weights written, folder not sealed
    "folder:step_000001:filled",   # inside the first (SFT) checkpoint save: none complete, start over
    "folder:step_000002:begin",    # the SFT-end checkpoint save starting: resume within SFT
    "folder:sft_model:filled",     # inside the SFT model export
    "grpo:step:1",                 # a GRPO row logged before any GRPO checkpoint: cut across the phases
    "folder:step_000003:filled",   # inside a GRPO checkpoint save (pruning still to come)
    "grpo:step:2",                 # step 4 logged, its checkpoint not saved: the next run cuts the log
    "metrics:rewrite",             # inside that cut: the shorter log written aside, not yet renamed in
    "folder:final:filled",         # inside the final export: written, not sealed
]
TRUSTED = ("base_model", "sft_model", "final")
#: the kill points reached before the run has logged a step (no metrics.jsonl yet)
BEFORE_ANY_STEP = {"folder:base_model:filled"}


def _start(tmp_path: Path, markers: Path, hold: str, args: list[str] = ARGS) -> subprocess.Popen[str]:
    return start_held(tmp_path, markers, hold, args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # well-formed: every line one JSON object
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "refit/"))} for row in rows]


# the uninterrupted run keeps no checkpoint: its metrics are those of one that does
NO_CHECKPOINTS = [*(a for a in ARGS if not a.startswith("checkpointing.")), "checkpointing.enabled=false"]
# the kill that leaves a run directory without a complete checkpoint, metrics written
NONE_COMPLETE = "folder:step_000001:filled"


@pytest.mark.slow
def test_a_run_killed_at_every_stage_and_run_again_ends_like_an_uninterrupted_one(tmp_path, runs_beside):
    """Besides: a run directory without a complete checkpoint is refused by ``run.resume=must`` in one
    line and started over in place by the next run, saying what it removed (the kill in the first
    checkpoint's save leaves one); a finished run without a checkpoint (the uninterrupted one) is
    refused rather than overwritten."""
    started = runs_beside.start("run", f"run.output_dir={tmp_path}", "run.name=straight", *NO_CHECKPOINTS)
    run_dir = tmp_path / "killed"

    previous = None
    for point in KILL_POINTS:
        markers = tmp_path / f"markers-{point.replace(':', '_')}"
        proc = _start(tmp_path, markers, point)
        wait_for_marker(markers, point, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _group_is_gone(proc.pid), f"processes of the run killed at {point} outlived it"
        out = proc.stdout.read()
        if previous == NONE_COMPLETE:
            assert f"run directory {run_dir} holds no complete checkpoint: starting over (removed metrics.jsonl, " \
                   "tensorboard, checkpoints)" in out, out
        previous = point
        # whatever sits at a trusted name is complete; a half-written folder stays out of sight
        for name in TRUSTED:
            folder = run_dir / name
            assert not folder.exists() or is_complete(folder), (point, name, sorted(os.listdir(folder)))
        for checkpoint in (run_dir / "checkpoints").glob("step_*"):
            assert is_complete(checkpoint), (point, checkpoint.name)
        # the log exists from the first logged step on (every point but the first): checked, not assumed
        logged = (run_dir / "metrics.jsonl").exists()
        assert logged == (point not in BEFORE_ANY_STEP), (point, logged)
        rows = _rows(run_dir) if logged else []  # never truncated or torn: every line one JSON object
        if point == "metrics:rewrite":  # the cut was under way: the log it replaces is still whole
            assert len(rows) == 4, (point, len(rows))
        if point == NONE_COMPLETE:
            assert [(r["phase"], r["step"]) for r in rows] == [("sft", 1)]
            must = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=killed", *ARGS, "run.resume=must")
            refused_in_one_line(must, "run.resume", "no complete checkpoint", key="run.resume")

    final = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=killed", *ARGS)
    assert final.code == 0, final
    straight = started.result()
    assert straight.code == 0, straight
    finished = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=straight", *NO_CHECKPOINTS)
    refused_in_one_line(finished, "holds a finished run", key="run.name")
    assert "Traceback" not in final.out + final.err
    assert_same_steps(_rows(tmp_path / "straight"), _rows(run_dir))
    assert is_complete(run_dir / "final")
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 5
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000005"]
    assert not [p.name for p in run_dir.rglob(".*.partial-*")], "a partial folder was left behind"


_REPLACE_SCRIPT = """
import sys
from pathlib import Path
from corerl.complete_folders import write_complete
def fill(work, text):
    (work / "weights.bin").write_bytes(text.encode() * 1000)
    (work / "state.json").write_text(text)
write_complete(Path(sys.argv[1]), lambda work: fill(work, sys.argv[2]))
"""


@pytest.mark.parametrize("point, expected", [("folder:ckpt:filled", "old"), ("folder:ckpt:aside", "new")])
def test_replacing_a_folder_killed_midway_leaves_one_complete_version(tmp_path, point, expected):
    target = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-c", _REPLACE_SCRIPT, str(target), "old"], check=True, env=clean_env())
    markers = tmp_path / "markers"
    proc = subprocess.Popen([sys.executable, "-c", _REPLACE_SCRIPT, str(target), "new"], start_new_session=True,
                            env=clean_env({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_HOLD_AT": point}))
    wait_for_marker(markers, point, proc, seconds=60)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # killed after sealing, between the two renames: nothing at the name, both versions aside
    assert target.exists() == (point == "folder:ckpt:filled")

    from corerl.complete_folders import recover

    recover(target)
    assert is_complete(target) and (target / "state.json").read_text() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "markers"]  # leftovers gone
