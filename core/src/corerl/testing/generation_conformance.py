"""The generation-backend conformance suite: subclass :class:`GenerationBackendConformance`.

    class TestMyEngine(GenerationBackendConformance):
        backend_id = "mine"
        plugin = corerl_mine.plugin  # optional: registered beside the installed plugins when not installed

Class attributes: ``backend_id`` (required), ``plugin`` (a plugin module or object registered, as
``<backend_id>-under-test``, beside the installed plugins where its backend is not installed already),
``overrides`` (recipe overrides, e.g. your backend's section), ``tolerance`` (of logprobs, 1e-4) and
``max_new_tokens`` (12).

The checks, on two tiny models built in code (fp32, tied embeddings; the first one's
``generation_config.json`` holds sampling defaults, :data:`CHECKPOINT_SAMPLING_DEFAULTS`, that no
backend may apply):

- ``test_greedy_matches_transformers``: greedy completions equal plain transformers ``generate()``
  token for token;
- ``test_logprobs_match_a_transformers_forward``: returned logprobs equal a transformers forward of
  the same tokens within ``tolerance``, untempered (sampled at temperature 0.7);
- ``test_samples_follow_the_stated_distribution``: the first tokens of 800 samples, drawn with a
  call seed and with request seeds, follow the distribution ``SamplingSettings`` state (temperature,
  no top-k or top-p cut) and nothing of the checkpoint's defaults (:func:`check_first_tokens_follow`);
- ``test_a_stop_id_ends_a_completion_where_it_is_sampled``: a stop id that greedy decoding
  reaches mid-completion ends the completion there (it is kept), with ``finish_reason`` "stop";
- ``test_stop_ids_end_a_completion_besides_the_end_of_sequence`` (contract 2.14): with
  ``stop_token_ids`` set, a completion still ends at the model's end of sequence;
- ``test_ignore_eos_runs_every_completion_to_max_new_tokens``: with ``ignore_eos`` nothing ends a
  completion early, the stop ids included;
- ``test_banned_words_never_appear`` (contract 2.18): with ``bad_words``, for a backend setting
  ``accepts_bad_words = True`` (skipped otherwise), the banned words' token sequences appear in no
  completion;
- ``test_outputs_follow_refitted_weights``: after ``update_weights`` with another model's weights,
  greedy outputs follow the new weights;
- ``test_an_update_may_leave_out_the_tied_copy`` (contract 2.14): an update without the tied
  ``lm_head.weight`` is taken, and greedy outputs follow it;
- ``test_n_samples_come_back_grouped_in_prompt_order``: ``n`` samples per prompt come back grouped
  per prompt and in prompt order, stop at ``max_new_tokens`` or a stop token, and say why they ended;
- ``test_the_same_prompt_twice_draws_independent_samples``: one seed a call, not one stream a prompt;
- ``test_a_prompt_with_a_request_seed_samples_the_same_whatever_shares_its_call`` (contract 2.12):
  with ``request_seeds``, a prompt's samples are the same alone and beside others;
- ``test_samples_follow_each_lora_adapter_loaded``: with ``policy.lora`` (a registration with
  ``lora=True``): after ``load_adapter``, logprobs equal a plain PEFT forward of the base with that
  adapter, and a second adapter replaces the first; a registration without it is refused with
  ``policy.lora.enabled``, in one line.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import torch

from corerl.generation.contract import SamplingSettings
from corerl.testing.contract_versions import (
    IGNORE_EOS,
    REQUEST_SEEDS,
    STOP_IDS_BESIDES_EOS,
    TIED_UPDATES,
    ContractCheck,
    stated_contract,
)

PROMPTS = [[2, 5, 9, 13], [2, 7], [2, 11, 4, 6, 8, 10, 12], [2, 3, 3]]

#: what the suite's first model's ``generation_config.json`` says besides its token ids: transformers
#: fills every ``generate()`` setting a call leaves unset from it, so a backend that passes only some
#: of ``SamplingSettings`` samples from another distribution than the one stated (and than its
#: logprobs describe). No check passes with these applied.
CHECKPOINT_SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.5, "top_k": 5, "top_p": 0.7,
                                "repetition_penalty": 1.5}

#: the distribution check's bound on false failures (a conforming backend failing it by chance)
FALSE_FAILURE_RATE = 1e-6


def reference_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int,
                     stop_id: int | tuple[int, ...]) -> list[list[int]]:
    """Greedy completions by plain transformers, one prompt at a time (no padding involved), each
    ending at the first of the stop ids (``stop_id``: one or several); the checkpoint's
    ``generation_config.json`` is set aside."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    stops = [stop_id] if isinstance(stop_id, int) else list(stop_id)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config = GenerationConfig()  # transformers' defaults, none of the checkpoint's
    out = []
    for prompt in prompts:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=stops, pad_token_id=stops[0])[0, len(prompt):].tolist()
        ends = [i for i, token in enumerate(ids) if token in stops]
        out.append(ids[: ends[0] + 1] if ends else ids)
    return out


