"""The rollout stage of the sampling algorithms (GRPO, PPO): prompts in, scored samples out.

:class:`SingleTurnRollout` is one completion per sample, scored by the task's reward.
:class:`MultiTurnRollout` plays episodes against an environment, none waiting for another:
each episode's turn goes to the environment as soon as it is generated, and back to generation
as soon as its own step returns, with the other episodes ready by then (one ``generate`` call
per round; answers that arrive close together share a round). The observation's tokens are
appended after the model's own tokens, which are never decoded and re-encoded: the ids and
logprobs trained on are exactly those sampled (token in, token out). Each later turn of an
episode samples from its own seed (:func:`episode_seed`, the generation contract's
``request_seeds``), so which episodes share a round does not change what they sample. An
episode ends when the environment says done, at ``max_turns``, when ``max_seq_length`` tokens
leave no room for another turn, or on an environment fault (zero reward, counted). The first turn is the single-turn call itself (``n`` samples per prompt), so a
one-turn environment reproduces the single-turn path sample for sample.

An observation whose encoding lost text (words the tokenizer does not know) is said once per
environment and counted, with the step's prompts a task found lossy, in the rollout's
``encoding/lost_text`` metric (:mod:`corerl.reporting.lost_text`).

Step-wise trajectories (``algorithm.step_wise_trajectories``, :func:`step_wise`): each turn's
context is the conversation as the chat template renders it at that turn (the prompt's tokens,
then the model's earlier turns as decoded text and the observations' messages, rendered anew:
:meth:`~corerl.environments.encoding.ObservationEncoder.conversation_ids`), and each turn becomes
a row of its own: that context as the prompt, the turn's sampled tokens as the completion. An
episode is then a :class:`StepWiseSample`: its last row, holding every row in ``steps``. A
template that does not render a conversation as an extension of its start (Qwen3 drops earlier
turns' ``<think>`` blocks) is played as it renders. Observations given as text, or without a chat
template, are appended after the model's tokens as in the one-sequence form (from then on the
episode's contexts grow by appending).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import attrs

from corerl.environments.contract import STOP_REASONS, EpisodeView
from corerl.errors import ConfigError, RunError
from corerl.generation.contract import Images, Sample, SamplingSettings, images_of, with_images
from corerl.progress_markers import mark
from corerl.reporting.lost_text import METRIC as LOST_TEXT
from corerl.reporting.lost_text import check_observation, prompts_lost


@attrs.frozen
class Rollout:
    """A step's samples (one group of ``n`` per prompt), their rewards (same shape) and the
    rollout's own metrics."""

    groups: list[list[Sample]]
    rewards: list[list[float]]
    metrics: dict[str, float] = attrs.field(factory=dict)
    #: the rewards' named parts (``Turn.reward_components``), per sample like ``rewards``; None where
    #: the environment gives none
    components: list[list[dict[str, float]]] | None = None


class SingleTurnRollout:
    """One completion per sample, scored by ``reward_fn(sample, example)`` (the task's reward).
    Given the run's ``tokenizer``, its metrics count the step's prompts that lost text in
    encoding (``encoding/lost_text``, :mod:`corerl.reporting.lost_text`)."""

    def __init__(self, generation: Any, reward_fn: Callable[[Sample, Any], float], tokenizer: Any = None) -> None:
        self.generation, self.reward_fn, self.tokenizer = generation, reward_fn, tokenizer

    def run(self, prompts: Sequence[Sequence[int]], items: Sequence[Any], sampling: SamplingSettings,
            n: int, max_seq_length: int) -> Rollout:
        """``n`` samples per prompt, completions cut to ``max_seq_length`` tokens in all."""
        sampling = sampling.within(max_seq_length, prompts)
        groups = with_prompt_images(self.generation.generate(as_prompts(prompts), sampling, n=n), prompts)
        rewards = [[float(self.reward_fn(s, item)) for s in group] for group, item in zip(groups, items, strict=True)]
        if self.tokenizer is None:
            return Rollout(groups, rewards)
        return Rollout(groups, rewards, {LOST_TEXT: float(prompts_lost(self.tokenizer, prompts))})


