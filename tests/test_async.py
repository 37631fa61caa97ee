"""Asynchronous RL's pieces in-process: the rollout buffer's samplers and staleness bound, the
version stamps, the generation worker taking weights mid-request with the real hf backend,
importance-sampling correction and its metrics, and the ``algorithm.async`` checks."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from corerl.algorithms.grpo_math import GRPOLoss, importance_weights, off_policy_metrics
from corerl.asynchronous.buffer import (
    GenerationStopped,
    RolloutBuffer,
    RolloutGroup,
    oldest_version,
)
from corerl.asynchronous.engine import joined, resume_seed
from corerl.asynchronous.worker import GenerationWorker, stamp
from corerl.config import config_from_mapping
from corerl.errors import ConfigErrors
from corerl.generation.contract import Sample, SamplingSettings
from corerl.plugin_manager import PluginHost


def sample(ids=(5, 6, 7), versions=None, mask=None, reason="stop") -> Sample:
    return Sample(prompt_ids=(1, 2), completion_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                  finish_reason=reason, completion_mask=mask, versions=versions)


def group(batch: int, index: int, version: int) -> RolloutGroup:
    return RolloutGroup.of((batch, index), [sample(versions=(version, version + 1, version + 1))], [1.0], {})


# -- the buffer ------------------------------------------------------------------------------------


def test_a_group_is_as_old_as_its_oldest_model_token():
    assert oldest_version([sample(versions=(3, 4, 4)), sample(versions=(5, 5, 5))]) == 3
    # an environment's tokens (mask 0) are not the model's: their stamp does not count
    assert oldest_version([sample(versions=(1, 4, 4), mask=(0, 1, 1))]) == 4
    assert oldest_version([sample()]) == 0


def test_in_order_waits_for_the_oldest_drawn_groups_even_when_later_ones_are_ready():
    buffer = RolloutBuffer("in_order", max_staleness=1)
    buffer.expect([(0, 0), (0, 1), (1, 0), (1, 1)])
    buffer.put(group(1, 0, 0))
    buffer.put(group(1, 1, 0))
    buffer.put(group(0, 1, 0))
    with pytest.raises(TimeoutError):
        buffer.take(2, version=0, timeout=0.05)
    buffer.put(group(0, 0, 0))
    assert [g.key for g in buffer.take(2, version=0)] == [(0, 0), (0, 1)]
    assert [g.key for g in buffer.take(2, version=1)] == [(1, 0), (1, 1)]


def test_ready_first_takes_groups_in_the_order_they_finished():
    buffer = RolloutBuffer("ready_first", max_staleness=2)
    buffer.expect([(0, 0), (0, 1), (1, 0)])
    for key in [(1, 0), (0, 1), (0, 0)]:
        buffer.put(group(*key, version=0))
    assert [g.key for g in buffer.take(2, version=0)] == [(1, 0), (0, 1)]


def test_windowed_takes_the_freshest_and_no_sampler_trains_a_group_past_the_bound():
    buffer = RolloutBuffer("windowed", max_staleness=1)
    buffer.expect([(0, 0), (0, 1), (1, 0), (1, 1)])
    buffer.put(group(0, 0, 2))
    buffer.put(group(0, 1, 3))
    buffer.put(group(1, 0, 4))
    buffer.put(group(1, 1, 4))
    # at version 4, the group stamped 2 is two versions old: dropped, never returned
    taken = buffer.take(2, version=4)
    assert [g.key for g in taken] == [(1, 0), (1, 1)]
    assert buffer.drain_dropped() == [(0, 0)] and buffer.dropped_total == 1
    assert [g.key for g in buffer.take(1, version=4)] == [(0, 1)]  # 3: one version old, allowed
    for sampler in ("in_order", "ready_first"):
        strict = RolloutBuffer(sampler, max_staleness=0)
        strict.expect([(0, 0), (0, 1)])
        strict.put(group(0, 0, 1))
        strict.put(group(0, 1, 2))
        assert [g.key for g in strict.take(1, version=2)] == [(0, 1)], sampler
        assert strict.drain_dropped() == [(0, 0)]


def test_a_generation_failure_reaches_the_trainer_and_a_closed_buffer_stops_it():
    buffer = RolloutBuffer("in_order", max_staleness=1)
    buffer.expect([(0, 0)])
    threading.Timer(0.05, buffer.fail, args=(RuntimeError("worker gone"),)).start()
    with pytest.raises(RuntimeError, match="worker gone"):
        buffer.take(1, version=0, timeout=5)
    closed = RolloutBuffer("in_order", max_staleness=1)
    closed.close()
    with pytest.raises(GenerationStopped):
        closed.take(1, version=0, timeout=5)


# -- version stamps and resumed requests -------------------------------------------------------------


def test_each_token_is_stamped_with_the_version_that_produced_it():
    stamped = stamp(sample(ids=(1, 2, 3, 4, 5)), [(0, 7), (2, 8), (4, 9)])
    assert stamped.versions == (7, 7, 8, 8, 9)
    assert stamp(sample(ids=(1, 2)), [(0, 3)]).versions == (3, 3)


def test_an_aborted_request_and_its_resumption_join_into_one_sample():
    head = sample(ids=(5, 6), versions=(1, 1), reason="length")
    tail = Sample(prompt_ids=(1, 2, 5, 6), completion_ids=(7, 8), logprobs=(-0.1, -0.2), finish_reason="stop",
                  versions=(2, 2))
    whole = joined(head, tail)
    assert whole.prompt_ids == (1, 2) and whole.completion_ids == (5, 6, 7, 8)
    assert whole.versions == (1, 1, 2, 2) and whole.finish_reason == "stop" and whole.logprobs[2:] == (-0.1, -0.2)
    assert resume_seed(11, 0) == 11 and resume_seed(11, 1) != resume_seed(11, 2) and resume_seed(None, 3) is None


# -- the generation worker with the real hf backend ---------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("model"), hidden_size=64, num_layers=2, vocab_size=128))


def hf_registration():
    return PluginHost(discover=False, env={}).generation_backends.get("hf")


def flat_weights(model_dir: str) -> list[tuple[str, torch.Tensor]]:
    """The model's weights with the output layer zeroed: every next token then has probability 1/vocab."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return [(name, torch.zeros_like(t) if "lm_head" in name or "embed_tokens" in name else t.clone())
            for name, t in model.state_dict().items()]


