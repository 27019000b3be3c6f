"""Approvals and client tools over the AI SDK's UI message stream (internal; used by
:mod:`._ui_message`).

What ``ai`` 6.0.326 does (``node_modules/ai/dist/index.d.ts``): a ``tool-approval-request``
chunk (``approvalId``, ``toolCallId``) turns the tool part to ``approval-requested``;
``addToolApprovalResponse({id, approved, reason})`` turns it to ``approval-responded`` with
``approval: {id, approved, reason}``, and the next ``POST /api/chat`` (``sendMessage()``, or
``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses``) sends the
messages back, the assistant's last. A client tool: ``onToolCall`` sees the committed call
(``tool-input-available``), ``addToolOutput({tool, toolCallId, output})`` turns the part to
``output-available``, sent back the same way. The client only sends once the response stream
has ended, so the relay ends it when the run waits on the client (:func:`pauser`): every
committed call of the stream is either finished or waiting, and the log stayed quiet for
``QUIET_S``; the run itself goes on waiting.

The next ``POST /api/chat`` whose last message is the assistant's is an answer: of that
message only the parts of calls the chat's live run waits on are read (an approval response
for an approval question, whose ``approval.id`` must be the token the relay sent; an output
for a client tool's call): they are answered as ``POST /runs/.../approve|deny|result`` would
(:mod:`.._answers`: the same checks and codes); everything else the client sent is ignored,
the chat's history staying the server's. The answer's response continues the same message
from where the previous stream ended. 409 ``nothing_waiting`` when the chat's run waits on
nothing (or is not running here), 422 ``no_answers`` when the message answers none of its
waiting calls. Answers are applied in the message's order; a refused one stops there (the
ones before it stand). With a shared store the chat's run may be another worker's: the
message is handed to that owner (:meth:`~..store.RunStore.ask`), which answers it here
(:func:`apply_answers`) and replies where the stream continues; the answering worker then
streams the run from the store (without the early end: a run that waits on this client
again ends that stream only with the run).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol
from weakref import WeakKeyDictionary

import orjson

from .._answers import answer, waiting
from .._chats import CHAT_ID, ChatStore
from .._requests import HTTPError
from .._runs import RelayRun, RunRegistry, RunSource
from ..store._base import RunStore, StoreUnavailable

QUIET_S = 0.2
"""How long the log must stay still, with every open call waiting, before the stream ends."""

_PAUSED: WeakKeyDictionary[RelayRun, int] = WeakKeyDictionary()
"""Where each run's last stream ended (the next one continues there)."""


class AnswerHost(Protocol):
    """What answering needs of the relay."""

    runs: RunRegistry
    approval_secret: bytes
    store: RunStore

    @property
    def chats(self) -> ChatStore: ...

    async def find_run(self, run_id: str | None, session: str | None) -> RunSource | None: ...


def pauser(run: RelayRun) -> Callable[[Collection[str], int], Awaitable[bool]]:
    """The ``pause`` of :func:`._ui_message.ui_message_stream` for ``run``: called with the
    stream's committed calls that have no result yet, and its cursor."""

    async def pause(unfinished: Collection[str], cursor: int) -> bool:
        asked = waiting(run)
        if run.done or not asked or not set(unfinished) <= asked.keys():
            return False
        if await run.wait(cursor, QUIET_S):  # (it grew, or ended: go on streaming)
            return False
        if not set(unfinished) <= waiting(run).keys():
            return False
        _PAUSED[run] = cursor
        return True

    return pause


def last_assistant(body: bytes) -> Mapping[str, Any] | None:
    """The body's last message when it is the assistant's (an answer), else None."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("trigger") == "regenerate-message":
        return None  # (a regenerate names the answer it replaces: ._ui_message's own path)
    messages = data.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        return {"chat_id": data.get("id"), "message": last}
    return None


async def answer_chat(
    host: AnswerHost, session: str | None, found: Mapping[str, Any]
) -> tuple[RunSource, int]:
    """Answer the chat's waiting calls from ``found`` (:func:`last_assistant`), here or
    through the run's owner; the run and the event its stream continues after. Raises
    :class:`HTTPError`."""
    chat_id = found["chat_id"]
    if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
        raise HTTPError(422, "invalid_body", "id must be a chat id (1-128 of A-Za-z0-9_-)")
    run_id = await host.chats.latest_run(session, chat_id) if session is not None else None
    run = host.runs.owned(run_id, session) if run_id is not None else None
    if run is None and run_id is not None and host.store.shared:
        return await _through_owner(host, await host.find_run(run_id, session), found)
    if run is None:
        raise HTTPError(409, "nothing_waiting", "this chat's run waits on no answer")
    return run, await apply_answers(run, host.approval_secret, found["message"])


async def _through_owner(
    host: AnswerHost, run: RunSource | None, found: Mapping[str, Any]
) -> tuple[RunSource, int]:
    """The answer handed to the owner of another worker's ``run``; its reply."""
    if run is None or run.ended or isinstance(run, RelayRun):
        raise HTTPError(409, "nothing_waiting", "this chat's run waits on no answer")
    try:
        replied = await host.store.ask(run, {"kind": "chat", "message": found["message"]})
    except StoreUnavailable as exc:
        raise HTTPError(503, "store_unavailable", str(exc)) from None
    if replied is None:
        raise HTTPError(409, "nothing_waiting", "the chat's run has no worker any more")
    status, body = replied
    if status != 202:
        error = body.get("error", {})
        raise HTTPError(status, str(error.get("code")), str(error.get("message")))
    return run, int(body["start"])


async def apply_answers(run: RelayRun, secret: bytes, message: Mapping[str, Any]) -> int:
    """Answer ``run``'s waiting calls from the assistant ``message``'s parts; where the
    chat's stream continues. Raises :class:`HTTPError` (409 ``nothing_waiting``, 422)."""
    asked = waiting(run) if not run.done else {}
    if not asked:
        raise HTTPError(409, "nothing_waiting", "this chat's run waits on no answer")
    parts = message.get("parts")
    answered = 0
    for part in parts if isinstance(parts, list) else ():
        call_id = part.get("toolCallId") if isinstance(part, dict) else None
        if not isinstance(call_id, str) or call_id not in asked:
            continue
        question = asked[call_id]
        state = part.get("state")
        approval = part.get("approval")
        if question.kind == "approval" and state == "approval-responded":
            if not isinstance(approval, dict) or not isinstance(approval.get("approved"), bool):
                raise HTTPError(422, "invalid_body", f"{call_id}: approval needs approved")
            token = {"token": approval.get("id")}
            if approval["approved"]:
                await answer(run, secret, call_id, "approve", token)
            else:
                reason = approval.get("reason") or "denied by the user"
                body = {**token, "reason": reason}
                await answer(run, secret, call_id, "deny", body)
        elif question.kind == "client" and state in ("output-available", "output-error"):
            value = part.get("output") if state == "output-available" else None
            if state == "output-error":
                value = f"client error: {part.get('errorText')}"
            body = {"token": question.token, "value": value}  # (the session owns the run)
            await answer(run, secret, call_id, "result", body)
        else:
            continue
        answered += 1
    if not answered:
        raise HTTPError(422, "no_answers", "the message answers none of the waiting calls")
    return _PAUSED.get(run, 0)
