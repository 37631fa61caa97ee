"""Registers the ``digit_guess`` environment and its section ``env.digit_guess``. Light: the
environment's module is imported only when a run builds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from corerl.sdk import Environment, EnvironmentSettings, hookimpl, setting


@attrs.define(kw_only=True)
class DigitGuessSettings(EnvironmentSettings):
    """``env.digit_guess``: besides every environment's ``num_workers``, ``timeout_s`` and
    ``max_failure_share``, how hints are given and what a wrong guess costs."""

    hints: Literal["text", "messages", "none"] = setting(
        "text", help="text: the hint after the model's turn; messages: a user chat message with it; none: ' ?' "
                     "whatever the guess")
    higher: str = setting("+", help="the hint after a guess below the digit (the built-in tiny model's tokenizer "
                                    "knows + and -; a real model's reads 'higher')")
    lower: str = setting("-", help="the hint after a guess above the digit")
    turn_penalty: float = setting(0.1, min=0.0, max=1.0, help="taken off the final reward per wrong guess")


@hookimpl
def corerl_register_environments(register: Callable[[Environment], None]) -> None:
    register(Environment(id="digit_guess", factory="corerl_example_environment.environment:DigitGuess",
                         config_schema=DigitGuessSettings,
                         description="guess the row's digit; each wrong guess gets a hint (template)"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