class UpdateArrivesAt(GenerationWorker):
    """The worker, with version 1's weights arriving while token ``at`` is being generated (the
    arrival's timing is the only thing arranged: the weights go through the worker's own path)."""

    at = 4

    def _between_tokens(self, generated: int) -> bool:
        if generated == self.at:
            with self.handover:
                self.pending = (1, self.arriving)
        return super()._between_tokens(generated)


def make_worker(model_dir: str, in_flight: str) -> UpdateArrivesAt:
    config = config_from_mapping({"policy": {"model_name": model_dir, "generation": {"backend": "hf"}}},
                                 PluginHost(discover=False, env={}))
    worker = UpdateArrivesAt(hf_registration(), config, threads=None, in_flight=in_flight)
    worker.load_hf(model_dir)
    worker.arriving = flat_weights(model_dir)
    return worker


SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=10, seed=5, stop_token_ids=(127,))


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory):
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("moe"), family="qwen3_moe", hidden_size=64, head_dim=32,
                                num_experts=4, experts_per_token=2, expert_intermediate_size=32))


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "moe"])
def test_continue_loads_the_new_weights_between_two_tokens_and_stamps_them(model_dir, moe_model_dir, dense):
    """Asynchronous GRPO's generation worker takes an update mid-request, on a dense policy and on
    a mixture of experts (its expert weights in the same update)."""
    if not dense:
        model_dir = moe_model_dir
    worker = make_worker(model_dir, "continue")
    groups, aborted = worker.generate([[1, 2, 3], [4, 5]], SAMPLING, 2)
    assert not aborted and worker.version == 1
    uniform = -math.log(128)
    for s in (s for g in groups for s in g):
        assert len(s.completion_ids) == 10  # nothing stops early: the update does not end the request
        assert s.versions == (0,) * 4 + (1,) * 6
        # tokens from the fifth on come from the new (flat) output layer: probability 1/vocab each
        assert all(abs(lp - uniform) < 1e-4 for lp in s.logprobs[4:])
        assert any(abs(lp - uniform) > 1e-3 for lp in s.logprobs[:4])


