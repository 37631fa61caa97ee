"""Whether the policy's tokenizer has a chat template, read from its folder's files (no
transformers import): what ``data.apply_chat_template`` defaults to when a recipe leaves it unset.

A tokenizer saved by transformers keeps its template in ``chat_template.jinja`` (transformers 5),
``chat_template.json``, or under ``chat_template`` in ``tokenizer_config.json``; a GGUF model's
conversion writes the same files. The built-in tiny models have none.
"""

from __future__ import annotations

import json
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

