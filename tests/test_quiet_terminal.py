"""A quiet terminal: while a run runs, what other code writes (to descriptors 1 and 2, through
Python's logging; child processes inherit the descriptors) goes to the run's log file; corerl's console
lines and its own warnings stay on the terminal."""

from __future__ import annotations

import logging
import os

from corerl.reporting.quiet import QuietTerminal, last_log


def test_other_output_goes_to_the_log_and_corerls_lines_stay_on_the_terminal(tmp_path, capfd):
    log = tmp_path / "run.log"
    with QuietTerminal(log):
        print("corerl: a line of ours")
        logging.getLogger("corerl.somewhere").warning("a warning of ours")
        logging.getLogger("thirdparty").warning("a third-party warning")
        logging.getLogger("thirdparty").info("a third-party detail")
        # Python's warnings write to sys.stderr, descriptor 2 in a real process (pytest swaps sys.stderr;
        # the demo's test sees torch's FutureWarnings leave its terminal)
        os.write(2, b"C++ chatter on descriptor 2\n")
        os.write(1, b"a loading bar on descriptor 1\n")
        assert os.environ["CORERL_RUN_LOG"] == str(log)  # what Ray workers started now inherit
    out, err = capfd.readouterr()
    assert out == "corerl: a line of ours\n" and err == "a warning of ours\n"
    written = log.read_text()
    for line in ("a third-party warning", "a third-party detail",
                 "C++ chatter on descriptor 2", "a loading bar on descriptor 1",
                 "a warning of ours"):
        assert line in written, (line, written)
    assert last_log() == log and "CORERL_RUN_LOG" not in os.environ
    print("after the run")  # everything is back where it was
    os.write(2, b"back on the terminal\n")
    out, err = capfd.readouterr()
    assert out == "after the run\n" and err == "back on the terminal\n"


def test_verbose_keeps_everything_on_the_terminal_and_copies_logging_to_the_file(tmp_path, capfd):
    log = tmp_path / "run.log"
    with QuietTerminal(log, verbose=True):
        os.write(2, b"C++ chatter\n")
        logging.getLogger("thirdparty").warning("a third-party warning")
    out, err = capfd.readouterr()
    assert "C++ chatter" in err and "a third-party warning" in err
    assert "a third-party warning" in log.read_text()
