"""Conversations the relay keeps on the server (internal; used by ``POST /api/chat``,
``POST /runs {"chat_id"}`` and any other endpoint that continues a chat).

A chat is named by the client (``useChat``'s ``id``, an AG-UI ``threadId``, the page's chat
id) and belongs to one session: its history is stored in the relay's history store (the
ledger's, so a restart keeps it; in memory without a ledger) under :meth:`ChatStore.scope`,
which does not reveal the session token. Each message of the chat is one run of the agent that
continues the stored history (``Agent.run(message, resume=True, session=scope)``): the model
reads the server's own history, never what a client sends back (a tool result a client made
up never reaches it). A chat speaks one provider's history format: the first message fixes
the provider (kept under ``scope + "/meta"``); a later one naming another is 409.

Regenerating (``useChat``'s ``regenerate()``): :meth:`ChatStore.regenerate` drops the chat's
last answer from the server's own history and the chat's next run asks the model again after
the last user message. Stored histories are append-only, so the chat moves to a new branch: the
history up to and including its last user message is copied under a new key, and the meta
names it. The meta (``scope + "/meta"``, append-only too) is ``{"provider"}`` followed by one
``{"turn": at, "run": run id}`` per message (``at``: where the message's user turn is in the
history) and one ``{"branch": key suffix, "keep": at}`` per regeneration.

Bounds: a chat holds at most ``max_messages`` history entries (``relay.max_chat_messages``):
a message to a chat that has reached it is refused (409 ``chat_too_long``; start a new chat),
so a chat's stored history, and what the model is sent, stay bounded. One message at a time
per chat (409 ``chat_busy`` while its run is going). The chat -> latest run pointer, which
is what resuming a chat's stream needs, is in the run store (:mod:`.store`: in memory, the
last ``max_stored_runs`` chats; or shared between workers). Without a ledger
the histories are in memory (:class:`BoundedMemoryHistory`), the newest ``2 * keep`` entries
(a chat's history and its meta) kept.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core._errors import UsageError
from ..ledger import History, HistoryConflict
from ._requests import HTTPError
from .store._base import RunStore, StoreUnavailable

CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A chat id as a client may pick it (``useChat`` ids are 16 such characters)."""


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """Where the next message of a chat goes: the history ``scope`` (the agent's
    ``session``), whether there is a stored history to continue (``resume``), the chat's
    ``provider``; ``at``: where the message's user turn goes in the history, ``meta``: the
    length of the chat's meta (where :meth:`ChatStore.record` writes)."""

    scope: str
    resume: bool
    provider: str
    at: int = 0
    meta: int = 1


@dataclass(frozen=True, slots=True)
class _Meta:
    """A chat's meta, read: its provider, the history key of its branch, its turns
    (``(at, run id)``, oldest first) and the meta's length."""

    provider: str | None
    scope: str
    turns: tuple[tuple[int, str], ...]
    length: int


def _read_meta(scope: str, meta: Sequence[dict[str, Any]]) -> _Meta:
    name = meta[0].get("provider") if meta else None
    branch, turns = scope, []
    for entry in meta[1:]:
        if isinstance(entry.get("turn"), int) and isinstance(entry.get("run"), str):
            turns.append((entry["turn"], entry["run"]))
        elif isinstance(entry.get("branch"), str) and isinstance(entry.get("keep"), int):
            branch = f"{scope}/{entry['branch']}"
            turns = [t for t in turns if t[0] < entry["keep"]]
    provider = name if isinstance(name, str) else None
    return _Meta(provider, branch, tuple(turns), len(meta))


