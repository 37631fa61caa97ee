"""On-policy distillation: its training signal is the reverse KL's gradient, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from corerl.algorithms.distillation_math import (
    TopKDistillationLoss,
    reverse_kl_advantages,
    reverse_kl_k3,
    topk_forward_kl,
    with_outcome_advantages,
)
from corerl.algorithms.grpo_math import GRPOLoss
from corerl.errors import ConfigError
from corerl.models.tiny import build_tokenizer
from corerl.models.tokenizer import check_same_vocabulary
from corerl.testing import host_with, select_for, write_recipe


def test_the_loss_on_reverse_kl_advantages_follows_the_gradient_of_kl_student_to_teacher():
    """Over every token of a 6-word vocabulary, each weighted by the student's probability (the
    exact expectation of sampling): GRPO's loss with advantages log q - log p has the gradient of
    KL(p || q) with respect to the student's logits, computed by autograd on the closed form."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, generator=gen, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(6, generator=gen), dim=0)
    student = torch.log_softmax(logits, dim=0)
    kl = (student.exp() * (student - teacher)).sum()
    (expected,) = torch.autograd.grad(kl, logits, retain_graph=True)

    logprobs = student.reshape(6, 1)  # six one-token rows, one per word
    mask = torch.ones(6, 1)
    advantages = reverse_kl_advantages(logprobs.detach(), teacher.reshape(6, 1), mask)
    batch = {"loss_mask": mask, "advantages": student.detach().exp().reshape(6, 1) * advantages}
    loss, _ = GRPOLoss()(logprobs, batch, 1.0)
    (ours,) = torch.autograd.grad(loss, logits)
    assert torch.allclose(ours, expected, atol=1e-6)
    # and the logged estimate averages to the same KL
    weighted = (student.exp() * reverse_kl_k3(student, teacher)).sum()
    assert torch.allclose(weighted, kl, atol=1e-6) and bool((reverse_kl_k3(student, teacher) >= 0).all())


def test_the_forward_kl_over_the_whole_vocabulary_has_the_gradient_of_kl_teacher_to_student():
    """With k the whole 6-word vocabulary the top-k sum is KL(teacher || student) itself: the
    loss's value and its gradient with respect to the student's logits are the closed form's,
    computed by autograd."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 6, generator=gen, requires_grad=True)  # 2 rows x 3 positions
    student = torch.log_softmax(logits, dim=-1)
    teacher = torch.log_softmax(torch.randn(2, 3, 6, generator=gen), dim=-1)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    closed = ((teacher.exp() * (teacher - student)).sum(-1) * mask).sum() / 3
    (expected,) = torch.autograd.grad(closed, logits, retain_graph=True)

    order = teacher.argsort(dim=-1, descending=True)  # the teacher's top-6, as an engine returns them
    batch = {"loss_mask": mask, "teacher_topk_logprobs": teacher.gather(-1, order),
             "candidate_logprobs": student.gather(-1, order)}
    loss, metrics = TopKDistillationLoss("forward")(student[..., 0], batch, 3.0)
    (ours,) = torch.autograd.grad(loss, logits)
    assert torch.allclose(loss, closed, atol=1e-6) and torch.allclose(ours, expected, atol=1e-6)
    assert float(metrics["forward_kl"]) == pytest.approx(float(closed.detach()))


def test_the_top_k_sum_by_hand_and_the_mixed_weighting():
    """k=2 of a 4-word vocabulary, by hand: the teacher's own probabilities of its two tokens,
    and with zero_outside_topk those two renormalised; mixed is the weighted sum of the forward
    term and GRPO's reverse-KL loss on the same batch."""
    teacher = torch.log(torch.tensor([[[0.5, 0.3]]]))  # 0.2 of the teacher's mass outside its top-2
    student = torch.log(torch.tensor([[[0.25, 0.25]]]))
    by_hand = 0.5 * (math.log(0.5) - math.log(0.25)) + 0.3 * (math.log(0.3) - math.log(0.25))
    assert float(topk_forward_kl(student, teacher)) == pytest.approx(by_hand, abs=1e-6)
    renormalised = 0.625 * (math.log(0.625) - math.log(0.25)) + 0.375 * (math.log(0.375) - math.log(0.25))
    assert float(topk_forward_kl(student, teacher, renormalise=True)) == pytest.approx(renormalised, abs=1e-6)

    logprobs = torch.tensor([[0.0, -1.2]], requires_grad=True)
    batch = {"loss_mask": torch.tensor([[0.0, 1.0]]), "advantages": torch.tensor([[0.0, 0.4]]),
             "teacher_topk_logprobs": torch.cat([torch.zeros(1, 1, 2), teacher], dim=1),
             "candidate_logprobs": torch.cat([torch.zeros(1, 1, 2), student], dim=1)}
    reverse, _ = GRPOLoss()(logprobs, batch, 1.0)
    mixed, metrics = TopKDistillationLoss("mixed", mixed_kl_weight=0.25)(logprobs, batch, 1.0)
    assert float(mixed.detach()) == pytest.approx(0.25 * by_hand + 0.75 * float(reverse.detach()), abs=1e-6)
    assert set(metrics) >= {"forward_kl", "clip_fraction"}