def model_distribution(model_dir: str, prompt: list[int], temperature: float) -> torch.Tensor:
    """The next-token distribution after ``prompt`` at ``temperature`` (no top-k or top-p cut), by
    a plain transformers forward: float64 ``[vocab]``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    return torch.softmax(logits / temperature, dim=-1)


def frequency_outliers(counts: torch.Tensor, expected: torch.Tensor, rate: float = FALSE_FAILURE_RATE) -> list[str]:
    """The tokens whose count among ``counts.sum()`` draws is too far from the ``expected``
    probabilities for draws from them, as lines; empty when none is.

    Each token's count is binomial under the expected distribution; by the Chernoff bound the
    chance that ``n * KL(observed share || p) >= t`` on one side is at most ``exp(-t)``. With
    ``t = ln(2 * vocab / rate)`` the chance that any token of a conforming backend's draws crosses
    it (either side, union bound) is at most ``rate``: a false failure at most once in 1/rate runs."""
    n = int(counts.sum())
    threshold = math.log(2 * len(expected) / rate)
    lines = []
    for token, (count, p) in enumerate(zip(counts.tolist(), expected.tolist(), strict=True)):
        share = count / n
        divergence = n * _binary_kl(share, p)
        if divergence >= threshold:
            lines.append(f"token {token}: {count} of {n} draws, expected {n * p:.1f}")
    return lines


def _binary_kl(a: float, p: float) -> float:
    """KL(Bernoulli(a) || Bernoulli(p)), infinite where ``a`` is possible and ``p`` is not."""
    total = 0.0
    for x, y in ((a, p), (1 - a, 1 - p)):
        if x > 0:
            total += math.inf if y <= 0 else x * math.log(x / y)
    return total


@functools.lru_cache(maxsize=8)
def telling_prompt(model_dir: str, temperature: float) -> list[int]:
    """A prompt whose next token at ``temperature`` is spread beyond its five likeliest (a top-k
    cut shows) and often one of the prompt's own tokens (a repetition penalty shows): the best of
    a deterministic search over four-token prompts, by batched forwards."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    top = min(int(model.config.vocab_size), 40)
    everything = torch.tensor([[2, a, b, c] for a in range(4, top) for b in range(4, top) for c in range(4, top, 5)])
    best, best_score = everything[0].tolist(), -1.0
    for first in range(0, len(everything), 256):  # the first good enough (a quarter of the mass each way)
        candidates = everything[first:first + 256]
        with torch.no_grad():
            q = torch.softmax(model(input_ids=candidates).logits[:, -1].double() / temperature, dim=-1)
        in_prompt = (q * torch.zeros_like(q).scatter_(1, candidates, 1.0)).sum(-1)
        beyond_five = 1 - q.sort(dim=-1, descending=True).values[:, :5].sum(-1)
        score, index = torch.minimum(in_prompt, beyond_five).max(dim=0)
        if float(score) > best_score:
            best, best_score = candidates[int(index)].tolist(), float(score)
        if best_score >= 0.25:
            break
    return best


