"""Calls that wait for a person or a client before they run (internal; used by the
dispatcher).

Theory of operation. After the gate commits a call, the dispatch round asks
:meth:`Approvals.kind_of` whether it may run at once. A client tool's call waits for the
client's result; a call whose tool says ``needs_approval`` (or that the
:class:`ApprovalPolicy` names, for tools declared elsewhere: MCP's) waits for a person,
unless its *approval session* was told to "always allow" that tool (below). Waiting
(:meth:`Approvals.wait`) stores a :class:`~toollatch.ledger.Question` first (in the ledger
when it keeps questions, so a restarted process finds it; else in memory), tells an
``approval_requested`` / ``client_call`` event, and waits for the answer or the question's
expiry. The answer
methods (:meth:`Approvals.answer`) write the answer to the store, where the first answer
wins atomically, then wake the waiting call; with a ledger, a waiting call also reads its
question every ``poll_s`` (1 s), so an answer another worker wrote reaches it. A call's
arguments never change while it waits: an approval names their SHA-256, which must be the
committed one.

"Always allow" (``approve(..., always=True)``) is a sticky decision kept in the ledger
(:class:`~toollatch.ledger.AlwaysStore`; without one, in memory), keyed by the approval
session (a run's session by default; the relay's browser session) and the tool name: every
later call of that tool in that session, in any run of it and any process sharing the
ledger, runs without a question until it is revoked. It covers the tool name in that
session only, never another session, and every call of the tool there, also those a
``needs_approval`` callable would ask about (the callable is the tool author's default; the
person's explicit, revocable choice for this session overrides it); a client tool's call
always waits for its result. A session holds at most ``ApprovalPolicy.max_always`` of them
(``TooManyAlways``). A call checks the store just before it would ask (one read; a read that
fails asks); a question asked before a restart and still pending is answered ``approved``
then, so the resumed run does not leave it waiting.

Time: ``expires_at`` is the injected ``clock`` (Unix time) plus ``timeout_s``; the wait
itself is an ``asyncio.timeout`` until then, so an expiry after a restart counts the time
the process was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ..core._errors import ConfigError, ErrorCode
from ..core._gate import CommittedCall, Gate, Rejection
from ..ledger import (
    AlreadyAnswered,
    AlwaysStore,
    Decision,
    EditRejected,
    LedgerError,
    LedgerKey,
    NotAsked,
    OtherSession,
    Question,
    QuestionKind,
    QuestionStore,
    StaleArguments,
    WrongKind,
    digest_of,
)
from ..ledger._open import open_ledger
from ..tools._tools import ApprovalContext, Tool
from ._agent_events import ApprovalRequestedEvent

Clock = Callable[[], float]
ALWAYS_REASON = "always allowed in this session"
"""The reason of a question asked before a restart that an always-allow answered."""
_log = logging.getLogger("toollatch.runtime")
MAX_ALWAYS = 10_000
"""The highest ``ApprovalPolicy.max_always`` (a session's decisions are listed whole)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalPolicy:
    """Which calls wait for a person, besides those of tools declared ``needs_approval``,
    and for how long: the configuration's ``approvals`` section.

    ``tools``: names of tools whose calls need approval (tools declared elsewhere, such as
    an MCP server's, need no code for it); ``default``: ``ask`` makes every other tool's
    calls need it too (``run``: only those named or declared); ``timeout_s``: how long a
    call waits for its answer before it is answered ``approval_expired`` (None: forever);
    ``max_always``: how many tools one session may "always allow" (``TooManyAlways`` past
    it). Raises ``ConfigError`` for a bad value.
    """

    tools: Collection[str] = ()
    default: Literal["run", "ask"] = "run"
    timeout_s: float | None = 300.0
    max_always: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.tools, str) or not all(isinstance(t, str) for t in self.tools):
            raise ConfigError("approvals.tools must be a list of tool names")
        object.__setattr__(self, "tools", frozenset(self.tools))
        if self.default not in ("run", "ask"):
            raise ConfigError(f"approvals.default must be 'run' or 'ask', got {self.default!r}")
        t = self.timeout_s
        if t is not None and not (
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and t > 0
        ):
            raise ConfigError(f"approvals.timeout_s must be a positive number, got {t!r}")
        m = self.max_always
        if not (isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= MAX_ALWAYS):
            raise ConfigError(f"approvals.max_always must be 1 to {MAX_ALWAYS}, got {m!r}")


