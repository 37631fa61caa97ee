"""Agent harnesses for the endpoint tests: plain OpenAI-client loops, knowing nothing of corerl."""

from __future__ import annotations

from typing import Any


def two_turn_agent(row: dict[str, Any], client: Any) -> float:
    """Ask, show the answer back as a tool result, ask again; reward 1 when the last answer holds the row's digit."""
    from openai import OpenAI

    api = OpenAI(base_url=client.base_url, api_key=client.api_key)
    messages = [{"role": "user", "content": f"w0 {row['answer']} :"}]
    first = api.chat.completions.create(model=client.model, messages=messages, max_tokens=4)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "tool", "content": "w5"}]
    second = api.chat.completions.create(model=client.model, messages=messages, max_tokens=4)
    return 1.0 if str(row["answer"]) in (second.choices[0].message.content or "").split() else 0.0


def broken_agent(row: dict[str, Any], client: Any) -> float:
    raise RuntimeError("the harness crashed")


def sleeping_agent(row: dict[str, Any], client: Any) -> float:
    """A harness that never answers: it waits for ever, so a process that waits for its threads
    never ends (a run can end only by abandoning them)."""
    import threading

    threading.Event().wait()
    return 0.0
