"""The run layer (shared/design.md's layers): the run loop and everything that has a run directory.

- :mod:`corerl.run.loop`: the run loop (``corerl run``, :func:`corerl.train`);
- :mod:`corerl.run.steps`: what the loop does around each step and at each checkpoint;
- :mod:`corerl.run.context`: what one run's steps are built from (:class:`RunContext`);
- :mod:`corerl.run.directory`: the run directory, the model checkpoint and the tokenizer;
- :mod:`corerl.run.record`: the recipe a run started with, and the check that a resume keeps it;
- :mod:`corerl.run.inputs`: what a run needs from the machine, checked before it starts;
- :mod:`corerl.run.checkpoints`: the run's checkpoints, their pruning and time budget;
- :mod:`corerl.run.recovery`: in-run recovery from a dead or hung worker;
- :mod:`corerl.run.interrupt`: Ctrl-C during a run;
- :mod:`corerl.run.out_of_memory`: running out of memory, said in one line.

Evaluation during a run lives with the rest of evaluation (:mod:`corerl.evaluation`). The old
root modules (``corerl.run.loop``, ``corerl.run.context``, ...) re-export these. Nothing is
imported here: the package stays as light as its lightest module.
"""
