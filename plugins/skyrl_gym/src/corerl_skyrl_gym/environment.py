"""The ``skyrl_gym`` environment: a skyrl-gym environment per episode, answering corerl's turns.

skyrl-gym's contract (0.4.0): ``skyrl_gym.make(env_class, env_config=..., extras=...)`` builds one
environment for one trajectory, ``init(prompt)`` returns the conversation the model starts from,
``step(action)`` answers each model turn with ``{"observations": [chat messages], "reward", "done",
"metadata"}`` and ``close()`` ends it. corerl's (:class:`corerl.sdk.EpisodeView` in,
:class:`corerl.sdk.Turn` out) maps onto it turn for turn:

- the environment is made on an episode's first turn from its dataset row, as SkyRL's generator
  makes it: ``extras`` is every column of the row but the prompt and ``env_class`` (so
  ``reward_spec``, ``extra_info`` and any other column), plus ``max_turns`` when
  ``env.skyrl_gym.max_turns`` is set; ``env_config`` is ``env.skyrl_gym.env_config`` over
  skyrl-gym's own defaults for the class; the class is the row's ``env_class`` column, else
  ``env.skyrl_gym.env_class``;
- ``init`` gets the row's prompt messages; corerl has already rendered the prompt from the row, so
  an environment whose ``init`` changes the conversation is refused (a one-line episode error);
- skyrl-gym's ``lcb`` runs the model's code against the row's tests: unless
  ``env.skyrl_gym.allow_unsandboxed_code``, its step is swapped for one that runs them in corerl's
  sandbox (:mod:`corerl_skyrl_gym.sandboxed`), with skyrl-gym's own grading functions;
- each ``step`` answer is a :class:`Turn`: its observations as chat messages (rendered with the
  chat template after the model's turn), its reward (corerl adds an episode's turns up), its done
  (and ``close()`` then). With ``env.skyrl_gym.conversation_format`` false (SkyRL's
  ``generator.use_conversation_multi_turn=false``) the observations are text instead: the
  messages' contents joined as they are, with no role or template markers, which corerl's rollout
  tokenizes on its own and appends after the model's tokens, so the episode is one assistant
  message that the environment's text interrupts (its tokens masked out of the loss), as SkyRL
  lays it out.

What an episode keeps between turns (``Turn.state``) is its environment object. skyrl-gym's
environments with tools hold handles that do not pickle, so the state pickles as the number of
turns taken only: where it crosses a process (``env.skyrl_gym.num_workers`` > 0) the next step
makes the environment again from the row and replays the episode's earlier turns on it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from corerl.sdk import EnvironmentContext, EpisodeView, Turn
from corerl_skyrl_gym.sandboxed import SANDBOXED, LCBScorer, SandboxedLCB, sandbox_runner

#: the row column naming an episode's environment class (SkyRL's data.env_class_key default)
ENV_CLASS_COLUMN = "env_class"
#: skyrl-gym's config dataclass of each environment class that has one (their defaults are SkyRL's)
CONFIG_CLASSES = {"text2sql": ("skyrl_gym.envs.sql.env", "Text2SQLEnvConfig"),
                  "search": ("skyrl_gym.envs.search.env", "SearchEnvConfig")}


def plain(value: Any) -> Any:
    """``value`` as plain Python: mappings as dicts, sequences as lists, numpy values as Python's
    (a Parquet row's nested columns may arrive as arrays)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if not isinstance(value, (str, bytes)) and hasattr(value, "tolist"):
        return plain(value.tolist())
    return value


def env_class_of(row: Any, default: str) -> str:
    """The environment class of ``row``: its ``env_class`` column when set, else ``default``."""
    named = row.get(ENV_CLASS_COLUMN) if isinstance(row, Mapping) else None
    return named if isinstance(named, str) and named.strip() else default


def register_extra(entries: Mapping[str, str]) -> None:
    """Register ``env.skyrl_gym.register``'s environments with skyrl-gym (those not registered yet)."""
    import skyrl_gym

    for env_id, entry_point in entries.items():
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=entry_point)


def env_config_for(env_class: str, overrides: Mapping[str, Any]) -> Any:
    """What the class's environment gets as ``env_config``: skyrl-gym's defaults for it (if it has a
    config dataclass) with ``overrides`` over them, as an OmegaConf mapping (the environments read
    it by attribute, as SkyRL gives it)."""
    import importlib

    from omegaconf import OmegaConf

    defaults: dict[str, Any] = {}
    if env_class in CONFIG_CLASSES:
        module, name = CONFIG_CLASSES[env_class]
        defaults = dataclasses.asdict(getattr(importlib.import_module(module), name)())
    return OmegaConf.create({**defaults, **plain(dict(overrides))})


