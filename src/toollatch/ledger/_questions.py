"""Pending questions: a committed call waiting for a person or a client (internal).

Theory of operation. A call whose tool needs approval (or a client tool's call) is *asked*
once it commits: one :class:`Question` per call id per scope, keyed like the ledger's
records (:class:`LedgerKey`), holding the tool name, the SHA-256 of the committed arguments
(:func:`digest_of`, the ledger's own digest) and when it expires. It is *answered* exactly
once (approved, denied, a client's result, expired, or cancelled with its run); every later
answer is refused (:class:`AlreadyAnswered`), and so is one naming other arguments
(:class:`StaleArguments`) or a call never asked (:class:`NotAsked`). The rules are the pure
functions here; each backend (memory, SQLite, Redis) only applies them in one atomic step,
so a question survives the process that asked it, and two workers never both answer it.

The arguments themselves are not stored (they may hold secrets the ledger's redaction is
there to keep out): a resumed run meets the call again in the model's answer, and its
digest finds the question.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

from ..core._errors import UsageError
from ._records import LedgerError, LedgerKey

QuestionKind: TypeAlias = Literal["approval", "client"]
"""What a call waits for: a person's ``approval``, or a ``client``'s result."""
Decision: TypeAlias = Literal["approved", "denied", "result", "expired", "cancelled"]
"""How a question was answered; ``result`` is a client tool's result."""

T = TypeVar("T")


class ApprovalError(UsageError):
    """An answer to a waiting call was refused; the call keeps waiting (or its answer
    stands). Subclasses say why."""


class NotAsked(ApprovalError):
    """No question of that call id is pending here (never asked, or unknown)."""


class AlreadyAnswered(ApprovalError):
    """The call was answered already (approved, denied, expired...): answers are final."""


class StaleArguments(ApprovalError):
    """The answer names arguments (their SHA-256) other than the ones the call committed
    with: an approval is bound to exactly the committed arguments."""


class WrongKind(ApprovalError):
    """A result submitted for a call that waits for an approval (a server tool's), or an
    approval for a client tool's call, which waits for its result."""


class EditRejected(ApprovalError):
    """Edited arguments did not pass the gate (strict parse, size, schema, policy); the call
    keeps waiting with its own. ``code`` is the gate's stable error code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        """The gate's error code (``schema_violation``, ``policy_denied``...)."""
        self.detail = detail
        """The gate's reason."""


class OtherSession(ApprovalError):
    """The call is pending in another session (conversation), not in the one answering."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Question:
    """A committed call waiting for an answer, as the ledger stores it."""

    key: LedgerKey
    """The call (its id and its scope, the run or session)."""
    kind: QuestionKind
    name: str
    """The tool name."""
    digest: str
    """SHA-256 (hex) of the tool name and canonical arguments (:func:`digest_of`)."""
    asked_at: float
    """Unix time it was first asked."""
    expires_at: float | None
    """Unix time after which it is answered ``expired`` (None: never)."""
    decision: Decision | None = None
    """None while pending."""
    reason: str | None = None
    """A denial's reason."""
    value: str | None = None
    """A client's result (text), or the edited arguments (JSON text) of an approval."""
    answered_at: float | None = None

    @property
    def pending(self) -> bool:
        """True until it is answered."""
        return self.decision is None


@runtime_checkable
class QuestionStore(Protocol):
    """Where questions live (every built-in ledger is one); atomic across workers."""

    async def ask(self, question: Question) -> Question:
        """Store ``question`` unless its call was asked before; the stored one either way
        (``StaleArguments`` when that one holds another digest)."""
        ...

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
        """Answer the pending question of ``key``; the answered question. ``NotAsked``,
        ``AlreadyAnswered`` or ``StaleArguments`` (``digest`` is not the question's) and
        nothing changes."""
        ...

    async def question(self, key: LedgerKey) -> Question | None:
        """The question of ``key``, answered or not; None when never asked."""
        ...

    async def questions(self, scope: str) -> list[Question]:
        """Every question of ``scope`` (pending and answered), oldest first."""
        ...


@runtime_checkable
class PendingQuestions(Protocol):
    """A :class:`QuestionStore` that can list what waits in every scope (every built-in
    ledger): how a restarted relay finds the runs to resume."""

    async def pending_questions(self, limit: int) -> list[Question]:
        """The unanswered questions of every scope, oldest first, at most ``limit``."""
        ...


QuestionStep = Callable[["Question | None"], "tuple[T, Question | None]"]
"""A rule applied atomically to a key's question: outcome, and the question to write."""


