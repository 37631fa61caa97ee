"""Environments: what answers the model's turns of a multi-turn episode (a game, a sandbox, a
verifier, tools), the tool calls they execute, and the rollout stage that plays episodes.

- :mod:`~corerl.environments.contract`: the environment's interface (``step(episode) -> Turn``);
- :mod:`~corerl.environments.tools`: tool calls, the ``hermes`` parser, executing a call;
- :mod:`~corerl.environments.pool`: where steps run (in-process, or Ray actors), with timeouts;
- :mod:`~corerl.environments.encoding`: observations as tokens after the model's own;
- :mod:`~corerl.environments.rollout`: single-turn and multi-turn rollouts for GRPO and PPO;
- :mod:`~corerl.environments.tool_env`, :mod:`~corerl.environments.math_env`: the built-in
  ``tools`` and ``math`` environments;
- :mod:`~corerl.environments.endpoint`: an OpenAI-compatible endpoint, so that any agent harness
  is an environment.
"""
