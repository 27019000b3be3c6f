"""Frontend tools and approvals over AG-UI (internal; used by :mod:`._agui`).

What ``@ag-ui/core`` 1.0.0 has (``node_modules/@ag-ui/core/dist/version-*.d.ts``): frontend
tools in ``RunAgentInput.tools`` (``name``, ``description``, ``parameters``), run by the
client on ``TOOL_CALL_END``, whose result comes back as a ``tool`` message
(``toolCallId``, ``content``) of the thread's next run; and interrupts: ``RUN_FINISHED`` with
``outcome: {"type": "interrupt", "interrupts": [{"id", "reason", "toolCallId", "message",
"expiresAt"}]}``, answered by the next run's ``resume: [{"interruptId", "status":
"resolved" | "cancelled", "payload"}]``.

Here: each of the input's ``tools`` is a client tool of that run (a tool without a function:
its committed call waits for the client; a name the server's tools have is 422
``tool_name_taken``). When every call the stream has started without its result waits on the
client, and the log stayed quiet for ``QUIET_S``, the stream ends: ``RUN_FINISHED`` with an
interrupt per call waiting for a person (``id``: the relay's signed token, ``reason``
``tool_approval``) or, when only client tools wait, a plain ``RUN_FINISHED``. The relay's run
goes on waiting. The thread's next ``POST /agui`` answers it: a ``resume`` entry whose
``interruptId`` is a waiting call's token (``resolved`` with ``payload.approved`` true:
approve, with ``payload.editedArgs`` when given; anything else: deny, ``payload.reason``), a
``tool`` message for a waiting client call (its content is the result); nothing else of the
input is read. The answered run's events continue under the new ``runId`` from where the
previous stream ended. The answers' refusals are :mod:`.._answers`'s (same codes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from weakref import WeakKeyDictionary

from ...core._errors import ConfigError
from ...tools._tools import Tool, schema_tool
from .._answers import answer, waiting
from .._requests import HTTPError
from .._runs import RelayRun

QUIET_S = 0.2
"""How long the log must stay still, with every open call waiting, before the stream ends."""
MAX_CLIENT_TOOLS = 64

_PAUSED: WeakKeyDictionary[RelayRun, int] = WeakKeyDictionary()
"""Where each run's last AG-UI stream ended."""


def client_tools(given: Sequence[Any], taken: Sequence[str]) -> list[Tool[..., Any]]:
    """The input's ``tools`` as client tools (schema only); :class:`HTTPError` 422 for a bad
    or taken name, a bad schema, or more than ``MAX_CLIENT_TOOLS``."""
    if len(given) > MAX_CLIENT_TOOLS:
        raise HTTPError(422, "too_many_tools", f"at most {MAX_CLIENT_TOOLS} frontend tools")
    tools: list[Tool[..., Any]] = []
    for t in given:
        if t.name in taken:
            raise HTTPError(422, "tool_name_taken", f"{t.name!r} is a server tool")
        parameters = t.parameters if isinstance(t.parameters, Mapping) else {"type": "object"}
        try:
            tools.append(schema_tool(t.name, parameters, description=t.description or ""))
        except ConfigError as exc:
            raise HTTPError(422, "invalid_tool", str(exc)) from None
    return tools


def pauser(
    run: RelayRun, unfinished: Callable[[], set[str]], closing: Callable[[list[Any]], bytes]
) -> Callable[[int], Any]:
    """The stream's ``pause(cursor)``: None to go on, or the bytes that end the stream
    (``closing(interrupts)``: the view's ``RUN_FINISHED``)."""

    async def pause(cursor: int) -> bytes | None:
        asked = waiting(run)
        if run.done or not asked or not unfinished() <= asked.keys():
            return None
        if await run.wait(cursor, QUIET_S):
            return None
        asked = waiting(run)
        if run.done or not unfinished() <= asked.keys():
            return None
        _PAUSED[run] = cursor
        interrupts = [
            {
                "id": a.token,
                "reason": "tool_approval",
                "toolCallId": call_id,
                "message": f"approve the call of {a.name}?",
            }
            for call_id, a in asked.items()
            if a.kind == "approval"
        ]
        return closing(interrupts)

    return pause


def expires(seconds: float | None) -> str | None:
    """An expiry as ISO 8601 (AG-UI's convention)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


async def answer_input(run: RelayRun, secret: bytes, given: Any) -> int:
    """Answer ``run``'s waiting calls from the input's ``resume`` entries and ``tool``
    messages (only those); the event its stream continues after. :class:`HTTPError`."""
    asked = waiting(run)
    by_token = {a.token: call_id for call_id, a in asked.items() if a.kind == "approval"}
    answered = 0
    for entry in given.resume or ():
        call_id = by_token.get(entry.interrupt_id)
        if call_id is None:
            continue
        payload = entry.payload if isinstance(entry.payload, Mapping) else {}
        body: dict[str, Any] = {"token": entry.interrupt_id}
        if entry.status == "resolved" and payload.get("approved") is True:
            if payload.get("editedArgs") is not None:
                body["args"] = payload["editedArgs"]
            await answer(run, secret, call_id, "approve", body)
        else:
            reason = payload.get("reason")
            body["reason"] = reason if isinstance(reason, str) and reason else "denied"
            await answer(run, secret, call_id, "deny", body)
        answered += 1
    for message in given.messages:
        call_id = getattr(message, "tool_call_id", None)
        if getattr(message, "role", None) != "tool" or call_id not in asked:
            continue
        if asked[call_id].kind != "client" or asked[call_id].answered:
            continue
        body = {"token": asked[call_id].token, "value": message.content}
        await answer(run, secret, call_id, "result", body)
        answered += 1
    if not answered:
        raise HTTPError(409, "thread_busy", "this thread's run waits; answer its calls")
    return _PAUSED.get(run, 0)