def check_first_tokens_follow(engine: Any, model_dir: str, temperature: float, samples: int, seed: int,
                              prompt: list[int] | None = None) -> None:
    """Fail, naming the tokens drawn too often or too rarely, unless the first tokens of
    ``samples`` completions of ``prompt`` (unset: :func:`telling_prompt`; half with a call seed,
    half with a request seed) follow the model's next-token distribution at ``temperature``
    (:func:`frequency_outliers`, each half at half the rate)."""
    prompt = prompt if prompt is not None else telling_prompt(model_dir, temperature)
    expected = model_distribution(model_dir, prompt, temperature)
    stated = SamplingSettings(temperature=temperature, max_new_tokens=1, seed=seed)
    for how, sampling in (("one seed for the call", stated),
                          ("request seeds", attrs.evolve(stated, request_seeds=(seed + 1,)))):
        (group,) = engine.generate([prompt], sampling, n=samples // 2)
        counts = torch.zeros(len(expected), dtype=torch.long)
        for sample in group:
            assert len(sample.completion_ids) == 1, "max_new_tokens=1 gave another length"
            counts[sample.completion_ids[0]] += 1
        outliers = frequency_outliers(counts, expected, FALSE_FAILURE_RATE / 2)
        if outliers:
            pytest.fail(f"with {how}, the first tokens sampled at temperature {temperature} do not follow the model's "
                        f"distribution at that temperature (is something besides SamplingSettings shaping them, e.g. "
                        f"the checkpoint's generation_config.json: {CHECKPOINT_SAMPLING_DEFAULTS}?): "
                        + "; ".join(outliers[:6]), pytrace=False)


def write_sampling_defaults(model_dir: str | Path, defaults: dict[str, Any] = CHECKPOINT_SAMPLING_DEFAULTS) -> None:
    """Add ``defaults`` to the checkpoint's ``generation_config.json`` (its token ids are kept)."""
    import json

    path = Path(model_dir) / "generation_config.json"
    values = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**values, **defaults}, indent=2))


