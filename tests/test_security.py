"""Checkpoints are read without running code from them; unwritable and full output locations
are one-line user errors."""

from __future__ import annotations

import json
import os
import pickle
import resource
import signal
import subprocess
import sys

import pytest
import torch

from corerl.checkpoint_safety import (
    CheckpointRefused,
    load_plain,
    pickle_globals,
    verify_file,
    verify_folder,
)
from tests.conftest import CORERL, REPO, clean_env, run_corerl
from tests.refusals import refused_in_one_line


class _Payload:
    """What an attacker plants: unpickling it runs a shell command (touching a marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_globals_are_read_without_running_anything(tmp_path):
    marker = tmp_path / "ran"
    data = pickle.dumps({"ok": [1, 2.0, "x"], "bad": _Payload(marker)})
    assert "posix.system" in pickle_globals(data) and not marker.exists()
    assert pickle_globals(pickle.dumps({"a": (1, 2), "b": {3}})) == []  # builtin containers have opcodes
    from collections import OrderedDict

    assert pickle_globals(pickle.dumps(OrderedDict(a=1))) == ["collections.OrderedDict"]


@pytest.mark.parametrize("how", ["raw pickle", "torch.save"])
def test_a_planted_payload_is_refused_without_running_it(tmp_path, how):
    marker = tmp_path / "ran"
    path = tmp_path / "rank0.pt"
    if how == "raw pickle":
        path.write_bytes(pickle.dumps({"step": 3, "rng": _Payload(marker)}))
    else:
        torch.save({"step": 3, "rng": _Payload(marker)}, path)
    with pytest.raises(CheckpointRefused, match="posix.system, which loading it would call"):
        verify_file(path)
    if how == "torch.save":
        with pytest.raises(CheckpointRefused, match="more than tensors and plain data"):
            load_plain(path)
    assert not marker.exists()


def test_corerl_s_own_checkpoint_files_are_plain_data(tmp_path):
    from corerl.distributed.rank_state import capture_rng, restore_rng

    torch.save({"step": 4, "rng": capture_rng(), "scheduler": {"last_epoch": 4, "lr": [0.1]}}, tmp_path / "rank0.pt")
    verify_file(tmp_path / "rank0.pt")
    import random

    import numpy as np

    state = load_plain(tmp_path / "rank0.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(state["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_a_real_dtensor_checkpoint_verifies_and_a_planted_metadata_is_refused(tmp_path):
    from corerl.config import load_config
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe
    from corerl.testing.conformance import conformance_batch, conformance_loss

    host = PluginHost()
    model = str(build_tiny_model(tmp_path / "model", hidden_size=32, num_layers=1))
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model}})
    backend = host.training_backends.get("dtensor").create(config=load_config(recipe, [], host))
    try:
        backend.load_hf(model)
        backend.train_step(conformance_batch(), conformance_loss)
        backend.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        backend.shutdown()
    verify_folder(tmp_path / "ckpt")  # torch.distributed.checkpoint's own files pass
    metadata = tmp_path / "ckpt" / "weights" / ".metadata"
    marker = tmp_path / "ran"
    metadata.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointRefused, match=r"\.metadata names posix.system"):
        verify_folder(tmp_path / "ckpt")
    assert not marker.exists()


def test_the_ray_token_is_made_private(tmp_path, monkeypatch):
    from corerl.distributed.worker_group import private_token

    monkeypatch.setenv("HOME", str(tmp_path))
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("secret")
    token.chmod(0o644)  # as Ray 2.60 leaves it
    private_token()
    assert token.stat().st_mode & 0o777 == 0o600


SFT = ["algorithm.name=sft", "algorithm.max_steps=4", "algorithm.batch_size=8", "checkpointing.enabled=true",
       "checkpointing.save_period=2", "run.tensorboard=false", "policy.generation.backend=hf"]


def test_resuming_a_run_whose_checkpoint_holds_a_payload_refuses_it_in_one_line(tmp_path):
    from corerl.complete_folders import manifest, seal

    first = run_corerl("run", *SFT, f"run.output_dir={tmp_path}", "run.name=victim")
    assert first.code == 0, first
    step = sorted((tmp_path / "victim" / "checkpoints").glob("step_*"))[-1]
    marker = tmp_path / "ran"
    torch.save({"step": 4, "rng": _Payload(marker)}, step / "training" / "rank0.pt")
    seal(step, (manifest(step) or {}).get("meta"))  # an attacker seals the folder again
    again = run_corerl("run", *SFT, f"run.output_dir={tmp_path}", "run.name=victim")
    assert again.code == 1, again
    (line,) = again.err.strip().splitlines()
    assert "rank0.pt" in line and "posix.system" in line and "refused" in line, line
    assert not marker.exists()


def test_an_unwritable_run_directory_is_refused_before_anything_is_built(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_corerl("run", *SFT, f"run.output_dir={blocker}", "run.name=x")
    line = refused_in_one_line(result, key="run.output_dir")
    assert line.startswith("corerl: error: run.output_dir: cannot make the run directory") and str(blocker) in line
    assert f"{blocker} is a file, not a folder" in line, line


def test_a_disk_full_mid_run_stops_with_the_path_and_keeps_the_last_checkpoint(tmp_path):
    args = [*SFT, f"run.output_dir={tmp_path}", "run.name=full"]
    full = run_corerl("run", *args, env={"CORERL_TEST_NO_SPACE_AT": "folder:step_000004:filled",
                                         "CORERL_PROGRESS_MARKERS": str(tmp_path / "markers")})
    assert full.code == 1, full
    (line,) = full.err.strip().splitlines()
    assert "No space left on device" in line and str(tmp_path / "full") in line and "checkpoint is intact" in line
    checkpoints = [p.name for p in (tmp_path / "full" / "checkpoints").iterdir() if not p.name.startswith(".")]
    assert checkpoints == ["step_000002"]
    resumed = run_corerl("run", *args)
    assert resumed.code == 0 and "resuming from step 2" in resumed.out, resumed
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["sft_steps"] == 4


#: the capability mount(8) needs (linux/capability.h)
CAP_SYS_ADMIN = 21


def _cannot_mount() -> str | None:
    """Why this process cannot mount a file system (None: it can): the one reason the really-full
    disk test cannot run here, not any failure of mount."""
    import shutil

    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "a small file system to fill needs mount(8) and umount(8), not installed here"
    try:
        status = open("/proc/self/status", encoding="utf-8").read()  # noqa: SIM115
    except OSError:
        return "a small file system to fill needs Linux's tmpfs and /proc (not this system)"
    effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    if not effective >> CAP_SYS_ADMIN & 1:
        return "a small file system to fill needs mount, which needs CAP_SYS_ADMIN (root in most CI runners); this process has not"
    return None


def test_a_really_full_disk_during_a_checkpoint_save_says_no_space_left_with_the_free_space(tmp_path):
    """A 4 MiB file system holds the base model (1.2 MiB) but not the first checkpoint: torch's
    writer says only "unexpected pos 704 vs 598"; corerl names the cause and the free space."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (missing := _cannot_mount()) is not None:
        pytest.skip(missing)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0 and "permission denied" in mounted.stderr.lower():
        pytest.skip(f"this machine's security policy refuses mount even with CAP_SYS_ADMIN: {mounted.stderr.strip()}")
    assert mounted.returncode == 0, f"mounting a 4 MiB tmpfs failed with the rights to do it: {mounted.stderr.strip()}"
    try:
        full = run_corerl("run", *SFT, f"run.output_dir={disk}", "run.name=full")
        assert full.code == 1, full
        (line,) = full.err.strip().splitlines()
        assert f"saving checkpoint {disk / 'full' / 'checkpoints'}" in line, line
        assert "No space left on device (0.0 MiB free there)" in line and "unexpected pos" not in line, line
        assert f"the run's log: {disk / 'full' / 'run.log'}" in line
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_file_size_limit_hit_while_writing_is_a_one_line_error_naming_the_file(tmp_path):
    def limit() -> None:  # files may grow to 256 KiB: the base model's weights cannot be written
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    proc = subprocess.run([str(CORERL), "run", *SFT, f"run.output_dir={tmp_path}", "run.name=limited"],
                          capture_output=True, text=True, env=clean_env(), cwd=REPO, preexec_fn=limit, timeout=300)
    assert proc.returncode == 1, proc
    (line,) = proc.stderr.strip().splitlines()
    assert "File too large" in line and "run.output_dir" in line and str(tmp_path / "limited") in line, line