def test_abort_ends_the_call_at_the_update_and_the_next_call_runs_on_the_new_weights(model_dir):
    worker = make_worker(model_dir, "abort")
    groups, aborted = worker.generate([[1, 2, 3]], SAMPLING, 2)
    assert aborted
    assert all(len(s.completion_ids) < 10 and s.finish_reason == "length" and set(s.versions) == {0}
               for s in groups[0])
    worker.at = -1  # no further arrival
    again, aborted = worker.generate([[1, 2, 3]], SAMPLING, 1)
    assert not aborted and worker.version == 1 and set(again[0][0].versions) == {1}


def test_wait_leaves_the_request_on_its_weights_and_loads_the_update_when_idle(model_dir):
    config = config_from_mapping({"policy": {"model_name": model_dir, "generation": {"backend": "hf"}}},
                                 PluginHost(discover=False, env={}))
    worker = GenerationWorker(hf_registration(), config, threads=None, in_flight="wait")
    worker.load_hf(model_dir)
    assert worker.update_weights(flat_weights(model_dir), 3) == 3  # idle: loaded at once
    groups, _ = worker.generate([[1, 2]], SAMPLING, 1)
    assert set(groups[0][0].versions) == {3}
    assert all(abs(lp + math.log(128)) < 1e-4 for lp in groups[0][0].logprobs)


