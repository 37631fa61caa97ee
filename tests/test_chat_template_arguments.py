"""``policy.chat_template_kwargs``: the variables a chat template is rendered with (gpt-oss's
``reasoning_effort``, Qwen3's ``enable_thinking``), set on the tokenizer's template so every
prompt corerl renders takes them; SkyRL's ``generator.chat_template_kwargs`` and NeMo RL's
``policy.tokenizer.chat_template_kwargs`` act through it. In process (fast tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corerl.errors import ConfigError
from corerl.models.chat_template import templates_with_arguments, with_template_arguments

TEMPLATE = ("{% if enable_thinking %}<think>{% endif %}[{{ reasoning_effort | default('medium') }}]"
            "{% for m in messages %}{{ m['content'] }}|{% endfor %}")


def _tokenizer(tmp_path: Path):
    from corerl.models.tokenizer import load_tokenizer_folder
    from corerl.run.directory import resolve_model

    tokenizer = load_tokenizer_folder(resolve_model("builtin:tiny-qwen2", tmp_path))
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_the_arguments_render_as_apply_chat_templates_keyword_arguments(tmp_path):
    tokenizer = _tokenizer(tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    given = {"enable_thinking": True, "reasoning_effort": "low"}
    want = tokenizer.apply_chat_template(messages, tokenize=False, **given)
    assert want == "<think>[low]hi|"
    tokenizer.chat_template = with_template_arguments(TEMPLATE, given)
    assert tokenizer.apply_chat_template(messages, tokenize=False) == want
    assert tokenizer.apply_chat_template(messages, tokenize=False) != _tokenizer(tmp_path).apply_chat_template(
        messages, tokenize=False)  # without them the template renders otherwise
    # every value kind a template takes; named templates each get them
    literal = with_template_arguments("{{ a }}{{ b }}{{ c }}{{ d['k'] }}{{ e is none }}",
                                      {"a": 1.5, "b": [1, "x"], "c": False, "d": {"k": "v"}, "e": None})
    tokenizer.chat_template = literal
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "1.5[1, 'x']FalsevTrue"
    named = templates_with_arguments({"default": "{{ x }}", "tool_use": "{{ x }}!"}, {"x": 2})
    assert named == {"default": "{%- set x = 2 %}\n{{ x }}", "tool_use": "{%- set x = 2 %}\n{{ x }}!"}
    # a template's own leading newline is kept (transformers renders with trim_blocks)
    tokenizer.chat_template = "\n[{{ x }}]{{ messages[0]['content'] }}"
    plain = tokenizer.apply_chat_template(messages, tokenize=False, x=7)
    tokenizer.chat_template = with_template_arguments("\n[{{ x }}]{{ messages[0]['content'] }}", {"x": 7})
    assert tokenizer.apply_chat_template(messages, tokenize=False) == plain == "\n[7]hi"
    assert with_template_arguments(TEMPLATE, {}) == TEMPLATE


def test_a_name_no_template_reads_and_a_value_no_template_takes_are_refused():
    with pytest.raises(ConfigError) as caught:
        with_template_arguments(TEMPLATE, {"reasoning_effort:'low'": None})
    assert caught.value.key == "policy.chat_template_kwargs.reasoning_effort:'low'"
    with pytest.raises(ConfigError, match="is not a value a chat template takes"):
        with_template_arguments(TEMPLATE, {"x": object()})
    with pytest.raises(ConfigError, match="give a finite number"):
        with_template_arguments(TEMPLATE, {"x": float("nan")})


def test_validate_refuses_a_bad_name_and_the_dialects_keys_act(capsys, tmp_path):
    from corerl import cli
    from corerl.config.dialects.skyrl.translate import translate
    from corerl.config.tree import value_at
    from corerl.errors import ConfigErrors

    assert cli.main(["validate", "--recipe-only", "policy.chat_template_kwargs={'bad name': 1}"]) == 2
    assert "'bad name' is not a chat template variable name" in capsys.readouterr().err
    tree = {"generator": {"chat_template_kwargs": {"enable_thinking": False}}}
    result = translate(tree, {"generator.chat_template_kwargs": "run.sh:3"})
    assert value_at(result.tree, "policy.chat_template_kwargs") == {"enable_thinking": False}
    with pytest.raises(ConfigErrors, match="YAML reads"):
        translate({"generator": {"chat_template_kwargs": {"reasoning_effort:'low'": None}}},
                  {"generator.chat_template_kwargs": "run.sh:3"})
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("grpo:\n  num_prompts_per_step: 2\npolicy:\n  model_name: builtin:tiny-qwen2\n  tokenizer:\n"
                      "    chat_template_kwargs:\n      enable_thinking: false\n", encoding="utf-8")
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    config = load_config(str(recipe), [], PluginHost(), [], "nemo-rl")
    assert config.core.policy.chat_template_kwargs == {"enable_thinking": False}


def test_a_runs_prompts_are_rendered_with_the_arguments(corerl_host, tmp_path):
    """The run's policy model sets them on its tokenizer's template: the dataset task's prompts
    come out rendered with them (and without them, as the template renders otherwise)."""
    from corerl.run.policy_model import PolicyModel
    from corerl.testing import select_for, write_recipe

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "2 + 2", "answer": "4"}\n', encoding="utf-8")
    recipe = write_recipe(tmp_path / "recipe.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "chat_template": "{% if enable_thinking %}9 9 {% endif %}"
                                                                       "{{ messages[0]['content'] }}"},
        "data": {"task": "dataset", "train_files": str(rows), "held_out_files": str(rows),
                 "apply_chat_template": True}})
    rendered = {}
    for given in ([], ["policy.chat_template_kwargs={enable_thinking: true}"]):
        config, selection = select_for(corerl_host, recipe, given)
        policy = PolicyModel(config, selection, tmp_path / "run")
        policy.load()
        (prompt,), _ = policy.task.sample(1)
        rendered[bool(given)] = policy.tokenizer.decode(prompt)
    assert rendered == {False: "2 + 2", True: "9 9 2 + 2"}
