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