class Live:
    """``Turn.state`` of an episode: its skyrl-gym environment in this process and the turns it has
    taken. Pickled, it keeps the turns only (a tool's handles do not pickle): the environment is
    then made again and the earlier turns replayed."""

    def __init__(self, env: Any, turns: int) -> None:
        self.env, self.turns = env, turns

    def take(self) -> Any:
        """The environment, moved out (a stale copy of the state rebuilds instead of sharing it)."""
        env, self.env = self.env, None
        return env

    def __getstate__(self) -> dict[str, Any]:
        return {"turns": self.turns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.env, self.turns = None, state["turns"]

    def __repr__(self) -> str:
        return f"Live(turns={self.turns}, env={type(self.env).__name__ if self.env is not None else None})"


class SkyRLGymEnvironment:
    """Answers each model turn with the episode's skyrl-gym environment (see the module's docstring)."""

    def __init__(self, context: EnvironmentContext) -> None:
        settings = context.settings
        self.default_class, self.max_turns = settings.env_class, settings.max_turns
        self.conversation_format = settings.conversation_format
        self.overrides = dict(settings.env_config)
        self.prompt_key = getattr(context.data, "prompt_key", None) or "prompt"
        #: lcb's tests run in corerl's sandbox unless allow_unsandboxed_code (the runner made on first use)
        self.sandboxed = not settings.allow_unsandboxed_code
        self.isolation, self.sandbox_memory_mb = settings.isolation, settings.sandbox_memory_mb
        self.scorer: Any = None
        register_extra(settings.register)

    def make(self, row: Any) -> Any:
        """A new environment for ``row``, initialised with its prompt."""
        import skyrl_gym

        if not isinstance(row, Mapping):
            raise ValueError(f"the row is a {type(row).__name__}, not a mapping of columns: skyrl-gym environments "
                             "read the row's reward_spec and other columns (use a dataset of SkyRL's layout)")
        env_class = env_class_of(row, self.default_class)
        extras = {k: plain(v) for k, v in row.items() if k not in (self.prompt_key, ENV_CLASS_COLUMN)}
        if self.max_turns is not None:
            extras["max_turns"] = self.max_turns
        try:
            env = skyrl_gym.make(env_class, env_config=env_config_for(env_class, self.overrides), extras=extras)
        except AssertionError as error:  # skyrl-gym's environments check the row with assert
            raise ValueError(f"skyrl-gym environment {env_class!r} refuses the row: {error or 'an assertion failed'} "
                             f"(columns: {', '.join(sorted(extras))})") from None
        env = self.contained(env_class, env)
        prompt = self.prompt_of(row)
        started, _ = env.init(copy.deepcopy(prompt))
        if plain(started) != prompt:
            raise ValueError(f"skyrl-gym environment {env_class!r} changes the conversation in init() ({len(prompt)} "
                             f"message(s) in, {len(started)} out); corerl renders the prompt from the row's "
                             f"{self.prompt_key!r} column, so write what init() adds into the data")
        return env

    def contained(self, env_class: str, env: Any) -> Any:
        """``env``, its code-running step swapped for one that runs in corerl's sandbox where it is
        skyrl-gym's ``lcb`` (and ``allow_unsandboxed_code`` is unset): :mod:`corerl_skyrl_gym.sandboxed`."""
        if not self.sandboxed or env_class not in SANDBOXED:
            return env
        from skyrl_gym.envs.lcb.env import LCBEnv

        if not isinstance(env, LCBEnv):  # the registry's lcb is skyrl-gym's (checks refuse another)
            raise ValueError(f"skyrl-gym environment {env_class!r} is {type(env).__name__}, not skyrl-gym's LCBEnv, "
                             "whose tests corerl knows how to run in its sandbox")
        if self.scorer is None:
            self.scorer = LCBScorer(sandbox_runner(self.isolation), self.sandbox_memory_mb)
        return SandboxedLCB(env, self.scorer)

    def prompt_of(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The row's prompt as chat messages (text as one user message; none: no messages)."""
        prompt = row.get(self.prompt_key)
        if prompt is None:
            return []
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return plain(prompt)

    def step(self, episode: EpisodeView) -> Turn:
        live = episode.state if isinstance(episode.state, Live) else None
        env = live.take() if live is not None else None
        if env is None:  # the first turn, or a state that crossed a process: make it, replay the earlier turns
            env = self.make(episode.row)
            for number, earlier in enumerate(episode.responses[:-1], start=1):
                if self.answer(env, earlier)["done"]:
                    raise ValueError(f"replaying turn {number} of the episode ended it: the skyrl-gym environment "
                                     "does not give the same answers twice (keep env.skyrl_gym.num_workers=0)")
        answer = self.answer(env, episode.response)
        if answer["done"]:
            env.close()
            return Turn(reward=answer["reward"], done=True, state=Live(None, episode.turn))
        observation = answer["observations"] if self.conversation_format else self.as_text(env, answer["observations"])
        return Turn(observation=observation, reward=answer["reward"], state=Live(env, episode.turn))

    @staticmethod
    def as_text(env: Any, messages: list[dict[str, Any]]) -> str:
        """The observation messages as the text that continues the model's response: their contents
        joined as they are (what SkyRL appends without the conversation format)."""
        contents = [m.get("content", "") if isinstance(m, Mapping) else m for m in messages]
        for content in contents:
            if not isinstance(content, str):
                raise ValueError(f"{env} gave an observation whose content is {type(content).__name__}, not text; "
                                 "env.skyrl_gym.conversation_format=false appends text only (set it to true to "
                                 "pass chat messages)")
        return "".join(contents)

    @staticmethod
    def answer(env: Any, action: str) -> dict[str, Any]:
        """``env.step(action)`` read into observations (chat messages), a reward (float) and done."""
        out = env.step(action)
        if not isinstance(out, Mapping) or "done" not in out:
            raise ValueError(f"{env} step() returned {type(out).__name__}, not skyrl-gym's step output "
                             "(observations, reward, done, metadata)")
        rewritten = out.get("postprocessed_action")
        if rewritten is not None and rewritten != action:
            raise ValueError(f"{env} rewrites the model's turn (postprocessed_action); corerl trains on the tokens "
                             "the model sampled, so it cannot replace them")
        try:
            reward = float(out.get("reward") or 0.0)
        except (TypeError, ValueError):
            raise ValueError(f"{env} gave reward {out.get('reward')!r}, not a number (per-token rewards are not "
                             "read: give one number per turn)") from None
        observations = out.get("observations") or []
        if not isinstance(observations, Sequence) or isinstance(observations, (str, bytes)):
            raise ValueError(f"{env} gave observations {observations!r}, not a list of chat messages")
        messages = [plain(m) for m in observations if m is not None]
        return {"observations": messages, "reward": reward, "done": bool(out["done"])}
