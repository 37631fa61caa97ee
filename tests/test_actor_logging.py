"""What a run's Ray actor logs (the asynchronous generation worker's backend, a training rank)
reaches run.log: the actor takes the run's variables (corerl.distributed.run_variables, what
GenerationWorker and RankActor do first), and its Python logging writes to the run's log at
INFO, as the driver's does, naming the process."""

from __future__ import annotations

import subprocess
import sys

ACTOR = """
import logging, os, sys
from corerl.distributed.run_variables import adopt_run_variables
adopt_run_variables({"CORERL_RUN_LOG": sys.argv[1]})
logging.getLogger("corerl_mybackend.engine").info("weights updated: version 3")
logging.getLogger("corerl.asynchronous.worker").debug("not at INFO: left out")
print("printed", flush=True)
print(os.getpid())
"""


def test_an_actors_logging_reaches_the_run_log(tmp_path):
    log = tmp_path / "run.log"
    done = subprocess.run([sys.executable, "-c", ACTOR, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    lines = text.splitlines()
    pid = lines[-1]
    assert any(f"INFO corerl_mybackend.engine (pid {pid}): weights updated: version 3" in line for line in lines), text
    assert "printed" in lines and "left out" not in text
