"""Ray's session folders of killed runs are removed by the next run; live ones never are."""

from __future__ import annotations

import os

import psutil

from corerl.distributed.ray_sessions import remove_stale_sessions


def _dead_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid += 1
    return pid


def test_the_session_folders_of_gone_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = tmp_path / f"session_2026-11-25_08-40-37_832221_{_dead_pid()}"
    live = tmp_path / f"session_2026-11-25_08-41-02_945299_{os.getpid()}"  # this process is running
    ours = tmp_path / f"session_2026-11-25_08-42-02_000001_{_dead_pid()}"
    other = tmp_path / "session_not_rays_naming"
    for folder in (dead, live, ours, other):
        (folder / "logs").mkdir(parents=True)
        (folder / "logs" / "raylet.out").write_text("x" * 1000)
    (tmp_path / "session_latest").symlink_to(dead)

    assert remove_stale_sessions(tmp_path, keep=ours.name) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, ours.name, other.name])
