"""Loading a tokenizer folder as it was saved.

transformers 5's ``AutoTokenizer`` picks the tokenizer class from the model's type when the
folder's ``tokenizer_config.json`` names the generic backend (``TokenizersBackend``, as a
``tokenizer.json`` built in code is saved): a Qwen2 model's folder then loads as
``Qwen2Tokenizer``, which replaces the saved pre-tokenizer with Qwen's byte-level one, so a
word-level tokenizer (corerl's built-in tiny models') no longer reads its own words. Such a
folder is loaded with the generic class, which keeps ``tokenizer.json`` as it is; any other
folder goes through ``AutoTokenizer``.

:func:`lost_text` tells whether encoding a text lost any of it (an unknown token, characters
the tokenizer dropped), for the reports of :mod:`corerl.reporting.lost_text`.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
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
    compare_vocabularies(load_tokenizer_folder(other).get_vocab(), load_tokenizer_folder(policy).get_vocab(), key, role)


def compare_vocabularies(theirs: dict[str, int], ours: dict[str, int], key: str, role: str) -> None:
    """The refusal of :func:`check_same_vocabulary`, given the two token -> id maps."""
    from corerl.errors import ConfigError

    if theirs != ours:
        differing = sorted(set(theirs.items()) ^ set(ours.items()), key=str)
        example = f" (e.g. {differing[0][0]!r})" if differing else ""
        raise ConfigError(f"the {role}'s tokenizer differs from the policy's: {len(theirs)} vs {len(ours)} tokens, "
                          f"{len(differing)} (token, id) pairs not shared{example}", key=key,
                          hint=f"the {role} reads the policy's own token ids: use one of the policy's tokenizer family")


def model_vocabulary(model_name: str, key: str) -> dict[str, int] | None:
    """The token -> id map of the tokenizer of the model (or tokenizer folder) ``model_name``
    names, building and converting nothing: a ``builtin:`` model's as it would be built, a
    folder's as saved; None for a GGUF file or a packaged model (known once converted). A folder
    whose tokenizer cannot be loaded is one line naming ``key``."""
    from corerl.models.gguf import PACKAGED
    from corerl.models.tiny import BUILTIN_MODELS, builtin_vocabulary

    if model_name in BUILTIN_MODELS:
        return builtin_vocabulary(model_name)
    if model_name.endswith(".gguf") or model_name in PACKAGED:
        return None
    return dict(tokenizer_at(model_name, key).get_vocab())


def tokenizer_at(path: str | Path, key: str) -> Any:
    """The tokenizer folder ``path`` loaded as saved; one that cannot be loaded is one line naming ``key``."""
    from corerl.errors import ConfigError
    from corerl.failures import first_line

    try:
        return load_tokenizer_folder(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # no or unreadable tokenizer files there
        raise ConfigError(f"cannot load a tokenizer from {path}: {first_line(exc)}", key=key,
                          hint="give a folder holding tokenizer.json or the tokenizer files save_pretrained "
                               "writes") from exc


def lost_text(tokenizer: Any, text: str, ids: Sequence[int]) -> bool:
    """Whether ``ids``, the encoding of ``text``, lost any of it: more unknown tokens than the
    text spells out, or fewer visible characters read back (decoded) than the text holds.
    Whitespace, Unicode normalisation and special tokens (a chat template's markers, a ``<bos>``
    the ids begin with) are not counted. One decode, no loop over tokens."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and list(ids).count(unk) > text.count(str(tokenizer.unk_token)):
        return True
    specials = [t for t in getattr(tokenizer, "all_special_tokens", ()) if t]
    read = _visible(tokenizer.decode(list(ids), skip_special_tokens=False), specials)
    given = _visible(text, specials)
    if len(read) >= len(given):
        return False
    return len(unicodedata.normalize("NFKC", read)) < len(unicodedata.normalize("NFKC", given))


def _visible(text: str, specials: Sequence[str]) -> str:
    """``text`` without whitespace and without the special tokens' spellings."""
    for token in specials:
        if token in text:
            text = text.replace(token, "")
    return "".join(text.split())