@attrs.frozen(kw_only=True)
class StepWiseSample(Sample):
    """An episode of step-wise trajectories (``algorithm.step_wise_trajectories``): its last turn's
    row, with every turn's row in ``steps`` (turn order). A row is a :class:`Sample` whose prompt is
    the conversation the model was given at that turn and whose completion is that turn's tokens
    (all the model's). Training expands the episode into its rows
    (:func:`corerl.algorithms.batches.step_rows`); an all-zero ``completion_mask`` on the episode
    (overlong filtering) leaves every row out."""

    steps: tuple[Sample, ...] = ()


@attrs.define
class PlayedEpisode:
    """One episode while it is played (``step_wise``: as rows of its turns, :class:`StepWiseSample`)."""

    prompt: list[int]
    row: Any
    where: str
    ids: list[int] = attrs.field(factory=list)
    mask: list[int] = attrs.field(factory=list)
    logprobs: list[float] = attrs.field(factory=list)
    versions: list[int] = attrs.field(factory=list)
    responses: list[str] = attrs.field(factory=list)
    reward: float = 0.0
    components: dict[str, float] | None = None  # the reward's named parts, summed over the turns
    state: Any = None
    finish: str = "stop"
    stop: str | None = None
    cause: str = ""
    tool_calls: int = 0
    tool_failures: int = 0
    lost_text: int = 0  # observations whose encoding lost text
    images: Images | None = None  # the prompt's images, then each observation's, in token order
    routes: Any = None  # the last turn's routed experts (r3): its context is every token before it
    step_wise: bool = False
    turn_prompt: list[int] | None = None  # step-wise: the context of the turn to come (None: the prompt)
    history: list[dict[str, Any]] = attrs.field(factory=list)  # step-wise: the messages after the prompt
    appending: bool = False  # step-wise: a text observation came, so later contexts grow by appending
    rows: list[Sample] = attrs.field(factory=list)  # step-wise: one per turn

    @property
    def length(self) -> int:
        """The tokens of the context the next turn continues (the turn in progress included)."""
        if self.step_wise:
            return len(self.current)
        return len(self.prompt) + len(self.ids)

    @property
    def current(self) -> list[int]:
        """Step-wise: the context of the turn to come, or of the last turn played once it is in."""
        return self.prompt if self.turn_prompt is None else self.turn_prompt

    def add_turn(self, sample: Sample, text: str) -> None:
        if self.step_wise:
            self.add_step(sample, text)
            return
        self.ids += sample.completion_ids
        self.mask += [1] * len(sample.completion_ids)
        self.logprobs += sample.logprobs
        self.versions += sample.versions or [0] * len(sample.completion_ids)
        self.routes = sample.routed_experts
        self.responses.append(text)
        self.finish = sample.finish_reason

    def add_step(self, sample: Sample, text: str) -> None:
        """Step-wise: the turn as a row of its own (the context it was sampled from, its tokens)."""
        versions = sample.versions or (0,) * len(sample.completion_ids)
        self.rows.append(Sample(prompt_ids=tuple(self.current), completion_ids=tuple(sample.completion_ids),
                                logprobs=tuple(sample.logprobs), finish_reason=sample.finish_reason,
                                versions=tuple(versions) if any(versions) else None, images=self.images,
                                routed_experts=sample.routed_experts))
        self.ids += sample.completion_ids  # the model's tokens, for the metrics
        self.versions += list(versions)
        self.responses.append(text)
        self.history.append({"role": "assistant", "content": text})
        self.finish = sample.finish_reason

    def add_observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)  # not the model's: masked out

    def sample(self) -> Sample:
        if self.step_wise:
            last = self.rows[-1]
            return StepWiseSample(prompt_ids=last.prompt_ids, completion_ids=last.completion_ids,
                                  logprobs=last.logprobs, finish_reason="stop" if self.finish == "stop" else "length",
                                  versions=last.versions, images=last.images, steps=tuple(self.rows),
                                  routed_experts=last.routed_experts)
        return Sample(prompt_ids=tuple(self.prompt), completion_ids=tuple(self.ids), logprobs=tuple(self.logprobs),
                      finish_reason="stop" if self.finish == "stop" else "length", completion_mask=tuple(self.mask),
                      versions=tuple(self.versions) if self.stamped else None, images=self.images,
                      routed_experts=self.routes)

    @property
    def context(self) -> list[int]:
        """What the model reads for its next turn: the prompt and everything after it, with every
        image so far."""
        if self.step_wise:
            return with_images(list(self.current), self.images)
        return with_images(self.prompt + self.ids, self.images)

    @property
    def stamped(self) -> bool:
        return bool(self.versions) and any(v for v in self.versions)