def test_the_outcome_advantage_adds_each_samples_group_advantage_on_its_loss_tokens():
    """NeMo RL's OPD with use_orm_advantage: beside the teacher's per-token advantage, each row's
    loss tokens get weight x its GRPO advantage (its group's mean taken away, scaled by the std)."""
    teacher_part = torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.0, 0.0], [-0.1, -0.1, 0.2], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])  # 2 prompts x 2 samples, rows in that order
    combined = with_outcome_advantages(teacher_part, rewards, mask, 0.5, scale_by_std=False)
    outcome = torch.tensor([0.5, -0.5, 0.0, 0.0]).reshape(-1, 1)  # each group's mean taken away
    assert torch.equal(combined, teacher_part + 0.5 * outcome * mask)
    assert combined[0, 2] == teacher_part[0, 2]  # a position outside the loss gets nothing
    assert with_outcome_advantages(teacher_part, rewards, mask, 0.0) is teacher_part  # the teacher alone
    scaled = with_outcome_advantages(torch.zeros(4, 3), rewards, mask, 1.0)  # scaled by the group's std
    assert scaled[0, 0] > 0.5 and scaled[1, 0] < -0.5 and scaled[2, 0] == 0


def test_top_k_and_candidate_logprobs_of_logits_line_up_with_the_token_logprobs():
    """The helpers every backend's forward uses: at each position the top-k of the next-token
    distribution (the sampled token's logprob among them when it is the most likely), and the
    candidates' logprobs where the candidates are the top-k, all 0 at position 0 and on padding."""
    from corerl.training.logprobs import (
        batch_logprobs,
        candidate_logprobs,
        join_topk,
        split_topk,
        topk_logprobs,
    )

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 11, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ids = logits.argmax(-1).roll(1, dims=1)  # each token the previous position's most likely
    top, top_ids = topk_logprobs(logits, 3, mask)
    full = torch.log_softmax(logits[:, :-1], dim=-1)
    assert torch.allclose(top[0, 1:], full[0].topk(3).values, atol=1e-6)
    assert torch.equal(top_ids[0, 1:], full[0].topk(3).indices)
    assert float(top[:, 0].abs().sum()) == 0.0 and float(top[1, 3:].abs().sum()) == 0.0
    assert torch.allclose(candidate_logprobs(logits, top_ids, mask), top, atol=1e-6)
    micro_batch = {"input_ids": ids, "attention_mask": mask, "topk_request": torch.tensor(3)}
    tokens = batch_logprobs(logits, micro_batch, mask)
    assert torch.allclose(tokens[:, 1:] * mask[:, 1:], top[:, 1:, 0] * mask[:, 1:], atol=1e-6)
    back = split_topk(join_topk(tokens, micro_batch))
    assert torch.equal(back[2], top_ids) and torch.allclose(back[1], top) and torch.allclose(back[0], tokens)


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    build_tokenizer(128).save_pretrained(tmp_path / "student")
    build_tokenizer(128).save_pretrained(tmp_path / "same")
    build_tokenizer(96).save_pretrained(tmp_path / "other")
    key = "algorithm.distillation.teacher_model"
    check_same_vocabulary(str(tmp_path / "student"), str(tmp_path / "same"), key, "teacher")
    with pytest.raises(ConfigError) as caught:
        check_same_vocabulary(str(tmp_path / "student"), str(tmp_path / "other"), key, "teacher")
    assert caught.value.key == "algorithm.distillation.teacher_model"
    assert "96 vs 128 tokens" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("settings", "key", "words"), [
    ({}, "algorithm.distillation.teacher_model", "needs a teacher"),
    ({"distillation": {"teacher_model": "builtin:tiny-qwen2"}, "dynamic_sampling": {"enabled": True}},
     "algorithm.dynamic_sampling.enabled", "not on rewards"),
    ({"distillation": {"teacher_model": "builtin:tiny-qwen2", "kl_type": "forward", "outcome_advantage_weight": 0.5}},
     "algorithm.distillation.outcome_advantage_weight", "reads the teacher's top-k, not advantages"),
], ids=["no teacher", "reward shaping", "outcome with the forward KL"])
def test_validation_refuses_what_distillation_cannot_run(tmp_path, settings, key, words):
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2-small", "generation": {"backend": "hf"}},
        "algorithm": {"name": "distillation", **settings}, "data": {"task": "digit_echo"}})
    with pytest.raises(ConfigError) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    assert caught.value.key == key and words in str(caught.value)