@dataclass(slots=True, eq=False)
class _Waiting:
    question: Question
    call: CommittedCall
    gate: Gate
    answered: asyncio.Future[Question] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Approvals:
    """The questions of one dispatcher; see the module docstring."""

    def __init__(
        self,
        policy: ApprovalPolicy,
        store: object,
        clock: Clock,
        *,
        poll_s: float = 1.0,
        always: AlwaysStore | None = None,
    ) -> None:
        self.policy = policy
        self._store: QuestionStore | None = None
        self.poll_s: float | None = None
        """How often a waiting call reads its question from the ledger (an answer another
        process wrote); None (no ledger): only answers given in this process count."""
        # (``store is None`` first: a runtime protocol check costs microseconds, and an
        # agent made per conversation makes a dispatcher, so these per conversation)
        if store is not None and isinstance(store, QuestionStore):
            self._store, self.poll_s = store, poll_s
        self.clock = clock
        self._waiting: dict[tuple[str, str], _Waiting] = {}
        self._ledger = store
        self._always = always

    @property
    def store(self) -> QuestionStore:
        """Where the questions are kept: the ledger's, else an in-memory one, made on first
        use (an agent made per conversation makes a dispatcher, and most never ask)."""
        if self._store is None:
            self._store = _memory_questions()
        return self._store

    @property
    def always_store(self) -> AlwaysStore:
        """Where "always allow" decisions are kept: the one given, else the ledger's, else
        the in-memory question store's (made on first use, like :attr:`store`)."""
        if self._always is None:
            ledger = self._ledger
            if ledger is not None and isinstance(ledger, AlwaysStore):
                self._always = ledger
            else:
                store = self.store
                memory = store if isinstance(store, AlwaysStore) else open_ledger("memory:")
                self._always = cast(AlwaysStore, memory)
        return self._always

    # -- deciding ----------------------------------------------------------------------------

    def kind_of(
        self, tool: Tool[Any, Any], call: CommittedCall, session: str
    ) -> QuestionKind | None:
        """What ``call`` waits for before it runs (None: nothing, it runs now)."""
        if getattr(tool, "client", False):
            return "client"
        named = call.name in self.policy.tools or self.policy.default == "ask"
        decide = getattr(tool, "needs_approval", False)
        if decide is False and not named:
            return None  # (the common case first: no context is built for it)
        if named:
            return "approval"
        context = ApprovalContext(session=session, call_id=call.call_id, name=call.name)
        return "approval" if tool.asks(call.arguments, context) else None

    async def revoke(self, scope: str, name: str) -> bool:
        """Undo an "always allow" of ``name`` in approval session ``scope`` (calls asked
        already keep waiting); whether there was one. ``LedgerError`` when the store fails."""
        return await self.always_store.revoke_always(scope, name)

    async def always(self, scope: str) -> list[str]:
        """The tools approval session ``scope`` always allows, oldest first."""
        return await self.always_store.always(scope)

    async def _always_allows(self, scope: str, name: str) -> bool:
        try:
            return await self.always_store.always_allowed(scope, name)
        except LedgerError as exc:  # (the safe side: the call asks)
            _log.warning("the always-allow decisions could not be read (%s); asking", exc)
            return False

    def pending(self, session: str) -> list[Question]:
        """The questions of ``session`` waiting in this process, oldest first."""
        return [w.question for (s, _), w in self._waiting.items() if s == session]

    # -- waiting -----------------------------------------------------------------------------

    async def wait(
        self,
        session: str,
        call: CommittedCall,
        kind: QuestionKind,
        emit: Callable[[ApprovalRequestedEvent], None],
        gate: Gate,
        always: str | None = None,
        *,
        keep_on_cancel: bool = False,
    ) -> Question | None:
        """Ask ``call``'s question (or find it, asked before a restart) and return it
        answered; None when approval session ``always`` (default ``session``) always
        allows the tool and the call was never asked: it runs unasked. Raises
        ``StaleArguments`` when the id was asked with other arguments, ``LedgerError`` when
        the store fails; cancelled, it records ``cancelled``, unless ``keep_on_cancel``
        (a durable run's step, cancelled because its worker stops: the question stays
        pending for the survivor that goes on with the run). ``gate`` checks edited
        arguments an approval brings (:meth:`answer`)."""
        question = await self.ask(session, call, kind, always)
        if question is None or not question.pending:
            return question
        key = question.key
        waiting = self._waiting[session, call.call_id] = _Waiting(question, call, gate)
        try:
            emit(
                ApprovalRequestedEvent(
                    id=call.call_id, name=call.name, arguments=call.arguments,
                    args_sha256=question.digest, session=session,
                    expires_at=question.expires_at, kind=kind,
                )
            )  # fmt: skip
            return await self._answer_of(waiting)
        except asyncio.CancelledError:
            # best effort: a store that fails now must not turn the cancel into its error
            if not keep_on_cancel:
                with contextlib.suppress(Exception):
                    await self._closing(key, question.digest, "cancelled")
            raise
        finally:
            del self._waiting[session, call.call_id]

    async def ask(
        self, session: str, call: CommittedCall, kind: QuestionKind, always: str | None = None
    ) -> Question | None:
        """Store ``call``'s question (or find it, asked before), without waiting for its
        answer: the question, pending or answered; None when approval session ``always``
        (default ``session``) always allows the tool and the call was never asked (a
        pending question of it is answered ``approved`` then). Raises as :meth:`wait`."""
        key = LedgerKey(scope=session, call_id=call.call_id)
        digest = digest_of(call.name, call.arguments)
        if kind == "approval" and await self._always_allows(always or session, call.name):
            return await self._allowed(key, digest)
        now = self.clock()
        timeout = self.policy.timeout_s
        asked = Question(
            key=key, kind=kind, name=call.name, digest=digest,
            asked_at=now, expires_at=None if timeout is None else now + timeout,
        )  # fmt: skip
        return await self.store.ask(asked)

    async def _allowed(self, key: LedgerKey, digest: str) -> Question | None:
        """An always-allowed call: None (never asked), or its question asked before a
        restart, answered ``approved`` now if still pending (else its answer stands)."""
        found = await self.store.question(key)
        if found is None:
            return None
        if found.digest != digest:
            raise StaleArguments(f"call {key.call_id!r} was asked with other arguments")
        if not found.pending:
            return found
        try:
            return await self.store.answer(
                key, digest=digest, decision="approved", now=self.clock(), reason=ALWAYS_REASON
            )
        except AlreadyAnswered:  # (answered meanwhile: that answer stands)
            return await self.store.question(key)

    async def _answer_of(self, waiting: _Waiting) -> Question:
        """The answer: given here (the future), or written to the store by another process
        (read every ``poll_s``), or ``expired`` at the question's expiry."""
        expires = waiting.question.expires_at
        while True:
            left = None if expires is None else max(0.0, expires - self.clock())
            step = self.poll_s if left is None else left
            if self.poll_s is not None and left is not None:
                step = min(left, self.poll_s)
            try:
                async with asyncio.timeout(step):
                    return await asyncio.shield(waiting.answered)
            except TimeoutError:
                if left is not None and step is not None and step >= left:
                    question = waiting.question
                    return await self._closing(question.key, question.digest, "expired")
            try:
                found = await self.store.question(waiting.question.key)
            except LedgerError:  # a read that failed now: the call keeps waiting
                continue
            if found is not None and not found.pending:
                return found

    async def close(self, session: str, call_id: str, digest: str) -> None:
        """Answer ``call_id``'s question ``cancelled`` (its run was cancelled or ran out
        of time), unless it was answered; best effort: a store that fails is logged."""
        try:
            await self._closing(LedgerKey(scope=session, call_id=call_id), digest, "cancelled")
        except (LedgerError, NotAsked) as exc:
            _log.warning("question %s could not be closed: %s", call_id, exc)

    async def _closing(self, key: LedgerKey, digest: str, decision: Decision) -> Question:
        """Answer ``decision`` ourselves (expired, cancelled), or the answer that won."""
        try:
            answer = self.store.answer(key, digest=digest, decision=decision, now=self.clock())
            return await asyncio.shield(answer)
        except AlreadyAnswered:
            found = await self.store.question(key)
            assert found is not None  # answered, so stored
            return found

    # -- answering ---------------------------------------------------------------------------

    async def answer(
        self,
        session: str,
        call_id: str,
        *,
        kind: QuestionKind,
        decision: Decision,
        digest: str | None = None,
        reason: str | None = None,
        value: str | None = None,
        always: str | None = None,
    ) -> Question:
        """Answer ``call_id`` of ``session`` (see :class:`~toollatch.ledger.QuestionStore`
        for the refusals, plus ``OtherSession`` and ``WrongKind``); the answered question.
        ``digest`` None: the question's own (a denial or a client's result need not name
        the arguments). An approval's ``value`` is edited argument text: checked by the
        waiting call's gate first (``EditRejected``; the call keeps waiting), and by the
        gate of the round that runs it again (the call may be resumed elsewhere).
        ``always``: an approval also always allows the tool in that approval session
        (``TooManyAlways``, nothing answered, when it holds its cap; recorded before the
        answer, so the run's next call finds it, and taken back if the answer is refused)."""
        waiting = self._waiting.get((session, call_id))
        key = LedgerKey(scope=session, call_id=call_id)
        question = waiting.question if waiting is not None else await self.store.question(key)
        if question is None:
            if any(c == call_id for (_, c) in self._waiting):
                raise OtherSession(f"call {call_id!r} waits in another session, not {session!r}")
            raise NotAsked(f"call {call_id!r} waits for no answer in {session!r}")
        if question.kind != kind:
            raise WrongKind(_wrong_kind(call_id, question))
        if decision == "approved" and value is not None and waiting is not None:
            checked = regate(waiting.gate, waiting.call, value)
            if isinstance(checked, Rejection):
                raise EditRejected(str(checked.code), checked.detail)
        added = False
        if always is not None and decision == "approved":  # (first: the run's next call
            added = await self.always_store.allow_always(  # must find it)
                always, question.name, now=self.clock(), limit=self.policy.max_always
            )
        try:
            answered = await self.store.answer(
                key, digest=digest if digest is not None else question.digest,
                decision=decision, now=self.clock(), reason=reason, value=value,
            )  # fmt: skip
        except BaseException:
            if added:  # (a refused answer changes nothing)
                with contextlib.suppress(Exception):
                    await self.always_store.revoke_always(always or "", question.name)
            raise
        if waiting is not None and not waiting.answered.done():
            waiting.answered.set_result(answered)
        return answered


def regate(gate: Gate, call: CommittedCall, text: str) -> CommittedCall | Rejection:
    """``call`` with the edited argument ``text``, through the whole gate again: its size
    (``Limits.max_argument_bytes``, which the assembler checks for a model's text), then
    the strict parse, depth, schema and policy. The run's call budget is not spent again:
    the edited call replaces the one that spent it."""
    limit = gate.limits.max_argument_bytes
    if len(text.encode("utf-8", "surrogatepass")) > limit:
        return Rejection(ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES, f"more than {limit} bytes")
    return gate.check(
        key=call.key, position=call.position, call_id=call.call_id, name=call.name, text=text
    )


def _wrong_kind(call_id: str, question: Question) -> str:
    if question.kind == "client":
        return f"call {call_id!r} is a client tool's: it waits for a result, not an approval"
    return f"call {call_id!r} runs on the server ({question.name!r}): it takes no result"


def _memory_questions() -> QuestionStore:
    """The questions of a dispatcher whose ledger keeps none (or without a ledger)."""
    # the in-memory ledger keeps questions (tests/test_approvals*.py use it so); a cast, not
    # a runtime protocol check, which would cost as much as the rest of a dispatcher
    return cast(QuestionStore, open_ledger("memory:"))
