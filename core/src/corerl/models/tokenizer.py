"""Loading a tokenizer folder as it was saved.

transformers 5's ``AutoTokenizer`` picks the tokenizer class from the model's type when the
folder's ``tokenizer_config.json`` names the generic backend (``TokenizersBackend``, as a
``tokenizer.json`` built in code is saved): a Qwen2 model's folder then loads as
``Qwen2Tokenizer``, which replaces the saved pre-tokenizer with Qwen's byte-level one, so a
word-level tokenizer (corerl's built-in tiny models') no longer reads its own words. Such a
folder is loaded with the generic class, which keeps ``tokenizer.json`` as it is; any other
folder goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer_folder(path: str | Path) -> Any:
    """The tokenizer saved at ``path`` (see the module's docstring)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    try:
        saved_class = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError):
        saved_class = None
    if saved_class in GENERIC_CLASSES and (Path(path) / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def check_same_vocabulary(policy: str | Path, other: str | Path, key: str, role: str) -> None:
    """Refuses, in one line naming ``key``, a ``role`` model (a distillation teacher, a reward
    model, a judge) whose tokenizer maps any token to another id than the policy's: it reads the
    policy's own token ids, so it would score other tokens than the ones sampled."""
    from corerl.errors import ConfigError

    theirs, ours = load_tokenizer_folder(other).get_vocab(), load_tokenizer_folder(policy).get_vocab()
    if theirs != ours:
        differing = sorted(set(theirs.items()) ^ set(ours.items()), key=str)
        example = f" (e.g. {differing[0][0]!r})" if differing else ""
        raise ConfigError(f"the {role}'s tokenizer differs from the policy's: {len(theirs)} vs {len(ours)} tokens, "
                          f"{len(differing)} (token, id) pairs not shared{example}", key=key,
                          hint=f"the {role} reads the policy's own token ids: use one of the policy's tokenizer family")
