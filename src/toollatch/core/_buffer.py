"""One call's append-only, bounded argument buffer (internal; mutated only by the assembler)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import ErrorCode
from ._events import CallKey, DecodedArguments
from ._gate import CommittedCall
from ._state import CallState, Trigger, advance

if TYPE_CHECKING:
    from ._preview import PreviewTracker

JOIN_BYTES = 16 * 1024
"""Argument bytes between two joins of a call's fragments (see :meth:`CallBuffer.compact`)."""


class CallBuffer:
    """Identity, fragments and state of one call while its round is open."""

    __slots__ = (
        "bound",
        "call_id",
        "chunks",
        "committed",
        "decoded",
        "detail",
        "early",
        "error",
        "fragments",
        "held",
        "join_at",
        "key",
        "name",
        "nbytes",
        "position",
        "quiet",
        "state",
        "tracker",
        "whole",
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
        the nearer of the byte limit and ``join_at`` for an OPEN call without previews, and
        also the last byte count before the next update for one whose tracker holds no text
        (``none`` mode, or its parser failed: it only counts), set by the assembler; -1 (no
        fragment fits) otherwise, and from the moment the call leaves OPEN (``_move`` resets
        it)."""
        self.quiet = -1
        """With previews on, the same for a fragment without ``"`` (in a run, also one whose
        every ``"`` is escaped: see ``Assembler._run``), which the fast path also hands to the
        call's tracker as held text: the nearest of the byte limit, the next join and the last
        byte count below the tracker's ``quiet_below``, for an OPEN call with a tracker (set by
        the assembler after each step of the tracker); -1 otherwise."""
        self.join_at = JOIN_BYTES
        """Byte count from which the next fragment joins the recent ones (see ``compact``)."""
        self.chunks = 0
        """How many leading ``fragments`` are already joined runs of fragments."""
        self.state = CallState.OPEN
        self.error: ErrorCode | None = None
        self.detail = ""
        self.committed: CommittedCall | None = None
        self.early = False
        """True once the call was committed before its round ended (eager start)."""
        self.whole = False
        """True once the call got its whole argument text in one piece (``ArgsDelta.whole``):
        no other fragment may follow."""
        self.tracker: PreviewTracker | None = None
        """The call's preview tracker while previews are owed (set and cleared by the
        assembler, which also keeps them by key)."""
        self.decoded: tuple[DecodedArguments, str] | None = None
        """The value the call's text was given with (``ArgsDelta.decoded``) and that text;
        it stands for the call's text only while the text is still exactly that one."""
        self.held: list[str] = []
        """While ``quiet`` >= 0: the tracker's :attr:`~PreviewTracker.held` list, where the
        fast path appends a quiet fragment (set with ``quiet``; unused otherwise)."""

    def text(self) -> str:
        """The argument text so far, joined (and kept joined)."""
        if len(self.fragments) != 1:
            self.fragments = ["".join(self.fragments)]
            self.chunks = 1
        return self.fragments[0]

    def open_bound(self, limit: int) -> None:
        """Let the fast path append up to the nearer of ``limit`` and the next join (the
        assembler calls this for an OPEN call without previews)."""
        self.bound = min(limit, self.join_at)

    def compact(self) -> None:
        """Join the fragments that came after the last joined run into one string, and set
        the next join ``JOIN_BYTES`` further: a long call keeps a few large strings instead of
        one small object per fragment (89,000 of them, 5 MiB, for 1 MiB of arguments), and
        each byte is copied once more in all."""
        fragments, start = self.fragments, self.chunks
        if len(fragments) - start > 1:
            fragments[start:] = ["".join(fragments[start:])]
        self.chunks = len(fragments)
        self.join_at = self.nbytes + JOIN_BYTES

    def close(self) -> None:
        """The protocol announced the end of the arguments."""
        self._move(Trigger.CLOSE)

    def fail(self, code: ErrorCode, detail: str) -> bool:
        """Fail the call; False (nothing changed) for a call already failed or cancelled."""
        if not self._move(Trigger.FAIL):
            return False
        self.error, self.detail = code, detail
        return True

    def cancel(self, detail: str) -> None:
        """Cancel an undecided call (a no-op once it failed or was cancelled)."""
        if self._move(Trigger.CANCEL):
            self.error, self.detail = ErrorCode.CANCELLED, detail

    def commit(self, call: CommittedCall) -> None:
        """The gate accepted the call."""
        self._move(Trigger.ACCEPT)
        self.committed = call

    def _move(self, trigger: Trigger) -> bool:
        """Every state change (False for one of the table's no-ops): no transition leads back
        to OPEN, so the fast path's bound closes for good."""
        state = advance(self.state, trigger)
        if state is self.state:
            return False
        self.state = state
        self.bound = self.quiet = -1
        return True