def test_a_teacher_that_is_not_here_is_refused_by_validate_and_at_run_start_but_not_for_the_recipe_alone(tmp_path):
    """The teacher's folder is checked where the policy's is: by the run's input check
    (``corerl validate``, and a run before it makes its directory), not by ``--recipe-only``."""
    from corerl.run.inputs import check_run_inputs

    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2-small", "generation": {"backend": "hf"}},
        "algorithm": {"name": "distillation", "distillation": {"teacher_model": "Qwen/Qwen3-32B"}},
        "data": {"task": "digit_echo"}, "run": {"output_dir": str(tmp_path / "runs")}})
    config, selection = select_for(host_with(None, "installed"), recipe, [])  # the recipe alone validates
    with pytest.raises(ConfigError) as caught:
        check_run_inputs(config, selection)
    assert caught.value.key == "algorithm.distillation.teacher_model"
    assert "Qwen/Qwen3-32B does not exist" in str(caught.value) and "\n" not in str(caught.value)


def test_a_teacher_backend_that_is_not_installed_is_refused_in_one_line(tmp_path):
    from corerl.algorithms.distillation import DistillationAlgorithm
    from corerl.config import config_from_mapping
    from corerl.config.selection import select
    from corerl.plugin_manager import PluginHost
    from corerl.reporting.console import make_console
    from corerl.run.context import RunContext

    host = PluginHost(env={})
    recipe = {"policy": {"model_name": "builtin:tiny-qwen2-small", "generation": {"backend": "hf"}},
              "algorithm": {"name": "distillation", "distillation": {"teacher_model": "builtin:tiny-qwen2",
                                                                     "teacher_training_backend": "nope"}},
              "data": {"task": "digit_echo"}, "run": {"output_dir": str(tmp_path), "name": "r", "tensorboard": False}}
    config = config_from_mapping(recipe, host)
    context = RunContext.open(config, select(config, host), make_console(), host)
    try:
        with pytest.raises(ConfigError) as caught:
            DistillationAlgorithm(context).begin()
        assert caught.value.key == "algorithm.distillation.teacher_training_backend"
        assert "'nope'" in str(caught.value) and not context.started
    finally:
        context.close(run_failed=False)


def test_a_teacher_of_its_own_gets_its_layout_its_ranks_and_its_own_placement_pool(tmp_path):
    """teacher_overrides laid over the recipe: policy keys change the teacher's layout and keep
    the policy's pool; cluster keys give it ranks in a pool of its own; what cannot be the
    teacher's own, or does not validate, is refused at the teacher's key."""
    from corerl.config.own_layout import with_own_layout
    from corerl.distributed.placement import training_layout
    from corerl.errors import ConfigErrors

    recipe = write_recipe(tmp_path / "r.yaml", {
        "cluster": {"gpus_per_node": 2},
        "policy": {"model_name": "builtin:tiny-qwen2-small", "generation": {"backend": "hf"},
                   "dtensor_cfg": {"enabled": True}},
        "algorithm": {"name": "distillation", "distillation": {"teacher_model": "builtin:tiny-qwen2"}},
        "data": {"task": "digit_echo"}})
    config, _ = select_for(host_with(None, "installed"), recipe, [])
    key = "algorithm.distillation.teacher_overrides"
    layout = with_own_layout(config, {"policy": {"precision": "bfloat16", "dtensor_cfg": {"tensor_parallel_size": 2}}},
                             key, "teacher")
    assert layout.core.policy.precision == "bfloat16" and layout.section("policy.dtensor_cfg").tensor_parallel_size == 2
    assert config.section("policy.dtensor_cfg").tensor_parallel_size == 1 and config.core.policy.precision == "float32"
    assert layout.pool == "colocated" and training_layout(layout.core.cluster, layout.pool).name == "colocated"
    own = with_own_layout(config, {"cluster": {"gpus_per_node": 4}}, key, "teacher")
    pool = training_layout(own.core.cluster, own.pool)
    assert (pool.name, pool.size, own.core.policy) == ("teacher", 4, config.core.policy)
    with pytest.raises(ConfigError, match="data is not a section a frozen model can have its own keys for") as caught:
        with_own_layout(config, {"data": {"task": "x"}}, key, "teacher")
    assert caught.value.key == f"{key}.data"
    with pytest.raises(ConfigErrors) as errors:
        with_own_layout(config, {"policy": {"dtensor_cfg": {"tensor_parallel_size": 3}}}, key, "teacher")
    assert [e.key for e in errors.value.errors] == [f"{key}.policy.dtensor_cfg.tensor_parallel_size"]
    assert "must divide the world size" in str(errors.value) and "\n" not in str(errors.value)
