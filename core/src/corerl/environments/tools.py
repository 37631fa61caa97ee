"""Tool calls: how they are read from a model turn, and how they are executed.

A parser (registered with ``corerl_register_tool_parsers``) turns a model turn into
:class:`ToolCall` objects; :func:`execute` runs each with the registered tool of that name and
says what went wrong in the result the model sees (an unknown tool, bad arguments, a tool that
raised), so that a failed call is a lesson for the policy, not a crash of the run.

The core's parser is ``hermes``: the format of the Qwen2/Qwen3 and Hermes chat templates, one
JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call read from a model turn: the tool's ``name`` and its ``arguments``; a call that
    could not be read has ``error`` set (and what was read of it)."""

    name: str = ""
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    error: str | None = None


@attrs.frozen(kw_only=True)
class ToolResult:
    """What one call returned (``content``, as the model will read it) and whether it failed."""

    name: str
    content: str
    failed: bool = False


def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``, in order
    (an unclosed last call is read to the end of the turn)."""
    if not isinstance(text, str):
        from corerl.errors import argument_error

        raise argument_error("parse_hermes", f"text must be a str (a model turn), got {type(text).__name__}",
                             hint="pass episode.response")
    calls = []
    for match in _HERMES_CALL.finditer(text):
        body = match.group(1).strip()
        try:
            payload = json.loads(body)
        except ValueError as exc:
            calls.append(ToolCall(error=f"the tool call is not JSON ({exc.msg})"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall(error='the tool call is not an object with a "name"'))
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some templates write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                calls.append(ToolCall(name=payload["name"], error="the arguments are not JSON"))
                continue
        if not isinstance(arguments, dict):
            calls.append(ToolCall(name=payload["name"], error='"arguments" is not an object'))
            continue
        calls.append(ToolCall(name=payload["name"], arguments=arguments))
    return calls


def execute(call: ToolCall, tools: Mapping[str, Callable[..., Any]]) -> ToolResult:
    """Run ``call`` with the tool of its name; every failure becomes a result the model reads
    (arguments that are not a :class:`ToolCall` and a mapping of tools are the caller's mistake:
    a :class:`~corerl.errors.PluginError`)."""
    if not isinstance(call, ToolCall) or not isinstance(tools, Mapping):
        from corerl.errors import argument_error

        wrong = (f"call must be a ToolCall, got {type(call).__name__}" if not isinstance(call, ToolCall)
                 else f"tools must be a mapping of names to functions, got {type(tools).__name__}")
        raise argument_error("execute", wrong, hint="pass one ToolCall of parse_hermes(...) and "
                                                    "{name: registration.load() for each tool}")
    if call.error is not None:
        return ToolResult(name=call.name, content=f"error: {call.error}", failed=True)
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(name=call.name, content=f"error: no tool named {call.name!r} (tools: {known})", failed=True)
    try:
        inspect.signature(tool).bind(**call.arguments)
    except TypeError as exc:
        return ToolResult(name=call.name, content=f"error: bad arguments: {exc}", failed=True)
    except ValueError:  # a builtin without a signature: let the call say
        pass
    try:
        value = tool(**call.arguments)
    except Exception as exc:  # the tool's own failure is the episode's, reported to the model
        return ToolResult(name=call.name, content=f"error: {type(exc).__name__}: {exc}", failed=True)
    return ToolResult(name=call.name, content=value if isinstance(value, str) else json.dumps(value))
