"""What an environment, a tool, a tool-call parser or a sandbox needs beyond
:mod:`corerl.sdk.registering`: the environment contract, tool calls and their results, and what a
sandbox's runner returns."""

from __future__ import annotations

from typing import Any

from corerl.environments.contract import Environment as EnvironmentProtocol
from corerl.environments.contract import EnvironmentContext, EnvironmentSettings, EpisodeView, Turn
from corerl.environments.sandbox import SandboxResult
from corerl.environments.tools import ToolCall, ToolResult, execute, parse_hermes
from corerl.import_paths import code_runner_problem

__all__ = [
    # the environment contract: step(episode) -> Turn, what its factory gets, its section's keys
    "EnvironmentProtocol", "EnvironmentContext", "EnvironmentSettings", "EpisodeView", "Turn",
    # tools: a call read from a turn, its result, running it, the Hermes/Qwen parser
    "ToolCall", "ToolResult", "execute", "parse_hermes",
    # sandboxes (corerl_register_sandboxes): what a runner's run returns; why an import path runs code;
    # the runner of a registered sandbox, for a plugin that runs model-written code (contract 2.17)
    "SandboxResult", "code_runner_problem", "sandbox_runner",
]


def sandbox_runner(isolation: str, *, key: str, opt_in: str) -> Any:
    """The runner of the sandbox ``isolation`` names (``auto``: the best contained one available
    here), from this process's plugins, for an environment plugin that runs model-written code;
    where there is none, a :class:`~corerl.errors.ConfigError` at ``key`` (the plugin's own
    setting) whose hint names ``opt_in`` (its opt-in to a mode that is not a boundary)."""
    from corerl.environments.sandboxes import choose
    from corerl.plugin_manager import process_host

    return choose(isolation, process_host(), opt_in=opt_in, key=key)[1]
