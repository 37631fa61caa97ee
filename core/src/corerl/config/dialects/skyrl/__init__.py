"""SkyRL's dialect: a SkyRL launch script (``run_*.sh``: shell defaults, an entry point and its
Hydra-style ``key=value`` overrides of SkyRL's defaults), or those overrides given by hand,
translated into corerl's configuration (issue 75).

- :mod:`~corerl.config.dialects.skyrl.script`: reading a launch script (its shell defaults, which
  the environment overrides as in SkyRL, its entry point and its overrides, each with its line);
- :mod:`~corerl.config.dialects.skyrl.entry_points`: which algorithm each entry point runs;
- :mod:`~corerl.config.dialects.skyrl.translate`: every key's fate (acts, inert, refused) over the
  shared sections' rules (:mod:`~corerl.config.dialects.skyrl.keys`), with each engine's section
  contributed by the plugin that registers the engine (``DialectSection(dialect="skyrl")``).
"""
