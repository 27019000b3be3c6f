"""One call's append-only, bounded argument buffer (internal; mutated only by the assembler)."""

from __future__ import annotations

from ._errors import ErrorCode
from ._events import CallKey
from ._gate import CommittedCall
from ._state import CallState, Trigger, advance


class CallBuffer:
    """Identity, fragments and state of one call while its round is open."""

    __slots__ = (
        "bound",
        "call_id",
        "chunks",
        "committed",
        "detail",
        "error",
        "fragments",
        "join_at",
        "key",
        "name",
        "nbytes",
        "position",
        "state",
    )

    def __init__(self, key: CallKey, position: int, call_id: str | None, name: str | None) -> None:
        self.key = key
        self.position = position
        self.call_id = call_id
        self.name = name
        self.fragments: list[str] = []
        self.nbytes = 0
        self.bound = -1
        """The assembler's fast path appends a fragment while ``nbytes`` stays within this:
        the nearer of the byte limit and ``join_at`` for an OPEN call without previews, set
        by the assembler; -1 (no fragment fits) otherwise, and from the moment the call
        leaves OPEN (every transition below resets it)."""
        self.join_at = 0
        """Byte count from which the next fragment joins the recent ones (see ``compact``)."""
        self.chunks = 0
        """How many leading ``fragments`` are already joined runs of fragments."""
        self.state = CallState.OPEN
        self.error: ErrorCode | None = None
        self.detail = ""
        self.committed: CommittedCall | None = None

    def text(self) -> str:
        """The argument text so far, joined (and kept joined)."""
        if len(self.fragments) != 1:
            self.fragments = ["".join(self.fragments)]
            self.chunks = 1
        return self.fragments[0]

    def compact(self) -> None:
        """Join the fragments that came after the last joined run into one string."""
        fragments, start = self.fragments, self.chunks
        if len(fragments) - start > 1:
            fragments[start:] = ["".join(fragments[start:])]
        self.chunks = len(fragments)

    def close(self) -> None:
        """The protocol announced the end of the arguments."""
        self.state = advance(self.state, Trigger.CLOSE)
        self.bound = -1

    def fail(self, code: ErrorCode, detail: str) -> None:
        """Fail the call (no-op for a call that already failed or was cancelled)."""
        if self.state in (CallState.FAILED, CallState.CANCELLED):
            return
        self.state = advance(self.state, Trigger.FAIL)
        self.bound = -1
        self.error, self.detail = code, detail

    def cancel(self, detail: str) -> None:
        """Cancel an unfinished call (no-op once failed, cancelled or done)."""
        if self.state in (CallState.FAILED, CallState.CANCELLED, CallState.DONE):
            return
        self.state = advance(self.state, Trigger.CANCEL)
        self.bound = -1
        self.error, self.detail = ErrorCode.CANCELLED, detail
        self.committed = None

    def commit(self, call: CommittedCall) -> None:
        """The gate accepted the call."""
        self.state = advance(self.state, Trigger.ACCEPT)
        self.bound = -1
        self.committed = call
