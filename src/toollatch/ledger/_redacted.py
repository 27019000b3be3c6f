"""Stores that keep what they are given redacted (internal; ``open_ledger`` / ``open_history``
with ``redactor=``, the configuration's ``ledger.redact``).

What toollatch stores holds the user's data: the run history keeps every tool call's
arguments and every result, the ledger every result (to give it again on a retry). With a
redactor, :class:`RedactedHistory` passes each message through it before it is appended,
and :class:`RedactedLedger` each result before it is finished, so the file never holds what
the redactor masks. The walk is the one tool results get (:mod:`toollatch.core._redact`, the
previews' pointer contract: every string and key of a JSON value with the pointer of its
place), with ``nested`` on: a string that is itself a JSON object or array (OpenAI's
``arguments``, a JSON result) is walked inside, its pointers continuing, and written again
compact only when something changed. A redactor that fails raises ``LedgerError`` and
nothing is stored (fail closed).

The price, which is why it is opt-in: what is stored is what comes back. A resumed run's
model reads the redacted history, and a retried call's stored result is the redacted one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..core._errors import UsageError
from ..core._preview import Redactor
from ..core._redact import RedactionFailed, redact_result, redact_value
from ..core._round import ToolResult
from ._always import AlwaysStore
from ._base import Ledger
from ._history import History
from ._questions import Decision, NotAsked, PendingQuestions, Question, QuestionStore
from ._records import LedgerError, LedgerKey, LedgerRecord


def _failed(what: str, exc: RedactionFailed) -> LedgerError:
    """Fail closed: nothing is stored unredacted (the cause names only a type)."""
    return LedgerError(f"the redactor failed on {what} ({exc}); it was not stored")


class RedactedHistory:
    """A :class:`History` whose messages pass ``redactor`` before ``history`` stores them."""

    def __init__(self, history: History, redactor: Redactor) -> None:
        self.inner = history
        self.redactor = redactor

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """See :meth:`History.append` (the messages stored redacted)."""
        try:
            shown = [redact_value(m, self.redactor) if isinstance(m, dict) else m for m in messages]
        except RedactionFailed as exc:
            raise _failed(f"run {run!r}'s messages", exc) from None
        return await self.inner.append(run, shown, at=at)

    async def load(self, run: str) -> list[dict[str, Any]]:
        """See :meth:`History.load`."""
        return await self.inner.load(run)

    async def delete(self, run: str, *, at: int) -> None:
        """The inner store's ``delete`` (``UsageError`` when it has none)."""
        delete = getattr(self.inner, "delete", None)
        if delete is None:
            raise UsageError("this history store keeps every history")
        await delete(run, at=at)

    async def aclose(self) -> None:
        """See :meth:`History.aclose`."""
        await self.inner.aclose()


class RedactedLedger:
    """A :class:`Ledger` whose results pass ``redactor`` before ``ledger`` stores them."""

    def __init__(self, ledger: Ledger, redactor: Redactor) -> None:
        self.inner = ledger
        self.redactor = redactor
        # what it does not change is the inner ledger's own methods (their signatures too)
        self.claim = ledger.claim
        self.start = ledger.start
        self.renew = ledger.renew
        self.release = ledger.release
        self.get = ledger.get
        self.aclose = ledger.aclose
        if isinstance(ledger, QuestionStore):  # its questions hold no arguments (see ._questions)
            self.ask = ledger.ask
            self.question = ledger.question
            self.questions = ledger.questions
            if isinstance(ledger, PendingQuestions):
                self.pending_questions = ledger.pending_questions
            self._answer = ledger.answer
        if isinstance(ledger, AlwaysStore):  # (tool names only: nothing to redact)
            self.allow_always = ledger.allow_always
            self.always_allowed = ledger.always_allowed
            self.always = ledger.always
            self.revoke_always = ledger.revoke_always

    async def answer(
        self,
        key: LedgerKey,
        *,
        digest: str,
        decision: Decision,
        now: float,
        reason: str | None = None,
        value: str | None = None,
    ) -> Question:
        """See :meth:`QuestionStore.answer` (a client's result stored redacted);
        ``NotAsked`` when the inner ledger keeps no questions."""
        if not hasattr(self, "_answer"):
            raise NotAsked("this ledger keeps no questions")
        if value is not None:
            try:
                value = redact_result(value, self.redactor, nested=True)
            except RedactionFailed as exc:
                raise _failed(f"the answer to {key.call_id!r}", exc) from None
        return await self._answer(
            key, digest=digest, decision=decision, now=now, reason=reason, value=value
        )

    def _shown(self, result: ToolResult) -> ToolResult:
        try:
            content = redact_result(result.content, self.redactor, nested=True)
        except RedactionFailed as exc:
            raise _failed(f"the result of {result.tool_call_id!r}", exc) from None
        return result if content == result.content else dataclasses.replace(result, content=content)

    async def finish(self, key: LedgerKey, token: int, result: ToolResult, *, now: float) -> None:
        """See :meth:`Ledger.finish` (the result stored redacted)."""
        await self.inner.finish(key, token, self._shown(result), now=now)

    async def settle_unknown(
        self, key: LedgerKey, token: int, result: ToolResult, *, now: float
    ) -> LedgerRecord:
        """See :meth:`Ledger.settle_unknown` (the result stored redacted)."""
        return await self.inner.settle_unknown(key, token, self._shown(result), now=now)
