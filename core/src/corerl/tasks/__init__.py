"""Built-in tasks: prompts, held-out prompts and a reward, made in code."""

from __future__ import annotations

from typing import Any

from corerl.errors import ConfigError

BUILTIN_TASKS = ("digit_echo",)


def load_task(name: str, tokenizer: Any, seed: int) -> Any:
    """The built-in task called ``name`` over ``tokenizer``."""
    if name == "digit_echo":
        from corerl.tasks.digit_echo import DigitEcho

        return DigitEcho(tokenizer, seed)
    raise ConfigError(
        f"unknown task {name!r}", key="data.task", hint=f"built-in tasks: {', '.join(BUILTIN_TASKS)}"
    )
