"""Whether the policy's tokenizer has a chat template, read from its folder's files (no
transformers import): what ``data.apply_chat_template`` defaults to when a recipe leaves it unset.

A tokenizer saved by transformers keeps its template in ``chat_template.jinja`` (transformers 5),
``chat_template.json``, or under ``chat_template`` in ``tokenizer_config.json``; a GGUF model's
conversion writes the same files. The built-in tiny models have none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: the files a tokenizer folder may hold its chat template in, beside tokenizer_config.json's key
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def folder_has_chat_template(folder: str | Path) -> bool:
    """Whether the tokenizer saved in ``folder`` carries a chat template."""
    folder = Path(folder)
    if any((folder / name).is_file() for name in TEMPLATE_FILES):
        return True
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(settings, dict) and bool(settings.get("chat_template"))


def default_chat_template(config: Any) -> tuple[bool, str]:
    """What an unset ``data.apply_chat_template`` means for ``config``'s policy, and why."""
    from corerl.models.facts import local_model_name

    policy = config.core.policy
    if policy.chat_template:
        return True, "data.apply_chat_template is unset and policy.chat_template gives a template"
    name = policy.tokenizer_path(local_model_name(config))
    if name.startswith("builtin:"):
        return False, f"data.apply_chat_template is unset and the built-in model {name}'s tokenizer has no chat template"
    if not Path(name).is_dir():
        return False, f"data.apply_chat_template is unset and {name} is not a local tokenizer folder"
    if folder_has_chat_template(name):
        return True, (f"data.apply_chat_template is unset and the tokenizer of {name} has a chat template: prompts go "
                      "through it (set data.apply_chat_template=false for raw text)")
    return False, f"data.apply_chat_template is unset and the tokenizer of {name} has no chat template"


def resolve_chat_template(config: Any) -> tuple[bool, str]:
    """Whether prompts go through the chat template, and why: ``data.apply_chat_template`` as the
    recipe sets it, or, unset, :func:`default_chat_template`, which the unset key is then given (so
    every task, and a resume comparing its recorded recipe, reads the same bool)."""
    data = config.core.data
    if data.apply_chat_template is not None:
        return bool(data.apply_chat_template), f"data.apply_chat_template is {str(data.apply_chat_template).lower()}"
    chosen, reason = default_chat_template(config)
    data.apply_chat_template = chosen
    return chosen, reason



def with_template_arguments(template: str, arguments: dict[str, Any], key: str = "policy.chat_template_kwargs") -> str:
    """``template`` rendering as ``apply_chat_template(..., **arguments)`` would: each argument
    set at the template's top (``{%- set enable_thinking = false %}``), so every rendering of the
    tokenizer's template (the tasks', the environments', evaluation's) takes them without each
    call passing them, and the template stays a string a worker process can be sent. A name that
    is not a Jinja variable name, or a value that is not plain data, is refused in one line."""
    from corerl.errors import ConfigError

    lines = []
    for name, value in arguments.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise ConfigError(f"{name!r} is not a chat template variable name", key=f"{key}.{name}",
                              hint="give the variable names the model's chat template reads (enable_thinking, ...)")
        lines.append(f"{{%- set {name} = {_jinja_literal(value, f'{key}.{name}')} %}}")
    # transformers renders templates with trim_blocks: the block's own newline is taken, the
    # template's first character (a newline too) kept
    return "".join(lines) + "\n" + template if lines else template


def _jinja_literal(value: Any, key: str) -> str:
    from corerl.errors import ConfigError

    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{value} is not a value a chat template takes", key=key, hint="give a finite number")
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_jinja_literal(v, key) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_jinja_literal(v, key)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{type(value).__name__} is not a value a chat template takes", key=key,
                      hint="give a string, number, boolean, list or mapping")


def check_template_arguments_chosen(config: Any, chosen: Any) -> None:
    """``policy.chat_template_kwargs``: each a Jinja variable name with plain data (validation's
    table: refused by ``corerl validate`` as ``corerl run`` would)."""
    arguments = config.core.policy.chat_template_kwargs
    if arguments:
        with_template_arguments("", dict(arguments))


def templates_with_arguments(template: Any, arguments: dict[str, Any]) -> Any:
    """A tokenizer's ``chat_template`` (one template, or named ones in a mapping) with
    :func:`with_template_arguments` applied to each."""
    if isinstance(template, dict):
        return {name: with_template_arguments(text, arguments) for name, text in template.items()}
    return with_template_arguments(template, arguments)
