"""``data.apply_chat_template`` unset: prompts go through the chat template when the policy's
tokenizer has one (as NeMo RL and TRL do for conversational data), not otherwise; what the
recipe says wins; the selection table (and ``validate --json``) says which and why."""

from __future__ import annotations

import json

import pytest

from corerl import cli
from corerl.models.chat_template import folder_has_chat_template
from corerl.testing import select_for
from tests.conftest import REPO

DEMO = REPO / "examples" / "configs" / "demo.yaml"


@pytest.fixture
def tokenizers(tmp_path):
    """Three tokenizer folders: the template in tokenizer_config.json, in chat_template.jinja, none."""
    made = {}
    for name, files in {"in_config": {"tokenizer_config.json": json.dumps({"chat_template": "{{ messages }}"})},
                        "in_jinja": {"tokenizer_config.json": "{}", "chat_template.jinja": "{{ messages }}"},
                        "none": {"tokenizer_config.json": json.dumps({"model_max_length": 64})}}.items():
        folder = tmp_path / name
        folder.mkdir()
        for file, text in files.items():
            (folder / file).write_text(text)
        made[name] = folder
    return made


def test_a_tokenizer_folder_says_whether_it_has_a_chat_template(tokenizers, tmp_path):
    assert folder_has_chat_template(tokenizers["in_config"]) and folder_has_chat_template(tokenizers["in_jinja"])
    assert not folder_has_chat_template(tokenizers["none"]) and not folder_has_chat_template(tmp_path / "missing")


@pytest.mark.parametrize(("overrides", "chosen", "why"), [
    ([], "off", "the built-in model builtin:tiny-qwen2's tokenizer has no chat template"),
    (["policy.tokenizer_name={in_config}"], "on", "has a chat template: prompts go through it"),
    (["policy.tokenizer_name={in_jinja}"], "on", "has a chat template: prompts go through it"),
    (["policy.tokenizer_name={none}"], "off", "has no chat template"),
    (["policy.tokenizer_name={in_config}", "data.apply_chat_template=false"], "off", "data.apply_chat_template is false"),
    (["policy.chat_template='{{{{ messages }}}}'"], "on", "policy.chat_template gives a template"),
], ids=["built-in", "tokenizer_config.json", "chat_template.jinja", "no template", "the recipe says no",
        "policy.chat_template"])
def test_unset_follows_the_tokenizer_and_the_recipe_wins(corerl_host, tokenizers, tmp_path, overrides, chosen, why):
    config, selection = select_for(corerl_host, DEMO, [o.format(**tokenizers) for o in overrides])
    assert selection.chat_template.id == chosen and why in selection.chat_template.reason
    assert config.core.data.apply_chat_template is (chosen == "on")  # what every task then reads


def test_validate_says_which_and_why(capfd, tokenizers):
    assert cli.main(["validate", f"policy.tokenizer_name={tokenizers['in_jinja']}", "--json"]) == 0
    said = json.loads(capfd.readouterr().out)
    assert said["chat_template"]["id"] == "on" and "has a chat template" in said["chat_template"]["reason"]