@functools.lru_cache(maxsize=8)
def prompts_ending_at_eos(model_dir: str, eos: int, max_new_tokens: int, want: int = 2) -> list[list[int]]:
    """``want`` prompts whose greedy completion reaches ``eos`` after at least two tokens (a
    deterministic search over three-token prompts, by plain forwards)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = int(model.config.vocab_size)
    candidates = torch.tensor([[2, a, b] for a in range(4, min(vocab, 36)) for b in range(4, min(vocab, 36))])
    found: list[list[int]] = []
    for first in range(0, len(candidates), 32):
        ids = candidates[first:first + 32]
        with torch.no_grad():
            for _ in range(max_new_tokens):
                ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for row in ids.tolist():
            completion = row[3:]
            if eos in completion[2:] and eos not in completion[:2]:
                found.append(row[:3])
                if len(found) == want:
                    return found
    raise AssertionError(f"the suite's model reaches its end of sequence greedily after no prompt searched ({found})")


def reference_logprobs(model_dir: str, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion[t] | prompt + completion[:t]) by a plain transformers forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) + t - 1, token]) for t, token in enumerate(completion)]


class GenerationBackendConformance:
    """Base class of a generation backend's conformance tests; set ``backend_id`` (the module
    docstring lists the checks and the other class attributes)."""

    backend_id: ClassVar[str]
    #: recipe overrides of every engine the suite starts (e.g. the backend's own section)
    overrides: ClassVar[list[str]] = []
    #: a plugin module or object registered beside the installed plugins where ``backend_id`` is not installed
    plugin: ClassVar[Any] = None
    #: how far returned logprobs may be from a transformers forward's
    tolerance: ClassVar[float] = 1e-4
    max_new_tokens: ClassVar[int] = 12

    @pytest.fixture(scope="class")
    @classmethod
    def model_dirs(cls, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
        """Two tiny models with the same shapes and different weights (peaked logits, so greedy is
        robust); the first carries :data:`CHECKPOINT_SAMPLING_DEFAULTS` in its generation_config.json."""
        from corerl.models.tiny import build_tiny_model

        dirs = tuple(
            str(build_tiny_model(tmp_path_factory.mktemp(f"gen-model-{seed}"), seed=seed, initializer_range=0.3,
                                 hidden_size=128, num_heads=4, num_kv_heads=2))  # head_dim 32: vLLM's CPU kernels
            for seed in (0, 1)
        )
        write_sampling_defaults(dirs[0])
        return dirs

    @classmethod
    def _host(cls) -> Any:
        """The installed plugins, and :attr:`plugin` registered beside them where the backend is not
        installed (the recipe's other choices, the training backend among them, come from the installed ones)."""
        from corerl.testing import host_for_component

        return host_for_component("generation_backends", cls.backend_id, cls.plugin, "generation backend")[0]

    @classmethod
    def _create(cls, host: Any, recipe: Path, overrides: list[str] = ()) -> tuple[Any, Any]:
        """(config, engine) of ``recipe`` with the backend under test selected, as ``corerl validate``
        selects; a selection that fails on what the suite does not test fails in one line saying so."""
        from corerl.errors import CorerlError
        from corerl.testing import select_for

        try:
            config, selection = select_for(host, recipe, [*cls.overrides, *overrides])
        except CorerlError as exc:
            if not (exc.key or "").startswith("policy.generation"):
                pytest.fail(f"the generation suite validates its recipe as `corerl validate` does, which needs more "
                            f"than the backend under test: {exc} (install what it names, e.g. {_default_training_plugin()} "
                            f"for the default training backend, or choose another in the suite's overrides)", pytrace=False)
            raise
        choice = selection.generation_backend
        assert choice.id == cls.backend_id, choice.reason
        return config, choice.registration.create(config=config)

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, model_dirs: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        from corerl.testing import write_recipe

        recipe = write_recipe(Path(tmp_path_factory.mktemp("gen-recipe")) / "r.yaml", {
            "policy": {"model_name": model_dirs[0], "precision": "float32", "max_seq_length": 64,
                       "generation": {"backend": cls.backend_id}},
        })
        _, engine = cls._create(cls._host(), recipe)
        try:
            yield engine
        finally:
            engine.shutdown()

    @pytest.fixture(autouse=True)
    def _fresh_weights(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """Every test starts from model A (reloaded through the weight path, as the algorithms do)."""
        if getattr(engine, "_conformance_loaded", None) is None:
            engine.load_hf(model_dirs[0])
            engine._conformance_loaded = True
        else:
            engine.update_weights(_weights_of(model_dirs[0]))

    def test_greedy_matches_transformers(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(3,))
        got = [group[0].completion_ids for group in engine.generate(PROMPTS, sampling, n=1)]
        want = reference_greedy(model_dirs[0], PROMPTS, self.max_new_tokens, stop_id=3)
        assert [list(g) for g in got] == want

    def test_logprobs_match_a_transformers_forward(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        # sampled at temperature 0.7, the logprobs are still of the untempered distribution
        sampling = SamplingSettings(temperature=0.7, max_new_tokens=self.max_new_tokens, seed=7)
        for group in engine.generate(PROMPTS[:2], sampling, n=2):
            for sample in group:
                assert len(sample.logprobs) == len(sample.completion_ids) > 0
                want = reference_logprobs(model_dirs[0], list(sample.prompt_ids), list(sample.completion_ids))
                worst = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
                assert worst <= self.tolerance, f"logprobs differ by {worst:.3g}"

    def test_samples_follow_the_stated_distribution(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """800 first tokens at temperature 0.8 (:func:`check_first_tokens_follow`) of a prompt that shows
        a cut or a penalty (:func:`telling_prompt`): a backend that lets
        the checkpoint's ``generation_config.json`` fill what it does not pass (top-k 5, top-p 0.7, a
        repetition penalty on the prompt's tokens, temperature 0.5) draws other tokens than its
        logprobs describe. False failures: at most once in a million runs (:data:`FALSE_FAILURE_RATE`)."""
        check_first_tokens_follow(engine, model_dirs[0], temperature=0.8, samples=800, seed=21)

    def test_a_stop_id_ends_a_completion_where_it_is_sampled(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """A stop id that greedy decoding reaches mid-completion, before the end of sequence, ends
        the completion there: kept as its last token, ``finish_reason`` "stop" (a backend that
        ignores ``stop_token_ids`` runs on to the end of sequence or ``max_new_tokens``)."""
        from transformers import AutoConfig

        eos = AutoConfig.from_pretrained(model_dirs[0]).eos_token_id
        plain = reference_greedy(model_dirs[0], PROMPTS, self.max_new_tokens, stop_id=eos)
        # the first token sampled after the first position of some completion, not the end of sequence
        stop = next(ids[k] for ids in plain for k in range(1, len(ids) - 1) if ids[k] != eos)
        prompts = [prompt for prompt, ids in zip(PROMPTS, plain, strict=True) if stop in ids[:-1]]
        want = reference_greedy(model_dirs[0], prompts, self.max_new_tokens, stop_id=stop)
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(stop,))
        got = [group[0] for group in engine.generate(prompts, sampling)]
        assert [list(s.completion_ids) for s in got] == want, f"stop id {stop}"
        assert all(s.completion_ids[-1] == stop and s.finish_reason == "stop" for s in got), got

    def test_stop_ids_end_a_completion_besides_the_end_of_sequence(self, engine: Any,
                                                                    model_dirs: tuple[str, str]) -> None:
        """``stop_token_ids`` end a completion besides the model's end of sequence (contract 2.14):
        greedy completions that reach the end of sequence end there with the stop ids set."""
        from transformers import AutoConfig

        eos = AutoConfig.from_pretrained(model_dirs[0]).eos_token_id
        prompts = prompts_ending_at_eos(model_dirs[0], eos, self.max_new_tokens)
        plain = reference_greedy(model_dirs[0], prompts, self.max_new_tokens, stop_id=eos)
        stop = next(t for t in range(4, 128) if t != eos and all(t not in ids for ids in plain))
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(stop,))
        got = [g[0] for g in engine.generate(prompts, sampling)]
        if [list(s.completion_ids) for s in got] != plain:
            self._contract().missing(f"with stop_token_ids=({stop},) does not end completions at the model's end of "
                                     f"sequence ({eos}): got {[list(s.completion_ids) for s in got]}, want {plain}",
                                     STOP_IDS_BESIDES_EOS)
        assert all(s.finish_reason == "stop" for s in got)

    def test_banned_words_never_appear(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """``SamplingSettings.bad_words`` (contract 2.18), for a backend that sets
        ``accepts_bad_words = True`` (skipped for another, which validation refuses the key for): the
        words greedy decoding starts its completions with, banned, appear in no completion, as
        :func:`corerl.generation.bad_words.banned_sequences` spells them."""
        from transformers import AutoTokenizer

        from corerl.generation.bad_words import banned_sequences

        if not getattr(engine, "accepts_bad_words", False):
            pytest.skip("the backend does not ban words (accepts_bad_words is not set)")
        tokenizer = AutoTokenizer.from_pretrained(model_dirs[0])
        greedy = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens)
        plain = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)]
        # tokens of the completions (not special ones) whose text the tokenizer writes back as that one token
        special = set(tokenizer.all_special_ids)
        texts = {tokenizer.decode([t]).strip(): t for ids in plain for t in ids if t not in special}
        words = sorted(w for w, t in texts.items() if w and tokenizer.encode(w, add_special_tokens=False) == [t])[:4]
        banned = banned_sequences(tokenizer, words)
        assert words, plain
        got = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, attrs.evolve(greedy, bad_words=tuple(words)))]
        for ids in got:
            held = [seq for seq in banned if any(ids[k:k + len(seq)] == seq for k in range(len(ids)))]
            assert not held, f"banned {words}: a completion holds {held}: {ids}"
        assert got != plain

    def test_ignore_eos_runs_every_completion_to_max_new_tokens(self, engine: Any) -> None:
        """``SamplingSettings.ignore_eos`` (contract 2.6): no token ends a completion, not even the
        stop ids, which otherwise end nearly every one here (they are half the vocabulary)."""
        stops = tuple(range(64))
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=self.max_new_tokens, seed=11, stop_token_ids=stops)
        stopped = [s for g in engine.generate(PROMPTS, sampling, n=2) for s in g]
        assert any(s.finish_reason == "stop" for s in stopped)  # the stop ids do act without ignore_eos
        ignoring = attrs.evolve(sampling, ignore_eos=True)
        samples = [s for g in engine.generate(PROMPTS, ignoring, n=2) for s in g]
        if not all(len(s.completion_ids) == self.max_new_tokens and s.finish_reason == "length" for s in samples):
            self._contract().missing(f"with ignore_eos ends completions before max_new_tokens ({self.max_new_tokens}): "
                                     f"lengths {[len(s.completion_ids) for s in samples]}", IGNORE_EOS)

    def test_outputs_follow_refitted_weights(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(3,))
        before = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        engine.update_weights(_weights_of(model_dirs[1]))
        after = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        assert after != before
        assert after == reference_greedy(model_dirs[1], PROMPTS, self.max_new_tokens, stop_id=3)

    def test_an_update_may_leave_out_the_tied_copy(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """An update without ``lm_head.weight`` (the suite's models tie it to the embeddings) is the
        whole of the new weights (contract 2.14): the engine takes it, and the tie keeps the head current."""
        from transformers import AutoConfig

        assert AutoConfig.from_pretrained(model_dirs[1]).tie_word_embeddings
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(3,))
        try:
            engine.update_weights([(n, t) for n, t in _weights_of(model_dirs[1]) if n != "lm_head.weight"])
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding
            self._contract().missing(f"refuses an update without the tied lm_head.weight ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''})", TIED_UPDATES)
        after = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        if after != reference_greedy(model_dirs[1], PROMPTS, self.max_new_tokens, stop_id=3):
            self._contract().missing("samples with a stale output head after an update without the tied "
                                     "lm_head.weight", TIED_UPDATES)

    def test_n_samples_come_back_grouped_in_prompt_order(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        from transformers import AutoConfig

        eos = AutoConfig.from_pretrained(model_dirs[0]).eos_token_id
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=5, seed=3)
        groups = engine.generate(PROMPTS, sampling, n=3)
        assert len(groups) == len(PROMPTS)
        for prompt, group in zip(PROMPTS, groups, strict=True):
            assert len(group) == 3
            for sample in group:
                ids = list(sample.completion_ids)
                assert list(sample.prompt_ids) == prompt
                assert 0 < len(ids) <= 5 and eos not in ids[:-1]
                # a sample ends at its end-of-sequence token, which may be drawn at any step (the
                # fifth too), or else at max_new_tokens
                if ids[-1] == eos:
                    assert sample.finish_reason == "stop"
                else:
                    assert (len(ids), sample.finish_reason) == (5, "length")

    def test_the_same_prompt_twice_draws_independent_samples(self, engine: Any) -> None:
        # one seed per call must not mean one random stream per prompt: GRPO batches repeat prompts
        # and needs every sample drawn independently (the model here has high-entropy outputs)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=11)
        first, second = engine.generate([PROMPTS[0], PROMPTS[0]], sampling, n=4)
        assert [s.completion_ids for s in first] != [s.completion_ids for s in second]
        assert len({s.completion_ids for s in first}) > 1
        again = engine.generate([PROMPTS[0], PROMPTS[0]], sampling, n=4)
        assert [s.completion_ids for s in again[0]] == [s.completion_ids for s in first]


    def test_a_prompt_with_a_request_seed_samples_the_same_whatever_shares_its_call(self, engine: Any) -> None:
        # the multi-turn rollout batches episodes as their environment steps return; with request seeds a
        # prompt's samples depend on its seed alone, not on the prompts beside it (contract 2.12)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=11)
        alone = engine.generate([PROMPTS[2]], attrs.evolve(sampling, request_seeds=(7,)), n=2)[0]
        beside = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]],
                                 attrs.evolve(sampling, request_seeds=(5, 7, 9)), n=2)[1]
        if [s.completion_ids for s in alone] != [s.completion_ids for s in beside]:
            self._contract().missing("draws a prompt's samples from the whole call's stream, not from its request "
                                     "seed", REQUEST_SEEDS)
        assert alone[0].completion_ids != alone[1].completion_ids or len(alone[0].completion_ids) <= 1
        for one, other in zip(alone, beside, strict=True):
            assert one.logprobs == pytest.approx(other.logprobs, abs=self.tolerance)

    @classmethod
    def _contract(cls) -> ContractCheck:
        """The backend held to the contract version its plugin states (:mod:`corerl.testing.contract_versions`)."""
        host = cls._host()
        registration = host.generation_backends.get(cls.backend_id)
        assert registration is not None, f"no generation backend {cls.backend_id!r} is registered"
        return ContractCheck(f"generation backend {cls.backend_id!r} (plugin {registration.plugin!r})",
                             stated_contract(host, registration))

    def test_samples_follow_each_lora_adapter_loaded(self, model_dirs: tuple[str, str], tmp_path: Path) -> None:
        from corerl.errors import CorerlError
        from corerl.testing import select_for, write_recipe

        host = self._host()
        recipe = write_recipe(tmp_path / "lora.yaml", {
            "policy": {"model_name": model_dirs[0], "precision": "float32", "max_seq_length": 64,
                       "generation": {"backend": self.backend_id}, "lora": {"enabled": True, "dim": 8, "alpha": 16}},
        })
        if not host.generation_backends.get(self.backend_id).lora:
            with pytest.raises(CorerlError, match=r"^policy\.[\w.]+: [^\n]*LoRA[^\n]*$"):
                select_for(host, recipe, self.overrides)
            return
        config, engine = self._create(host, recipe)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=self.max_new_tokens, seed=5)
        try:
            engine.load_hf(model_dirs[0])
            seen = []
            for seed in (0, 1):
                model, adapter = _random_adapter(model_dirs[0], config.core.policy.lora, seed)
                engine.load_adapter(adapter)
                groups = engine.generate(PROMPTS, sampling)
                seen.append([g[0].completion_ids for g in groups])
                for group in groups:
                    sample = group[0]
                    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)])
                    with torch.no_grad():
                        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                    start = len(sample.prompt_ids)
                    want = [float(logp[start + t - 1, token]) for t, token in enumerate(sample.completion_ids)]
                    worst = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
                    assert worst <= self.tolerance, f"adapter {seed}: logprobs differ from PEFT's by {worst:.3g}"
            assert seen[0] != seen[1]  # the second adapter replaced the first
        finally:
            engine.shutdown()


def _random_adapter(model_dir: str, settings: Any, seed: int) -> tuple[Any, Any]:
    """A PEFT model of ``model_dir`` with an adapter of random A and B (so it changes the outputs),
    and that adapter as a LoRA refit carries it. The model is the reference: built through PEFT
    from the recipe's values (:func:`corerl.testing.reference.recipe_lora_config`), not corerl's
    mapping, which the refit's ``adapter_config.json`` comes from (a wrong mapping shows)."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from corerl.lora.adapter import config_dict
    from corerl.lora.weights import AdapterWeights
    from corerl.testing.reference import recipe_lora_config

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           recipe_lora_config(settings))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.3)
    model.eval()
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model, AdapterWeights(None, config_dict(settings, model_dir), model_dir, lambda: tensors)


def _weights_of(model_dir: str) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return list(model.state_dict().items())


def _default_training_plugin() -> str:
    """The distribution that provides the default training backend (known_plugins' table)."""
    from corerl.known_plugins import DEFAULT_TRAINING_BACKEND, provider_of

    plugin = provider_of("training backend", DEFAULT_TRAINING_BACKEND)
    return plugin.distribution if plugin is not None else DEFAULT_TRAINING_BACKEND
