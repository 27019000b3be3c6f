"""Answers to the calls a relay run waits on (internal; used by :mod:`._app` and the
protocols' endpoints).

Theory of operation. A run's call that needs a person (``approval_requested``) or a client
tool's call (``client_call``) reaches the run's log with its FULL committed arguments, its
``args_sha256`` and a ``token``: :func:`toollatch.ledger.approval_token` over the tool name,
the call id and that digest, keyed by the relay's secret. The run remembers what it asked
(:class:`Asked`). ``POST /runs/{id}/calls/{call_id}/approve|deny|result`` answers it: the
session must own the run (another session's run is 404 ``not_found``, as one that does not
exist), the call must be one the run asked (409 ``not_asked``), and the body's token must be
the one sent with the question (403 ``invalid_approval_token``). An approval's ``always``
makes later calls of that tool run without asking in every run of the browser session
(chats and AG-UI threads too), kept in the ledger under :func:`approval_scope` (the
session token's SHA-256, never the token), so a restarted relay keeps it; at most
``approvals.max_always`` tools per session (409 ``too_many_always``). ``GET
/session/approvals`` lists them (``{"always": [names]}``), ``DELETE
/session/approvals/{tool}`` revokes one (404 when it is not always allowed), as does
``POST /runs/{id}/tools/{name}/revoke`` (``{}``) while that run goes on. The token binds
the answer
to that call and those arguments; it authenticates nobody, the session does. The runtime's
refusals (:class:`toollatch.ledger.ApprovalError`) keep their meaning: 409
``already_answered`` / ``stale_arguments`` / ``wrong_kind`` / ``not_asked``, 403
``other_session``, 422 ``edit_rejected`` (the gate's code in the message), 409
``too_many_always``.

The secret: ``Relay(approval_secret=...)`` (``toollatch serve``: the environment variable
``relay.approval_secret_env`` names), else random per process: a question asked before a
restart is then asked again with a new token when its run is resumed (a restarted relay
resumes it by itself, :mod:`._restore`; the old token is refused), which is safe but means a
page must use the token of the newest event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..ledger import (
    AlreadyAnswered,
    AlwaysStore,
    ApprovalError,
    EditRejected,
    LedgerError,
    NotAsked,
    OtherSession,
    StaleArguments,
    TooManyAlways,
    WrongKind,
    approval_token,
    verify_approval_token,
)
from ..runtime._agent_run import AgentRun
from ._requests import HTTPError

ACTIONS = ("approve", "deny", "result")
ASKING = frozenset({"approval_requested", "client_call"})
MAX_REASON_CHARS = 2000
"""A denial's reason is what the model reads: bounded."""

_STATUS: tuple[tuple[type[ApprovalError], int, str], ...] = (
    (AlreadyAnswered, 409, "already_answered"),
    (StaleArguments, 409, "stale_arguments"),
    (WrongKind, 409, "wrong_kind"),
    (NotAsked, 409, "not_asked"),
    (OtherSession, 403, "other_session"),
    (EditRejected, 422, "edit_rejected"),
    (TooManyAlways, 409, "too_many_always"),
)
MAX_TOOL_NAME_CHARS = 256
"""A tool name in a session route's path (providers allow 64 or 128 characters)."""


def approval_scope(session_key: str) -> str:
    """The approval session (where "always allow" decisions live) of every run of the
    session whose token has the SHA-256 ``session_key``."""
    return f"relay-session-{session_key}"


def refusal(exc: ApprovalError) -> HTTPError:
    """The HTTP answer of a runtime refusal: a stable code per kind (409/403/422)."""
    for kind, status, code in _STATUS:
        if isinstance(exc, kind):
            return HTTPError(status, code, str(exc))
    return HTTPError(409, "approval_refused", str(exc))


@dataclass(slots=True)
class Asked:
    """A question a run's log carries: what an answer must name."""

    name: str
    args_sha256: str
    kind: str
    """``approval`` or ``client``."""
    token: str
    answered: bool = False


