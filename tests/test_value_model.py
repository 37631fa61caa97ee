"""The PPO critic in Hugging Face form: the policy's backbone with a zero value head, read on
padded and on packed rows alike."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from corerl.models.tiny import build_tiny_model
from corerl.models.value_model import init_value_model, model_values


def test_the_critic_keeps_the_policy_backbone_and_starts_at_zero(tmp_path):
    from transformers import AutoModelForTokenClassification

    policy = build_tiny_model(tmp_path / "policy", hidden_size=64, num_layers=2)
    critic = init_value_model(policy, tmp_path / "critic")
    policy_weights, critic_weights = load_file(str(policy / "model.safetensors")), load_file(str(critic / "model.safetensors"))
    backbone = {k for k in policy_weights if k.startswith("model.")}
    assert backbone and all(torch.equal(policy_weights[k], critic_weights[k]) for k in backbone)
    assert critic_weights["score.weight"].shape == (1, 64) and critic_weights["score.weight"].abs().sum() == 0
    assert (critic / "tokenizer.json").exists()
    model = AutoModelForTokenClassification.from_pretrained(critic, dtype=torch.float32)
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7], [2, 8, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}
    assert torch.equal(model_values(model, batch), torch.zeros(2, 4))


def test_values_of_packed_rows_equal_the_padded_ones(tmp_path):
    from transformers import AutoModelForTokenClassification

    critic = init_value_model(build_tiny_model(tmp_path / "policy", hidden_size=64, num_layers=2), tmp_path / "critic")
    model = AutoModelForTokenClassification.from_pretrained(critic, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        model.score.weight.normal_()
    padded = {"input_ids": torch.tensor([[2, 5, 6, 7], [2, 8, 9, 0]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])}
    packed = {"input_ids": torch.tensor([[2, 5, 6, 7, 2, 8, 9]]), "attention_mask": torch.ones(1, 7, dtype=torch.long),
              "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2]])}
    ours, theirs = model_values(model, padded), model_values(model, packed)
    assert torch.allclose(theirs[0, :4], ours[0], atol=1e-5) and torch.allclose(theirs[0, 4:], ours[1, :3], atol=1e-5)
    assert ours[1, 3] == 0  # padding