def asked(prior: Question | None, question: Question) -> tuple[Question, Question | None]:
    """The rule of :meth:`QuestionStore.ask`."""
    if prior is None:
        return question, question
    if prior.digest != question.digest:
        raise StaleArguments(
            f"call {question.key.call_id!r} was asked with other arguments (sha256 "
            f"{prior.digest[:12]}…, now {question.digest[:12]}…)"
        )
    return prior, None


def answered(
    prior: Question | None,
    key: LedgerKey,
    *,
    digest: str,
    decision: Decision,
    now: float,
    reason: str | None,
    value: str | None,
) -> tuple[Question, Question]:
    """The rule of :meth:`QuestionStore.answer`."""
    if prior is None:
        raise NotAsked(f"call {key.call_id!r} waits for no answer in {key.scope!r}")
    if prior.decision is not None:
        raise AlreadyAnswered(f"call {key.call_id!r} was already answered: {prior.decision}")
    if not hmac.compare_digest(prior.digest, digest):
        raise StaleArguments(
            f"call {key.call_id!r}: the answer names other arguments than the committed ones "
            f"(sha256 {digest[:12]}…, committed {prior.digest[:12]}…)"
        )
    new = replace(prior, decision=decision, reason=reason, value=value, answered_at=now)
    return new, new


class QuestionRules:
    """:class:`QuestionStore`'s ``ask`` and ``answer`` over a backend's ``_apply_question``
    (one atomic read-decide-write of a key's question)."""

    async def _apply_question(self, key: LedgerKey, step: QuestionStep[T]) -> T:
        raise NotImplementedError  # pragma: no cover - every backend has its own

    async def ask(self, question: Question) -> Question:
        """See :meth:`QuestionStore.ask`."""
        return await self._apply_question(question.key, lambda prior: asked(prior, question))

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
        """See :meth:`QuestionStore.answer`."""
        return await self._apply_question(
            key,
            lambda prior: answered(
                prior, key, digest=digest, decision=decision, now=now, reason=reason, value=value
            ),
        )


def question_to_json(q: Question) -> str:
    """A stored question as JSON text (its key is the store's)."""
    data = {
        "kind": q.kind, "name": q.name, "digest": q.digest, "asked_at": q.asked_at,
        "expires_at": q.expires_at, "decision": q.decision, "reason": q.reason,
        "value": q.value, "answered_at": q.answered_at,
    }  # fmt: skip
    return json.dumps(data, separators=(",", ":"))


def question_from_json(key: LedgerKey, text: str | bytes) -> Question:
    """The inverse of :func:`question_to_json`; ``LedgerError`` for a corrupt record."""
    try:
        data: dict[str, Any] = json.loads(text)
        kind, decision = data["kind"], data.get("decision")
        if kind not in ("approval", "client") or decision not in (
            None, "approved", "denied", "result", "expired", "cancelled",
        ):  # fmt: skip
            raise ValueError(f"kind {kind!r}, decision {decision!r}")
        return Question(
            key=key, kind=kind, name=str(data["name"]), digest=str(data["digest"]),
            asked_at=float(data["asked_at"]), expires_at=_float(data.get("expires_at")),
            decision=decision, reason=_str(data.get("reason")), value=_str(data.get("value")),
            answered_at=_float(data.get("answered_at")),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"the question of {key.call_id!r} is corrupt: {exc}") from exc


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _str(value: object) -> str | None:
    return None if value is None else str(value)


# -- signed approval tokens ------------------------------------------------------------------


def approval_token(secret: bytes, name: str, call_id: str, digest: str) -> str:
    """An HMAC-SHA256 (hex) over the tool ``name``, the ``call_id`` and the arguments'
    ``digest`` with a server ``secret``: what a server sends a browser with an approval
    question, so that the approval it posts back names exactly that call with exactly those
    arguments (the AI SDK signs name + id + input the same way). It is a check that the
    answer is about what was asked, not an authentication: the session still decides who
    may answer. ``UsageError`` for a secret shorter than 16 bytes."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise UsageError("the approval secret must be at least 16 bytes")
    message = json.dumps([name, call_id, digest], separators=(",", ":")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_approval_token(secret: bytes, token: str, name: str, call_id: str, digest: str) -> bool:
    """Whether ``token`` is :func:`approval_token` of these values (constant-time)."""
    if not isinstance(token, str):
        return False
    return hmac.compare_digest(approval_token(secret, name, call_id, digest), token)
