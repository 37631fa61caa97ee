"""What an environment, a tool, a tool-call parser or a sandbox needs beyond
:mod:`corerl.sdk.registering`: the environment contract, tool calls and their results, and what a
sandbox's runner returns."""

from __future__ import annotations

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
    # sandboxes (corerl_register_sandboxes): what a runner's run returns; why an import path runs code
    "SandboxResult", "code_runner_problem",
]