def test_a_checkpoint_engine_failing_mid_save_is_one_line_naming_the_checkpoint(tmp_path):
    # torch.distributed.checkpoint raises CheckpointException, a BaseException, when a rank's
    # write fails: files may grow to 2 MiB, enough for the base model (1.2 MiB) and not for the
    # checkpoint's weights and Adam moments in one file.
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * 2**20, 2 * 2**20))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    args = [*SFT, f"run.output_dir={tmp_path}", "run.name=limited"]
    proc = subprocess.run([str(CORERL), "run", *args], capture_output=True, text=True, env=clean_env(), cwd=REPO,
                          preexec_fn=limit, timeout=300)
    assert proc.returncode == 1, proc
    (line,) = proc.stderr.strip().splitlines()
    assert f"saving checkpoint {tmp_path / 'limited' / 'checkpoints'}" in line and "failed on rank 0" in line, line
    assert "MiB free there" in line and "last complete checkpoint is intact" in line, line
    assert not [p for p in (tmp_path / "limited" / "checkpoints").iterdir() if not p.name.startswith(".")]
    again = run_corerl("run", *args)
    assert again.code == 0 and "starting over" in again.out, again


def test_checkpoint_failure_names_the_rank_and_cause_and_keeps_ctrl_c():
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from corerl.errors import RunError
    from corerl.failures import checkpoint_errors

    def raised(cause: BaseException) -> BaseException:
        try:
            raise cause
        except BaseException as exc:
            return CheckpointException("save failed", {1: _wrap_exception(exc)})

    with pytest.raises(RunError) as full, checkpoint_errors("saving", "/runs/x/checkpoints/step_4"):
        raise raised(OSError(28, "No space left on device"))
    assert full.value.one_line().startswith("run.output_dir: saving checkpoint /runs/x/checkpoints/step_4 failed on "
                                            "rank 1: No space left on device")
    with pytest.raises(RunError) as corrupt, checkpoint_errors("loading", "/runs/x/checkpoints/step_4"):
        raise raised(RuntimeError("PytorchStreamReader failed reading zip archive\nmore"))
    assert "loading checkpoint /runs/x/checkpoints/step_4 failed on rank 1: RuntimeError: PytorchStreamReader " \
           "failed reading zip archive; the checkpoint is damaged" in corrupt.value.one_line()
    with pytest.raises(KeyboardInterrupt), checkpoint_errors("saving", "/runs/x"):
        raise raised(KeyboardInterrupt())
    with pytest.raises(ValueError), checkpoint_errors("saving", "/runs/x"):  # anything else is not ours to rename
        raise ValueError("a bug")


