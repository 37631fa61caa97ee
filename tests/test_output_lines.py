"""Output that is not a terminal is never wrapped: a user who pipes a run into a log file or a
script reads each message back as one line, whatever the length of the paths in it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import EXAMPLES, run_corerl


def _long_folder(base: Path, length: int) -> Path:
    """A folder under ``base`` whose absolute path is ``length`` characters long."""
    name = "a_rather_long_directory_name_for_the_runs_of_this_user_"
    path = base
    while len(str(path)) + len(name) + 1 < length:
        path = path / name
    path = path / ("x" * (length - len(str(path)) - 1))
    assert len(str(path)) == length
    path.mkdir(parents=True)
    return path


def test_a_run_in_a_long_path_prints_its_run_directory_and_what_it_wrote_on_whole_lines(tmp_path):
    work = _long_folder(tmp_path, 120)
    result = run_corerl("run", "algorithm.name=sft", "algorithm.max_steps=1", "algorithm.batch_size=8",
                        "policy.generation.backend=hf", "checkpointing.enabled=false",
                        f"run.output_dir={work}", "run.name=" + "r" * 60, cwd=work)
    assert result.code == 0, result
    run_dir = work / ("r" * 60)
    lines = result.out.splitlines()
    (shown,) = [line for line in lines if line.startswith("run directory: ")]
    assert shown == f"run directory: {run_dir}"
    (wrote,) = [line for line in lines if line.startswith("wrote ")]
    written = re.findall(r"(/\S+?)(?:,|\s|$)", wrote)
    assert str(run_dir / "metrics.jsonl") in written and str(run_dir / "final") in written, wrote
    assert all(Path(path).exists() for path in written), written
    assert "held-out reward:" in result.out and any(
        line.startswith("held-out reward:") and line.endswith("start)") for line in lines), result.out


def test_a_table_piped_to_a_file_keeps_each_row_on_one_line():
    result = run_corerl("validate", str(EXAMPLES / "demo.yaml"), "policy.megatron_cfg.enabled=true",
                        "policy.dtensor_cfg.enabled=true")
    assert result.code == 0, result
    (row,) = [line for line in result.out.splitlines() if line.startswith("│ training backend")]
    assert "megatron" in row and "highest priority (300) over 'dtensor' (100, also enabled)" in row, result.out
    (warning,) = [line for line in result.out.splitlines() if line.startswith("warning:")]
    assert warning.endswith("set policy.training_backend to choose"), warning
    assert f"{EXAMPLES / 'demo.yaml'}: valid" in result.out


def test_only_a_terminal_wraps():
    import io

    from corerl.reporting.console import make_console

    long_line = "wrote " + "/x" * 200
    piped = io.StringIO()
    make_console(file=piped).print(long_line)
    assert piped.getvalue() == long_line + "\n"
    terminal = io.StringIO()
    make_console(file=terminal, force_terminal=True, width=80).print(long_line)
    assert len(terminal.getvalue().splitlines()) > 1  # a terminal keeps rich's wrapping