def test_every_backend_call_runs_on_the_workers_one_engine_thread_whichever_thread_asks(model_dir):
    """The Ray actor serves calls on several threads; CUDA graphs (the static KV cache on a GPU)
    assert when replayed from another thread than the one that captured them."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    config = config_from_mapping({"policy": {"model_name": model_dir, "generation": {"backend": "hf"}}},
                                 PluginHost(discover=False, env={}))
    worker = GenerationWorker(hf_registration(), config, threads=None, in_flight="wait")
    engine: set[int] = set()  # the threads that ran the backend's forwards and its methods
    for method in ("load_hf", "update_weights", "generate", "shutdown"):
        original = getattr(worker.backend, method)

        def recorded(*args, _original=original, **kwargs):
            engine.add(threading.get_ident())
            return _original(*args, **kwargs)

        setattr(worker.backend, method, recorded)
    with ThreadPoolExecutor(max_workers=2) as callers:
        callers.submit(worker.load_hf, model_dir).result()
        worker.backend.model.register_forward_pre_hook(lambda module, args: engine.add(threading.get_ident()))
        asked = {callers.submit(lambda: (worker.generate([[1, 2]], SAMPLING, 1), threading.get_ident())[1]).result()
                 for _ in range(4)}
        callers.submit(worker.update_weights, flat_weights(model_dir), 1).result()
        callers.submit(worker.shutdown).result()
    assert len(engine) == 1 and not engine & (asked | {threading.get_ident()})
    assert worker.version == 1


# -- importance-sampling correction ------------------------------------------------------------------


def test_the_three_bounds_on_the_importance_weights():
    old = torch.tensor([[0.0, math.log(3.0), math.log(0.1), 0.0], [math.log(1.001), math.log(0.999), 0.0, 0.0]])
    gen = torch.zeros_like(old)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    tis, changed = importance_weights(old, gen, mask, GRPOLoss(importance_weight_cap=2.0))
    assert torch.allclose(tis[0], torch.tensor([1.0, 2.0, 0.1, 0.0]))
    assert changed.tolist() == [[False, True, False, False], [False, False, False, False]]
    icepop, _ = importance_weights(old, gen, mask, GRPOLoss(importance_sampling_type="icepop",
                                                             importance_weight_cap=2.0, importance_weight_min=0.5))
    assert torch.allclose(icepop[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # the second row's geometric mean is 1 (within the bounds), the first row's 0.67 (outside)
    seq, changed = importance_weights(old, gen, mask, GRPOLoss(importance_sampling_type="seq-mask-tis",
                                                                importance_weight_cap=1.002, importance_weight_min=0.999))
    assert torch.all(seq[0] == 0) and torch.allclose(seq[1, :2], torch.tensor([1.001, 0.999]))
    assert changed[0, :3].all() and not changed[1].any()


def test_the_loss_weights_tokens_by_the_bounded_ratio_and_the_metrics_describe_the_gap():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    batch = {"loss_mask": torch.tensor([[1, 1, 1]]), "advantages": torch.ones(1, 3),
             "old_logprobs": torch.tensor([[-1.0, -2.0, -0.5]]), "gen_logprobs": torch.tensor([[-1.0, -3.0, -0.5]])}
    plain, _ = GRPOLoss()(logprobs, batch, 3.0)
    corrected, metrics = GRPOLoss(importance_sampling_correction=True, importance_weight_cap=2.0)(logprobs, batch, 3.0)
    # the middle token's weight e^1 = 2.72 is capped at 2: (1 + 2 + 1) / 3 of the plain per-token loss
    assert corrected.item() == pytest.approx(plain.item() * 4 / 3)
    assert metrics["importance_weight/mean"].item() == pytest.approx(4 / 3)
    gap = off_policy_metrics(batch["old_logprobs"], batch["gen_logprobs"], batch["loss_mask"],
                             GRPOLoss(importance_sampling_correction=True, importance_weight_cap=2.0))
    assert gap["logprob_mismatch/max"] == pytest.approx(1.0) and gap["logprob_mismatch/mean"] == pytest.approx(1 / 3)
    assert gap["importance_ratio/max"] == pytest.approx(math.e) and gap["importance_ratio/min"] == pytest.approx(1.0)
    assert gap["importance_ratio/clipped_share"] == pytest.approx(1 / 3)
    assert gap["logprob_mismatch/kl"] == pytest.approx((math.e - 1 - 1) / 3)


# -- validation ----------------------------------------------------------------------------------


def _config(**algorithm):
    mapping = {"policy": {"model_name": "builtin:tiny-qwen2",
                          "generation": {"colocated": {"enabled": False, "resources": {"gpus_per_node": 1}}}},
               "algorithm": {"async": {"enabled": True}, **algorithm}}
    return mapping


def test_async_is_refused_for_an_algorithm_without_an_asynchronous_step_and_with_colocated_generation():
    from corerl.config.selection import select

    host = PluginHost(discover=False, env={})
    with pytest.raises(ConfigErrors) as refused:
        select(config_from_mapping(_config(name="ppo"), host), host)
    assert "algorithm.async.enabled: algorithm 'ppo' has no asynchronous step" in str(refused.value)
    colocated = _config()
    colocated["policy"]["generation"]["colocated"] = {"enabled": True}
    with pytest.raises(ConfigErrors) as refused:
        select(config_from_mapping(colocated, host), host)
    assert "policy.generation.colocated.enabled: asynchronous RL generates while training runs" in str(refused.value)


def test_the_async_section_is_typed_and_bounded():
    host = PluginHost(discover=False, env={})
    with pytest.raises(ConfigErrors) as bad:
        config_from_mapping(_config(**{"async": {"enabled": True, "max_staleness": -1, "sampler": "newest",
                                                 "max_stalenes": 2}}), host)
    text = str(bad.value)
    assert "algorithm.async.max_staleness: must be at least 0" in text
    assert "algorithm.async.sampler" in text and "algorithm.async.max_stalenes: unknown key" in text
    config = config_from_mapping(_config(**{"async": {"enabled": True, "sampler": "windowed"}}), host)
    from corerl.asynchronous.settings import async_settings

    assert async_settings(config).sampler == "windowed" and async_settings(config).max_staleness == 1
