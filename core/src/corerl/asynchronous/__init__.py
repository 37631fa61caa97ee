"""Asynchronous RL: a dedicated generation group fills a rollout buffer while training runs.

- :mod:`.settings`: the ``algorithm.async`` section;
- :mod:`.buffer`: the rollout buffer, its samplers and the staleness bound;
- :mod:`.worker`: the generation worker (a Ray actor hosting any generation backend) that takes
  weights while it generates;
- :mod:`.engine`: the driver's side of it, a generation engine whose samples carry the policy
  version of every token;
- :mod:`.producer`: the thread that keeps generation running from the prompt queue;
- :mod:`.grpo`: GRPO's step over the buffer.
"""