class AskingRun(Protocol):
    """What answering needs of a relay run (:class:`._runs.AskingRun`)."""

    id: str
    done: bool
    asked: dict[str, Asked]

    @property
    def agent_run(self) -> AgentRun | None: ...


def sign(secret: bytes, asked: dict[str, Asked], data: dict[str, Any]) -> None:
    """Remember a question event of a run's log (``data``: its JSON) in ``asked`` and give
    it its ``token``; mark an ``approval_answered`` one answered."""
    if data["type"] in ASKING:
        token = approval_token(secret, data["name"], data["id"], data["args_sha256"])
        kind = "client" if data["type"] == "client_call" else "approval"
        asked[data["id"]] = Asked(data["name"], data["args_sha256"], kind, token)
        data["token"] = token
    elif data["type"] == "approval_answered" and data["id"] in asked:
        asked[data["id"]].answered = True


def waiting(run: AskingRun, kind: str | None = None) -> dict[str, Asked]:
    """The calls ``run`` waits on (of ``kind`` only, when given), by call id."""
    return {
        call_id: a
        for call_id, a in run.asked.items()
        if not a.answered and (kind is None or a.kind == kind)
    }


async def answer(
    run: AskingRun, secret: bytes, call_id: str, action: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Check ``body`` (``{"token", "args"?, "always"?}`` / ``{"token", "reason"?}`` /
    ``{"token", "value"}``) against the question ``run`` asked and answer it; raises
    :class:`HTTPError`. What the answer was: ``{"id", "call_id", "answered"}``."""
    asked = run.asked.get(call_id)
    agent_run = run.agent_run
    if asked is None or agent_run is None:
        raise HTTPError(409, "not_asked", f"the run asked nothing about call {call_id!r}")
    allowed = {"approve": {"token", "args", "always"}, "deny": {"token", "reason"}}
    unknown = sorted(set(body) - allowed.get(action, {"token", "value"}))
    if unknown:
        raise HTTPError(422, "invalid_body", f"unknown fields: {', '.join(unknown)}")
    token = body.get("token")
    if not isinstance(token, str) or not verify_approval_token(
        secret, token, asked.name, call_id, asked.args_sha256
    ):
        raise HTTPError(403, "invalid_approval_token", "the token is not this question's")
    try:
        if action == "approve":
            args = body.get("args")
            always = body.get("always", False)
            if args is not None and not isinstance(args, dict | str):
                raise HTTPError(422, "invalid_body", "args must be an object or JSON text")
            if not isinstance(always, bool):
                raise HTTPError(422, "invalid_body", "always must be true or false")
            await agent_run.approve(
                call_id, args_sha256=asked.args_sha256, args=args, always=always
            )
        elif action == "deny":
            reason = body.get("reason", "denied")
            if not isinstance(reason, str) or not 0 < len(reason) <= MAX_REASON_CHARS:
                raise HTTPError(422, "invalid_body", f"reason: 1 to {MAX_REASON_CHARS} chars")
            await agent_run.deny(call_id, reason)
        else:
            if "value" not in body:
                raise HTTPError(422, "invalid_body", "a result needs its value")
            await agent_run.submit_result(call_id, body["value"])
    except ApprovalError as exc:
        raise refusal(exc) from None
    except LedgerError as exc:
        raise HTTPError(503, "ledger_unavailable", str(exc)) from None
    asked.answered = True
    return {"id": run.id, "call_id": call_id, "answered": action}


Reply = tuple[int, dict[str, Any]]
"""An answer's HTTP status and JSON body (sent back to another worker as it is)."""

Forward = Callable[[Request, dict[str, Any]], Awaitable[Reply | None]]
"""Hands an answer to the worker that owns the run (None: no worker has the run)."""


async def reply(
    run: AskingRun, secret: bytes, call_id: str, action: str, body: dict[str, Any]
) -> Reply:
    """:func:`answer` as the endpoint answers it (here, or on the run's owner for another
    worker): 202 and what was answered, or the refusal's status and error."""
    try:
        if run.done:
            raise HTTPError(409, "run_not_running", "the run is over; resume it first")
        return 202, await answer(run, secret, call_id, action, body)
    except HTTPError as exc:
        return exc.status, {"error": {"code": exc.code, "message": exc.message}}


def routes(
    owned: Callable[[Request], AskingRun | None],
    read_json: Callable[[Request], Awaitable[Any]],
    secret: Callable[[], bytes],
    forward: Forward | None = None,
) -> list[Route]:
    """``POST /runs/{run_id}/calls/{call_id}/{approve|deny|result}``: ``owned(request)`` is
    the run when the request's session owns it and it is this worker's; else
    ``forward(request, {"call_id", "action", "body"})`` hands it to the run's owner (None:
    no such run, 404)."""

    async def endpoint(request: Request) -> Response:
        action = request.path_params["action"]
        call_id = request.path_params["call_id"]
        try:
            if action not in ACTIONS:
                raise HTTPError(404, "not_found", "no such action")
            data = await read_json(request)
            if not isinstance(data, dict):
                raise HTTPError(422, "invalid_body", "the body must be a JSON object")
            run = owned(request)
            if run is not None:
                status, body = await reply(run, secret(), call_id, action, data)
                return JSONResponse(body, status_code=status)
            asked = {"call_id": call_id, "action": action, "body": data}
            replied = await forward(request, asked) if forward is not None else None
            if replied is None:
                raise HTTPError(404, "not_found", "no such run")
        except HTTPError as exc:
            return exc.response()
        return JSONResponse(replied[1], status_code=replied[0])

    async def revoke(request: Request) -> Response:
        """Undo an approval's ``always`` for the run's conversation: its calls ask again."""
        try:
            data = await read_json(request)
            if data != {}:
                raise HTTPError(422, "invalid_body", "the body must be {}")
            run = owned(request)
            if run is None:
                raise HTTPError(404, "not_found", "no such run")
            agent_run = run.agent_run
            if run.done or agent_run is None:
                raise HTTPError(409, "run_not_running", "the run is over")
            name = request.path_params["name"]
            await agent_run.revoke(name)
        except LedgerError as exc:
            return HTTPError(503, "ledger_unavailable", str(exc)).response()
        except HTTPError as exc:
            return exc.response()
        return JSONResponse({"id": run.id, "tool": name, "revoked": True}, status_code=202)

    return [
        Route("/runs/{run_id}/calls/{call_id}/{action}", endpoint, methods=["POST"]),
        Route("/runs/{run_id}/tools/{name}/revoke", revoke, methods=["POST"]),
    ]


def session_routes(
    session_key: Callable[[Request], str | None], store: Callable[[], AlwaysStore]
) -> list[Route]:
    """``GET /session/approvals`` and ``DELETE /session/approvals/{tool}``: the request's
    session's "always allow" decisions (``session_key(request)``: its token's SHA-256, None
    without a session: 404, as for anything of another session) in ``store()``."""

    def scope_of(request: Request) -> str:
        key = session_key(request)
        if key is None:
            raise HTTPError(404, "not_found", "no session")
        return approval_scope(key)

    async def listing(request: Request) -> Response:
        try:
            names = await store().always(scope_of(request))
        except LedgerError as exc:
            return HTTPError(503, "ledger_unavailable", str(exc)).response()
        except HTTPError as exc:
            return exc.response()
        return JSONResponse({"always": names}, headers={"cache-control": "no-store"})

    async def revoking(request: Request) -> Response:
        name = request.path_params["tool"]
        try:
            if not 0 < len(name) <= MAX_TOOL_NAME_CHARS:
                raise HTTPError(422, "invalid_tool", f"a tool name is 1 to {MAX_TOOL_NAME_CHARS}")
            if not await store().revoke_always(scope_of(request), name):
                raise HTTPError(404, "not_found", f"{name[:80]!r} is not always allowed here")
        except LedgerError as exc:
            return HTTPError(503, "ledger_unavailable", str(exc)).response()
        except HTTPError as exc:
            return exc.response()
        return JSONResponse({"tool": name, "revoked": True})

    return [
        Route("/session/approvals", listing, methods=["GET"]),
        Route("/session/approvals/{tool}", revoking, methods=["DELETE"]),
    ]