def as_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """``prompts`` as lists of ids for a generation backend, each keeping the images it carries."""
    return [with_images(p, images_of(p)) for p in prompts]


def with_prompt_images(groups: list[list[Sample]], prompts: Sequence[Sequence[int]]) -> list[list[Sample]]:
    """``groups`` with each sample holding its prompt's images (a backend may leave them out)."""
    return [[s if s.images is not None or images_of(p) is None else attrs.evolve(s, images=images_of(p))
             for s in group] for group, p in zip(groups, prompts, strict=True)]


def episode_seed(seed: int | None, turn: int, episode: int) -> int | None:
    """The sampling seed of turn ``turn`` (2 or later) of a step's episode number ``episode``
    (turn 1 is the single-turn call, seeded by the step's own seed)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:turn:{turn}:episode:{episode}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x3FFF_FFFF


def row_label(item: Any) -> str:
    """Where a row came from, for errors (the dataset task's origin, else the row itself, shortened)."""
    if isinstance(item, dict) and "_corerl_origin" in item:
        return str(item["_corerl_origin"])
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def clean_row(item: Any) -> Any:
    """The row as an environment sees it (corerl's own bookkeeping keys left out)."""
    if isinstance(item, dict):
        return {k: v for k, v in item.items() if not str(k).startswith("_corerl_")}
    return item


#: after an episode's step returns, the answers that follow within this share of that step's time
#: (and at least GATHER_MIN_S) join its generation round: steps of about the same length share a
#: call, a step many times slower than the rest is not waited for
GATHER_SHARE = 0.25
GATHER_MIN_S = 0.005


class MultiTurnRollout:
    """Episodes against an environment ``pool`` (:mod:`corerl.environments.pool`), named
    ``env_name`` in errors; ``encoder`` turns observations into tokens, ``tokenizer`` decodes
    the model's turns for the environment. ``max_failure_share``: the run stops when more of a
    step's episodes than this share end by an environment fault. ``step_wise``: each turn is
    played from the conversation rendered anew and kept as a row of its own (:class:`StepWiseSample`)."""

    def __init__(self, generation: Any, pool: Any, encoder: Any, tokenizer: Any, env_name: str,
                 max_turns: int | None = None, max_failure_share: float = 1.0, step_wise: bool = False) -> None:
        self.generation, self.pool, self.encoder, self.tokenizer = generation, pool, encoder, tokenizer
        self.env_name, self.max_turns, self.max_failure_share = env_name, max_turns, max_failure_share
        self.step_wise = step_wise
        self.calls = 0  # rollouts played by this object (the progress markers name them)
        self.answered: dict[Future, float] = {}  # when each pending step's answer came

    def run(self, prompts: Sequence[Sequence[int]], items: Sequence[Any], sampling: SamplingSettings,
            n: int, max_seq_length: int) -> Rollout:
        """``n`` episodes per prompt, each at most ``max_seq_length`` tokens long."""
        episodes = [[PlayedEpisode(list(p), clean_row(item), row_label(item), images=images_of(p),
                                   step_wise=self.step_wise) for _ in range(n)]
                    for p, item in zip(prompts, items, strict=True)]
        flat = [e for group in episodes for e in group]
        seconds_before = self.pool.seconds
        self.calls += 1
        # turn 1: the single-turn call itself (n per prompt, one seed for the step)
        first = self.generation.generate(as_prompts(prompts), sampling.within(max_seq_length, prompts), n=n)
        pending: dict[Future, tuple[int, PlayedEpisode, float]] = {}
        for index, (episode, sample) in enumerate(zip(flat, [s for group in first for s in group], strict=True)):
            self._hand_over(pending, index, episode, sample)
        mark(f"rollout:{self.calls}:turn:1")
        rounds = 1
        while pending:
            ready = self._collect(pending, max_seq_length)
            if not ready:
                continue
            rounds += 1
            room = max(max_seq_length - e.length for _, e in ready)
            settings = attrs.evolve(
                sampling, max_new_tokens=max(1, min(sampling.max_new_tokens, room)),
                request_seeds=None if sampling.seed is None else tuple(
                    episode_seed(sampling.seed, len(e.responses) + 1, index) for index, e in ready))
            generated = self.generation.generate([e.context for _, e in ready], settings, n=1)
            for (index, episode), group in zip(ready, generated, strict=True):
                self._hand_over(pending, index, episode, _cut(group[0], max_seq_length - episode.length))
            mark(f"rollout:{self.calls}:turn:{rounds}")
        check_failures(flat, self.env_name, self.max_failure_share)
        groups = [[e.sample() for e in group] for group in episodes]
        rewards = [[e.reward for e in group] for group in episodes]
        metrics = episode_metrics(flat, self.pool.seconds - seconds_before)
        metrics["time/generation_rounds"] = float(rounds)
        metrics[LOST_TEXT] += prompts_lost(self.tokenizer, prompts)
        return Rollout(groups, rewards, metrics, reward_components(episodes))

    def _hand_over(self, pending: dict[Future, tuple[int, PlayedEpisode, float]], index: int,
                   episode: PlayedEpisode, sample: Sample) -> None:
        """The episode's newest turn, sent to the environment at once."""
        episode.add_turn(sample, self.tokenizer.decode(list(sample.completion_ids), skip_special_tokens=True))
        view = EpisodeView(row=episode.row, turn=len(episode.responses), responses=tuple(episode.responses),
                           state=episode.state)
        future = self.pool.submit(view)
        pending[future] = (index, episode, time.perf_counter())
        future.add_done_callback(self._answered_at)

    def _answered_at(self, future: Future) -> None:
        self.answered[future] = time.perf_counter()

    def _collect(self, pending: dict[Future, tuple[int, PlayedEpisode, float]],
                 max_seq_length: int) -> list[tuple[int, PlayedEpisode]]:
        """Waits for the first answer among the pending steps, then for the answers that follow it
        closely (within a quarter of that step's own time): the episodes that go on, with their
        numbers, in episode order."""
        ready: list[tuple[int, PlayedEpisode]] = []
        timeout: float | None = None  # the first answer: however long it takes
        while pending:
            done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:
                break
            for future in done:
                index, episode, submitted = pending.pop(future)
                answered = self.answered.pop(future, time.perf_counter())
                if self._settle(episode, future.result(), max_seq_length):
                    ready.append((index, episode))
                timeout = max(GATHER_MIN_S, (answered - submitted) * GATHER_SHARE)
        return sorted(ready, key=lambda pair: pair[0])

    def _settle(self, episode: PlayedEpisode, answer: Any, max_seq_length: int) -> bool:
        """The environment's answer applied to its episode; whether the episode goes on."""
        turn = len(episode.responses)
        if answer.turn is None:
            episode.stop, episode.cause, episode.reward = answer.fault, answer.cause, 0.0
            return False
        result = answer.turn
        given = getattr(result, "reward_components", None)  # a turn object of a plugin's own may lack it
        try:
            episode.reward += float(result.reward)
            if given is not None:
                parts = episode.components if episode.components is not None else {}
                for name, value in given.items():
                    parts[str(name)] = parts.get(str(name), 0.0) + float(value)
                episode.components = parts
        except (TypeError, ValueError, AttributeError):
            episode.stop, episode.cause, episode.reward = "env_malformed", (
                f"reward {result.reward!r} is not a number" if given is None else
                f"reward {result.reward!r} or reward_components {given!r} is not a number (a mapping of names to "
                "numbers)"), 0.0
            return False
        episode.state = result.state
        episode.tool_calls += result.tool_calls
        episode.tool_failures += result.tool_failures
        if result.done:
            episode.stop = "done"
        elif self.max_turns is not None and turn >= self.max_turns:
            episode.stop = "max_turns"
        elif result.observation is None:
            episode.stop, episode.cause, episode.reward = "env_malformed", "not done, but no observation", 0.0
        elif episode.step_wise and not (episode.appending or isinstance(result.observation, str)
                                        or not self.encoder.has_template):
            return self._render_turn(episode, result.observation, max_seq_length)
        else:
            try:
                observation, text, shown = self.encoder.encode_with_images(
                    result.observation, episode.finish == "stop", f"{episode.where}, turn {turn}")
            except ValueError as error:  # image parts it cannot show: the environment's answer is at fault
                episode.stop, episode.cause, episode.reward = "env_malformed", str(error), 0.0
                return False
            if check_observation(self.tokenizer, f"environment {self.env_name!r}", text, observation):
                episode.lost_text += 1
            # step-wise: the next context is this turn's, its tokens and the observation appended
            before = [*episode.current, *episode.rows[-1].completion_ids] if episode.step_wise else None
            if (episode.length if before is None else len(before)) + len(observation) >= max_seq_length:
                episode.stop = "max_tokens"  # no room for the observation and one more token
            else:
                if before is None:
                    episode.add_observation(observation)
                else:
                    episode.turn_prompt, episode.appending = before + observation, True
                episode.images = shown if episode.images is None else episode.images + shown
                return True
        return False

    def _render_turn(self, episode: PlayedEpisode, observation: Sequence[Any], max_seq_length: int) -> bool:
        """Step-wise: the next turn's context, the whole conversation rendered anew with the
        observation's messages; whether the episode goes on."""
        messages = [dict(m) for m in observation]
        if any(isinstance(m.get("content"), list) for m in messages):
            episode.stop, episode.reward = "env_malformed", 0.0
            episode.cause = "step-wise trajectories render observations as text, and this one has content parts"
            return False
        history = [*episode.history, *messages]
        try:
            context, text = self.encoder.conversation_ids(episode.prompt, history)
        except ValueError as error:
            episode.stop, episode.cause, episode.reward = "env_malformed", str(error), 0.0
            return False
        if check_observation(self.tokenizer, f"environment {self.env_name!r}", text, self.encoder.encode_text(text)):
            episode.lost_text += 1
        if len(context) >= max_seq_length:
            episode.stop = "max_tokens"  # no room for the conversation and one more token
            return False
        episode.history, episode.turn_prompt = history, context
        return True


def step_wise(rollout: Any) -> Any:
    """``rollout`` playing step-wise trajectories (``algorithm.step_wise_trajectories``): a
    :class:`MultiTurnRollout` turned to it; a single-turn rollout (or a reward model's rescoring of
    one) as it is, an episode of one turn being its one row; any other refused in one line. The
    rollout is the run's one: training, the asynchronous producer and the held-out evaluation all
    play step-wise (each turn sees the conversation as the template renders it; an evaluation's
    reward is the episode's, as before)."""
    if isinstance(rollout, MultiTurnRollout):
        rollout.step_wise = True
        return rollout
    # a single-turn rollout, or one rescoring its samples (a reward model's, .inner)
    if isinstance(rollout, SingleTurnRollout) or isinstance(getattr(rollout, "inner", None), SingleTurnRollout):
        return rollout
    raise ConfigError(f"step-wise trajectories are built into corerl's environment rollout (an environment that "
                      f"answers each turn), not into {type(rollout).__name__}",
                      key="algorithm.step_wise_trajectories",
                      hint="set it to false (an agent harness's episodes train as one sequence each)")


def _cut(sample: Sample, room: int) -> Sample:
    """``sample`` cut to ``room`` completion tokens (it ends there, by length)."""
    if len(sample.completion_ids) <= room:
        return sample
    versions = sample.versions[:room] if sample.versions is not None else None
    return attrs.evolve(sample, completion_ids=sample.completion_ids[:room], logprobs=sample.logprobs[:room],
                        finish_reason="length", versions=versions)


FAULTS = ("env_error", "env_timeout", "env_malformed")


def reward_components(episodes: Sequence[Sequence[PlayedEpisode]]) -> list[list[dict[str, float]]] | None:
    """Each episode's reward parts, every part named by any episode of the step (0 where an
    episode lacks it, and for an episode a fault ended, whose reward is 0 too); None where no
    episode has any."""
    names = sorted({name for group in episodes for e in group for name in (e.components or {})})
    if not names:
        return None
    return [[{name: 0.0 if e.stop in FAULTS else (e.components or {}).get(name, 0.0) for name in names}
             for e in group] for group in episodes]


def check_failures(episodes: Sequence[PlayedEpisode], env_name: str, max_failure_share: float) -> None:
    """Stop the run, in one line naming the environment, the first failed row and its cause,
    when more than ``max_failure_share`` of a step's episodes ended by a fault."""
    failed = [e for e in episodes if e.stop in FAULTS]
    if failed and len(failed) / len(episodes) > max_failure_share:
        first = failed[0]
        raise RunError(f"environment {env_name!r} failed {len(failed)} of {len(episodes)} episodes this step "
                       f"(more than env.{env_name}.max_failure_share={max_failure_share:g}); first: "
                       f"{first.stop} on {first.where}: {first.cause}", key=f"env.{env_name}",
                       hint="fix the environment (CORERL_DEBUG=1 logs each failure), or raise max_failure_share")


def episode_metrics(episodes: Sequence[PlayedEpisode], seconds: float) -> dict[str, float]:
    """A step's environment metrics: turns, tool calls and failures, faults, seconds spent in the
    environment, tokens per episode, the share of episodes ended by each reason and the
    observations that lost text in encoding (``encoding/lost_text``)."""
    count = len(episodes)
    stops = Counter(e.stop for e in episodes)
    metrics = {f"env/stop/{reason}": stops.get(reason, 0) / count for reason in STOP_REASONS}
    metrics.update({
        "env/turns": sum(len(e.responses) for e in episodes) / count,
        "env/tool_calls": float(sum(e.tool_calls for e in episodes)),
        "env/tool_failures": float(sum(e.tool_failures for e in episodes)),
        "env/tool_calls_per_episode": sum(e.tool_calls for e in episodes) / count,
        "env/tool_failures_per_episode": sum(e.tool_failures for e in episodes) / count,
        "env/episodes": float(count),
        "env/failures": float(sum(stops.get(r, 0) for r in FAULTS)),
        "env/timeouts": float(stops.get("env_timeout", 0)),
        "time/environment": seconds,
        "env/episode_tokens": sum(len(e.ids) for e in episodes) / count,
        LOST_TEXT: float(sum(e.lost_text for e in episodes)),
    })
    return metrics
