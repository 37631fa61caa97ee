"""A sampling run's rollout stages: one turn scored by the task's reward, or with ``data.env_name``
episodes against that environment (its pool of workers, in this process or as Ray actors, or an
agent harness over the OpenAI-compatible endpoint), and for training, with ``reward_model.kind``,
the same samples rescored by the reward model or judge. Each is built once per run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.plugin_manager import PluginHost
    from corerl.run.engines import Engines
    from corerl.run.frozen_models import FrozenModels
    from corerl.run.policy_model import PolicyModel


class Rollouts:
    """The rollout stages over ``engines``' generation engine and ``model``'s task; environment
    pools and agent harnesses are kept by ``engines`` (shut down with the run)."""

    def __init__(self, config: Config, selection: Selection, host: PluginHost, console: Any, engines: Engines,
                 model: PolicyModel, frozen: FrozenModels) -> None:
        self.config, self.selection, self.host, self.console = config, selection, host, console
        self.engines, self.model, self.frozen = engines, model, frozen
        self._rollout: Any = None
        self._training_rollout: Any = None

    def rollout(self) -> Any:
        """The rollout stage the task's reward scores (with ``data.env_name``, episodes against
        that environment), built once per run."""
        if self._rollout is None:
            self._rollout = self._build_rollout()
        return self._rollout

    def training_rollout(self) -> Any:
        """The rollout training scores: :meth:`rollout`, or with ``reward_model.kind`` the same
        samples rescored by the reward model or judge (held-out and eval keep :meth:`rollout`)."""
        if self.config.core.reward_model.kind is None:
            return self.rollout()
        if self._training_rollout is None:
            from corerl.environments.model_rewards import ModelScoredRollout

            self._training_rollout = ModelScoredRollout(self.rollout(), self.frozen.start_reward_scorer())
        return self._training_rollout

    def held_out_reward(self) -> float:
        """Mean held-out reward of greedy answers from the generation engine."""
        from corerl.evaluation.figures import greedy_reward, greedy_settings

        self.engines.offload.before_generation()
        return greedy_reward(self.rollout(), self.model.task, greedy_settings(self.config),
                             self.config.core.policy.max_seq_length)

    def _build_rollout(self) -> Any:
        from corerl.environments.rollout import MultiTurnRollout, SingleTurnRollout

        choice, generation, tokenizer = self.selection.environment, self.engines.generation, self.model.tokenizer
        if choice.registration is None:
            return SingleTurnRollout(generation, self.model.task.reward, tokenizer=tokenizer)
        settings = self.config.section(f"env.{choice.id}")
        if choice.registration.plays == "agent":
            from corerl.environments.agent import AgentRollout

            agent = choice.registration.create(self.environment_context(settings))
            return self.engines.keep(AgentRollout(generation, agent, tokenizer, choice.id, settings))
        from corerl.environments.encoding import ObservationEncoder

        pool = self.start_environment(choice.registration, settings)
        return MultiTurnRollout(generation, pool, ObservationEncoder(tokenizer, self.model.images), tokenizer, choice.id,
                                max_turns=self.config.core.algorithm.max_rollout_turns,
                                max_failure_share=settings.max_failure_share)

    def environment_context(self, settings: Any) -> Any:
        """What an environment's factory is given: its settings, the seed, the tokenizer, the tools."""
        from corerl.environments.contract import EnvironmentContext

        return EnvironmentContext(settings, self.config.core.algorithm.seed, self.model.tokenizer,
                                  tools={t.id: t for t in self.host.tools},
                                  tool_parsers={p.id: p for p in self.host.tool_parsers},
                                  reward=self.selection.reward_fn, data=self.config.core.data)

    def start_environment(self, registration: Any, settings: Any) -> Any:
        """The environment's pool of workers (:mod:`corerl.environments.pool`), shut down with the run."""
        from corerl.environments.pool import InProcessPool, RayPool

        context = self.environment_context(settings)
        if settings.num_workers:
            pool: Any = RayPool(registration, context, settings.num_workers, self.config.core.cluster.ray_address)
            self.console.print(f"environment {registration.id}: {settings.num_workers} Ray actor(s)")
        else:
            pool = InProcessPool(registration.create(context), settings.timeout_s)
        return self.engines.keep(pool)
