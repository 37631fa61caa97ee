"""``corerl plan``: per-GPU memory of every installed backend's layouts for a model on some
hardware, ranked by the backends' own preferences and by what fits.

:mod:`~corerl.planning.shape` reads a model's size from its ``config.json``;
:mod:`~corerl.planning.memory` holds the request, layout and estimate types and the shared
arithmetic; each training backend's plugin registers its memory model, and each generation
engine's plugin the engine's (``corerl_register_memory_models``; :mod:`~corerl.planning.installed`
finds them); :mod:`~corerl.planning.planner` adds the generation engine and the reference, follows
the backends' preferences and ranks; :mod:`~corerl.planning.command` is the command line.
"""
