"""``toollatch proxy --calls stream``: a call's argument text reaches the client as it streams
(internal; the server is :mod:`._proxy`, the hold mode's chunks :mod:`._proxy_chunks`).

Theory of operation. For UIs that render a call's arguments while they stream. The parser
runs with ``observe_arguments=True``: the assembler announces every piece of text it appends
to a call's buffer (:class:`~toollatch.stages.ArgsReceived`), at the one place text enters a
buffer, so what this module forwards is the buffer itself, not the upstream's deltas. Whatever
the upstream's quirks, the fragments of one call concatenate to exactly the text the gate
checks: an id or name repeated on every delta is announced once; arguments sent whole as an
object are the one serialized text the adapter made of them; parallel calls under one reused
``index``, or without any, are distinct calls (the adapter's keys); interleaved fragments
reach their own call; a fragment the assembler refused (after an object sent whole, after the
call failed, over its byte limit) is never forwarded.

What the client sees: one ``index`` per call counting from 0 in each choice, in the order the
calls start; the call's first delta carries ``id``, ``type``, ``name`` and the text held so far,
sent once both the id and the name are known (text that arrives before is held, so an id-less
call of Ollama's starts only when the adapter makes its id up at the choice's end); then
string fragments as they come. A call the assembler failed before it started is never sent.
A ``multi_tool_use.parallel`` wrapper (Q19) is held: its inner calls, once committed at the
end, are sent whole like the hold mode's. At the end, the same verdicts as ``--calls hold``:
the last chunk's ``toollatch`` key lists every call that did not commit (its id, name, code),
and ``finish_reason`` is ``tool_calls`` only when a call committed.

The contract of this mode: a client may have seen fragments (and the head) of a call that is
refused at the end (invalid JSON, a schema violation, a truncated round, a dropped stream).
It must read the verdicts before it runs anything. ``--calls hold`` (the default) never sends
such a call.
"""

from __future__ import annotations

from typing import Any

from ..core._assembler import (
    ArgsReceived,
    CallAnnounced,
    CallFailed,
    CallReady,
    CallUpdate,
    TextReceived,
)
from ..core._events import CallKey
from ..core._wrapper import PARALLEL_WRAPPER
from ._proxy_chunks import ChatChunks


class _Live:
    """One call as the client knows it."""

    __slots__ = ("call_id", "dead", "held", "index", "name")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.name: str | None = None
        self.held: list[str] = []  # text appended before the call could start
        self.index: int | None = None  # the client's index, once started
        self.dead = False  # failed before it started: never sent


class LiveChunks(ChatChunks):
    """The chunks of one proxied streaming response in ``stream`` mode (see the module's
    doc). ``tools``: the request's tool names (a tool really called
    ``multi_tool_use.parallel`` is streamed like any other)."""

    def __init__(
        self, *, completion_id: str, model: str, created: int, tools: tuple[str, ...] = ()
    ) -> None:
        super().__init__(completion_id=completion_id, model=model, created=created)
        self._calls: dict[CallKey, _Live] = {}
        self._held_names = frozenset() if PARALLEL_WRAPPER in tools else {PARALLEL_WRAPPER}

    def notice(self, notice: CallUpdate) -> list[dict[str, Any]]:
        """The chunks a parser's notice makes (text, a call's head, a fragment)."""
        if isinstance(notice, ArgsReceived):
            live = self._calls.setdefault(notice.key, _Live())
            if live.index is None:
                live.held.append(notice.text)
                return []
            entry = {"index": live.index, "function": {"arguments": notice.text}}
            return [self._chunk(notice.key.choice, {"tool_calls": [entry]})]
        if isinstance(notice, TextReceived):
            return [self.text(notice.choice, notice.text)]
        if isinstance(notice, CallAnnounced):
            live = self._calls.setdefault(notice.key, _Live())
            live.call_id, live.name = notice.call_id, notice.name
            return self._start(notice.key, live)
        if isinstance(notice, CallFailed):
            live = self._calls.setdefault(notice.key, _Live())
            if live.index is None:
                live.dead, live.held = True, []
            return []
        if isinstance(notice, CallReady) and self._unsent(notice.call.key):
            return [self.call(notice.call)]  # (not started live: e.g. a held name)
        return []

    def _unsent(self, key: CallKey) -> bool:
        live = self._calls.get(key)
        return live is None or live.index is None

    def _start(self, key: CallKey, live: _Live) -> list[dict[str, Any]]:
        """The call's first delta, once its id and name are known (and it may be sent)."""
        if (
            live.index is not None
            or live.dead
            or not live.call_id
            or not live.name
            or live.name in self._held_names
        ):
            return []
        text, live.held = "".join(live.held), []
        chunk = self._opening(key, live.call_id, live.name, text)
        live.index = chunk["choices"][0]["delta"]["tool_calls"][0]["index"]
        return [chunk]
