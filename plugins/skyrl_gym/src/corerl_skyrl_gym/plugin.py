"""Registers the ``skyrl_gym`` environment and its section ``env.skyrl_gym``. Light: skyrl-gym is
imported only when a recipe selects the environment (its check, then its episodes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from corerl.sdk import Environment, EnvironmentSettings, hookimpl, setting


@attrs.define(kw_only=True)
class SkyRLGymSettings(EnvironmentSettings):
    """``env.skyrl_gym``: besides every environment's ``num_workers``, ``timeout_s`` and
    ``max_failure_share``, which skyrl-gym environment plays and what it is given."""

    env_class: str = setting(
        "gsm8k", help="the skyrl-gym environment id (SkyRL's environment.env_class): gsm8k, gsm8k_multi_turn, aime, "
                      "text2sql, search, lcb, searchcode, or one named in env.skyrl_gym.register; a row's own "
                      "env_class column, where it has one, wins (as in SkyRL)")
    env_config: dict[str, Any] = setting(
        {}, help="given to each episode's environment as env_config (SkyRL's environment.skyrl_gym.<env_class>), laid "
                 "over skyrl-gym's own defaults (text2sql: db_path; search: search_url, topk, timeout, log_requests)")
    max_turns: int | None = setting(
        None, min=1, help="given to each environment as extras['max_turns'] (SkyRL's generator.max_turns); unset: not "
                          "given, the environment's own default applies; ${algorithm.max_rollout_turns} gives "
                          "corerl's turn limit")
    register: dict[str, str] = setting(
        {}, help="more skyrl-gym environments, id -> entry point 'module:Class', registered with skyrl_gym.register "
                 "before the first episode (what a SkyRL example's own main_*.py does)")
    conversation_format: bool = setting(
        True, help="SkyRL's generator.use_conversation_multi_turn. true: each turn's observations are chat messages, "
                   "rendered with the chat template as the conversation's next turn; false: their contents, joined "
                   "as they are (no template markers), are appended as text to the model's running response, one "
                   "assistant message for the whole episode (the environment's tokens out of the loss either way)")
    allow_unsandboxed_code: bool = setting(
        False, help="true: lcb and searchcode run the model's code as skyrl-gym runs it, in a plain Python process on "
                    "this machine with no sandbox; false: lcb runs its tests in the sandbox env.skyrl_gym.isolation "
                    "names, and searchcode (which has none here) is refused")
    isolation: str = setting(
        "auto", help="the sandbox lcb's tests run in (corerl plugins lists them), as env.code.isolation names it: auto, "
                     "the best contained one available (namespaces), else a recipe playing lcb is refused; audit only "
                     "when named (not a security boundary: docs/security.md)")
    sandbox_memory_mb: int = setting(
        4096, min=64, help="address-space limit (RLIMIT_AS) of the sandboxed program that runs lcb's tests, in MiB "
                           "(skyrl-gym sets none)")


@hookimpl
def corerl_register_environments(register: Callable[[Environment], None]) -> None:
    register(Environment(id="skyrl_gym", factory="corerl_skyrl_gym.environment:SkyRLGymEnvironment",
                         config_schema=SkyRLGymSettings, check_supported="corerl_skyrl_gym.checks:check_skyrl_gym",
                         check_inputs="corerl_skyrl_gym.checks:check_skyrl_gym_inputs",
                         description="SkyRL's skyrl-gym environments (gsm8k, aime, text2sql, search, ...) as they are"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
