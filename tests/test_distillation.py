"""On-policy distillation: its training signal is the reverse KL's gradient, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from corerl.algorithms.distillation import (
    reverse_kl_advantages,
    reverse_kl_k3,
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
    ({"distillation": {"teacher_model": "no/such/folder"}}, "algorithm.distillation.teacher_model", "no config.json"),
    ({"distillation": {"teacher_model": "builtin:tiny-qwen2"}, "dynamic_sampling": {"enabled": True}},
     "algorithm.dynamic_sampling.enabled", "not on rewards"),
], ids=["no teacher", "missing folder", "reward shaping"])
def test_validation_refuses_what_distillation_cannot_run(tmp_path, settings, key, words):
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2-small", "generation": {"backend": "hf"}},
        "algorithm": {"name": "distillation", **settings}, "data": {"task": "digit_echo"}})
    with pytest.raises(ConfigError) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    assert caught.value.key == key and words in str(caught.value)


def test_a_teacher_backend_that_is_not_installed_is_refused_in_one_line(tmp_path):
    from corerl.algorithms.distillation import DistillationAlgorithm
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.reporting.console import make_console
    from corerl.run_context import RunContext
    from corerl.selection import select

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