class BoundedMemoryHistory:
    """A :class:`~toollatch.ledger.History` in memory that keeps the newest ``keep`` histories
    (by last write; the oldest are forgotten): the chats of a relay without a ledger."""

    in_process: ClassVar[bool] = True
    """No other process reads it: a run keeps no record for a survivor here (see
    :mod:`toollatch.runtime._resume`), nor a key more per chat."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._runs: OrderedDict[str, list[str]] = OrderedDict()

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """See :meth:`History.append` (messages must be JSON objects)."""
        stored = self._runs.get(run, [])
        if len(stored) != at:
            raise HistoryConflict(f"run {run!r} has {len(stored)} messages, not {at}")
        try:
            encoded = [json.dumps(m, separators=(",", ":"), allow_nan=False) for m in messages]
        except (TypeError, ValueError) as exc:
            raise UsageError(f"a history message is not JSON: {exc}") from exc
        self._runs.pop(run, None)
        self._runs[run] = [*stored, *encoded]
        while len(self._runs) > self._keep:
            self._runs.popitem(last=False)
        return len(self._runs[run])

    async def load(self, run: str) -> list[dict[str, Any]]:
        """See :meth:`History.load`."""
        return [json.loads(m) for m in self._runs.get(run, [])]

    async def aclose(self) -> None:
        """Nothing to release."""


class ChatStore:
    """The chats of every session over one history store (see the module docstring).

    How an endpoint continues a chat (what :meth:`Relay.start_chat_run
    <toollatch.relay.Relay.start_chat_run>` does)::

        store.claim(session, chat_id)            # 409 chat_busy if a message is under way
        try:
            turn = await store.turn(session, chat_id, provider, default=...)  # 409s
            # (or turn = await store.regenerate(session, chat_id, message_id): no message)
            run = ...  # a run of the agent with session=turn.scope, resume=turn.resume
            await store.record(session, chat_id, turn, run.id)
            await store.bind(session, chat_id, run.id)
        finally:
            store.release(session, chat_id)

    and reads it back with :meth:`latest_run` (the run to stream or cancel) and
    :meth:`messages` (the stored history, in the chat's provider's format).
    """

    def __init__(self, history: History, runs: RunStore, *, max_messages: int) -> None:
        self.history = history
        self.max_messages = max_messages
        self._runs = runs  # the pointers: scope -> latest run id
        self._pending: set[str] = set()

    @staticmethod
    def scope(session: str, chat_id: str) -> str:
        """The history store key of a session's chat (the session only as a digest)."""
        digest = hashlib.sha256(session.encode()).hexdigest()[:24]
        return f"chat-{digest}-{chat_id}"

    def claim(self, session: str, chat_id: str, *, running: bool = False) -> None:
        """Mark a message of the chat as under way (until :meth:`release`); 409
        ``chat_busy`` when one is already (or ``running``: the caller sees its run going)."""
        scope = self.scope(session, chat_id)
        if running or scope in self._pending:
            raise HTTPError(409, "chat_busy", "this chat's last message is still being answered")
        self._pending.add(scope)

    def release(self, session: str, chat_id: str) -> None:
        """End a :meth:`claim`."""
        self._pending.discard(self.scope(session, chat_id))

    async def turn(
        self, session: str, chat_id: str, provider: str | None, *, default: str
    ) -> ChatTurn:
        """The next turn of the chat for ``provider`` (None: the chat's own, or ``default``
        for a new chat). Raises :class:`HTTPError` 409 ``chat_provider_mismatch`` for another
        provider than the chat's, 409 ``chat_too_long`` at ``max_messages``."""
        scope = self.scope(session, chat_id)
        meta = await self._meta(scope)
        stored = await self.history.load(meta.scope)
        own = meta.provider
        if own is not None and provider is not None and provider != own:
            raise HTTPError(
                409,
                "chat_provider_mismatch",
                f"this chat speaks {own}; start a new chat for {provider}",
            )
        chosen = own or provider or default
        if len(stored) >= self.max_messages:
            raise HTTPError(
                409,
                "chat_too_long",
                f"this chat has {len(stored)} messages (at most {self.max_messages}); "
                "start a new chat",
            )
        if own is None:
            await self._append_meta(scope, {"provider": chosen}, at=0)
        length = meta.length if own is not None else 1
        return ChatTurn(meta.scope, bool(stored), chosen, at=len(stored), meta=length)

    async def regenerate(self, session: str, chat_id: str, message_id: str | None) -> ChatTurn:
        """The turn that answers the chat's last user message again: its last answer dropped
        from the server's history (a new branch holding the history up to and including that
        message; see the module docstring). ``message_id``: the answer the client
        regenerates (``msg-<run id>``, as the stream's ``start`` named it; None: the last).
        Raises :class:`HTTPError` 409 ``nothing_to_regenerate`` for a chat with no message
        (or one from before turns were recorded), 409 ``not_the_last_answer`` for another
        answer than the last (only the last can be regenerated)."""
        scope = self.scope(session, chat_id)
        meta = await self._meta(scope)
        if meta.provider is None or not meta.turns:
            raise HTTPError(409, "nothing_to_regenerate", "this chat has no answer to regenerate")
        at, run_id = meta.turns[-1]
        if message_id is not None and message_id != f"msg-{run_id}":
            raise HTTPError(
                409, "not_the_last_answer", "only the chat's last answer can be regenerated"
            )
        stored = await self.history.load(meta.scope)
        if len(stored) <= at:
            raise HTTPError(409, "nothing_to_regenerate", "this chat has no answer to regenerate")
        branch = secrets.token_hex(8)
        try:
            await self.history.append(f"{scope}/{branch}", stored[: at + 1], at=0)
        except HistoryConflict:
            raise HTTPError(409, "chat_busy", "this chat changed meanwhile") from None
        await self._append_meta(scope, {"branch": branch, "keep": at}, at=meta.length)
        return ChatTurn(f"{scope}/{branch}", True, meta.provider, at=at, meta=meta.length + 1)

    async def record(self, session: str, chat_id: str, turn: ChatTurn, run_id: str) -> None:
        """Record ``run_id`` as the run answering ``turn`` (what :meth:`regenerate` reads);
        409 ``chat_busy`` when another process wrote the chat's meta meanwhile."""
        entry = {"turn": turn.at, "run": run_id}
        await self._append_meta(self.scope(session, chat_id), entry, at=turn.meta)

    async def _meta(self, scope: str) -> _Meta:
        return _read_meta(scope, await self.history.load(f"{scope}/meta"))

    async def _append_meta(self, scope: str, entry: dict[str, Any], *, at: int) -> None:
        try:
            await self.history.append(f"{scope}/meta", [entry], at=at)
        except HistoryConflict:  # (another process wrote the chat at the same moment)
            raise HTTPError(409, "chat_busy", "this chat changed meanwhile") from None

    async def provider(self, session: str, chat_id: str) -> str | None:
        """The chat's provider (None for a chat never begun)."""
        return (await self._meta(self.scope(session, chat_id))).provider

    async def messages(self, session: str, chat_id: str) -> list[dict[str, Any]]:
        """The chat's stored history (its branch's; the provider's format; empty for an
        unknown chat)."""
        return await self.history.load((await self._meta(self.scope(session, chat_id))).scope)

    async def bind(self, session: str, chat_id: str, run_id: str) -> None:
        """Record ``run_id`` as the chat's latest run (in the run store; 503
        :class:`HTTPError` when it is unreachable)."""
        try:
            await self._runs.point("chat", self.scope(session, chat_id), run_id)
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None

    async def latest_run(self, session: str, chat_id: str) -> str | None:
        """The id of the chat's latest run (None: none kept; 503 :class:`HTTPError` when
        the run store is unreachable)."""
        try:
            return await self._runs.pointed("chat", self.scope(session, chat_id))
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None