def test_a_new_run_directory_is_its_owners_alone_and_an_existing_one_keeps_its_mode(tmp_path):
    import stat

    from corerl.run.directory import check_writable

    check_writable(tmp_path / "runs" / "new")
    assert stat.S_IMODE((tmp_path / "runs" / "new").stat().st_mode) == 0o700
    shared = tmp_path / "runs" / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    check_writable(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o750


def test_the_local_ray_runtime_s_session_folder_is_removed_when_the_process_ends(tmp_path):
    script = ("import os, ray\n"
              "from corerl.distributed.worker_group import ensure_ray\n"
              "ensure_ray(None)\n"
              "context = ray.get_runtime_context()\n"
              "print(os.path.join(context.get_temp_dir(), context.get_session_name()))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(shared_ray=False),
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc
    session = proc.stdout.strip().splitlines()[-1]
    assert session.startswith("/") and "session_" in session, proc
    assert not os.path.exists(session), f"{session} was left behind"


@pytest.mark.parametrize("override, key, says", [
    ("data.reward=builtins:exec", "data.reward", "builtins:exec runs commands or code (it comes from builtins)"),
    ("data.reward=os:system", "data.reward", "os:system runs commands or code"),
    ("data.reward=subprocess:run", "data.reward", "subprocess:run runs commands or code"),
    ("policy.dtensor_cfg.custom_parallel_plan=os:system", "policy.dtensor_cfg.custom_parallel_plan",
     "os:system runs commands or code (it comes from os); it is not a tensor-parallel plan"),
    ("policy.generation.vllm_cfg.engine_args={trust_remote_code: true}",
     "policy.generation.vllm_cfg.engine_args.trust_remote_code", "corerl never runs Python code shipped inside"),
])
def test_a_recipe_cannot_name_code_running_functions_or_turn_on_remote_code(capsys, override, key, says):
    from corerl.cli import main

    assert main(["validate", str(REPO / "examples" / "configs" / "demo.yaml"), override]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"corerl: error: {key}: ") and says in line, line


def test_a_reward_re_exported_from_a_code_running_module_is_refused_too(tmp_path, monkeypatch):
    from corerl.errors import ConfigError
    from corerl.tasks.rewards import import_reward

    (tmp_path / "innocent.py").write_text("from builtins import exec as score\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="innocent:score runs commands or code \\(it comes from builtins\\)"):
        import_reward("innocent:score")


def test_an_engines_own_globals_pass_only_where_its_registration_states_them(tmp_path):
    """DeepSpeed's optimizer-state files name its loss scaler; the core's plain list does not hold
    it: the deepspeed registration states it (``checkpoint_globals``), so it passes on a run whose
    backend is deepspeed and is refused on any other."""
    import attrs

    from corerl.checkpoint_safety import engines_checkpoint_globals
    from corerl.plugin_manager import PluginHost

    # pickle the global by name without importing DeepSpeed (protocol 2: a GLOBAL opcode)
    data = b"\x80\x02cdeepspeed.runtime.fp16.loss_scaler\nLossScaler\nq\x00)\x81q\x01."
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "optim_states.pt").write_bytes(data)
    host = PluginHost()
    deepspeed, dtensor = (host.training_backends.get(name) for name in ("deepspeed", "dtensor"))

    @attrs.frozen
    class Choice:  # what selection chose: only the registration is read
        registration: object

    @attrs.frozen
    class Chosen:
        training_backend: Choice
        critic_backend: Choice | None = None

    assert "deepspeed.runtime.fp16.loss_scaler.LossScaler" in engines_checkpoint_globals(Chosen(Choice(deepspeed)))
    verify_folder(tmp_path / "ckpt", engines_checkpoint_globals(Chosen(Choice(deepspeed))))
    with pytest.raises(CheckpointRefused, match="names deepspeed.runtime.fp16.loss_scaler.LossScaler"):
        verify_folder(tmp_path / "ckpt", engines_checkpoint_globals(Chosen(Choice(dtensor))))
    with pytest.raises(CheckpointRefused):  # the critic's backend counts too, and only what it states
        verify_folder(tmp_path / "ckpt", engines_checkpoint_globals(Chosen(Choice(dtensor), Choice(dtensor))))
