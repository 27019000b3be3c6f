"""The relay's limits and its redaction of what reaches the browser (internal; public names
in :mod:`toollatch.relay`).

Nothing the model wrote as tool arguments reaches the browser unfiltered: previews are
redacted in the core by the relay's :class:`~toollatch.PreviewPolicy` (a ``fields`` rule
leaves out every other member, the redactor masks secret-looking strings), and the same rule
filters ``call_committed.arguments`` (:func:`shown_arguments`). ``run_ended.history`` (which
repeats every argument and result) is not sent: its key stays, empty, with
``history_omitted`` telling how many entries were left out.

A tool's result reaches the browser as ``tool_finished`` shows it (:func:`shown_result`):
its UI payload (``ToolOutcome.ui``) through the same redactor, bounded by
:attr:`RelayLimits.max_ui_bytes`; the short redacted preview of the model-facing text only
when the tool returned no UI payload or failed (:attr:`RelayLimits.result_text`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from ..core._errors import ConfigError
from ..core._preview import PreviewPolicy, ToolPreview
from ..core._secrets import redact_secrets as redact_secrets  # noqa: PLC0414 (re-exported)


def default_previews() -> PreviewPolicy:
    """Every value shown except secrets; ``write_file`` shows its ``path`` only (a file's
    content may hold anything)."""
    return PreviewPolicy(
        default=ToolPreview(mode="full"),
        tools={"write_file": ToolPreview(mode="fields", fields=("/path",))},
        redactor=redact_secrets,
        every_bytes=64,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayLimits:
    """The relay's bounds; each is enforced with a clear 4xx or a bounded store."""

    max_active_runs: int = 16
    """Runs in flight at once over all sessions; more get 429."""
    max_stored_runs: int = 256
    """Runs kept for resume; the oldest finished run is forgotten beyond it."""
    max_run_events: int = 20_000
    """Events stored per run; a run that reaches it is cancelled, and its text, previews and
    opened calls past it are dropped (the calls' results and ``run_ended`` still come)."""
    max_kept_bytes: int = 1 << 20
    """Bytes of SSE frames kept per run for readers and resumes (1 MiB, so at most
    ``max_stored_runs`` MiB in all); past it the oldest
    are forgotten, and a reader that had not read them gets an ``event: lagged`` naming the
    first id still kept (see :mod:`._runs`)."""
    max_body_bytes: int = 64 * 1024
    """Largest request body; more gets 413."""
    max_message_chars: int = 16_000
    """Longest user message; more gets 422."""
    heartbeat_s: float = 15.0
    """An SSE comment after this long without an event (keeps proxies from closing)."""
    sse_batch: int = 64
    """Stored events written per send at most (a reader far behind catches up in chunks)."""
    max_session_runs: int = 4
    """Runs in flight at once per session (under ``max_active_runs``); more get 429, so one
    session cannot take every slot."""
    max_session_readers: int = 8
    """Event streams (``GET /runs/{id}/events``) open at once per session; more get 429."""
    max_connections: int = 1000
    """Open connections at once (clamped below the process's open-file limit at start, see
    :func:`toollatch.relay._guard.connection_cap`). At the cap a new connection takes the
    place of the oldest one that is idle or still sending its request head; with none, it
    gets 503 and is closed."""
    max_header_bytes: int = 64 * 1024
    """Largest request head (request line and headers); more gets 431 and the connection
    is closed (checked per socket read: a pipelined request may pass it by one read)."""
    header_timeout_s: float = 10.0
    """Seconds a connection may take to send a request's head from its first byte (and a new
    connection to send its first request); then 408 and closed (slowloris)."""
    idle_timeout_s: float = 15.0
    """Seconds an idle keep-alive connection stays open between requests (uvicorn's
    ``timeout_keep_alive``). Longer than the clients' own pools keep an idle connection
    (httpx's, so the OpenAI SDK's, 5 s; Node's fetch, 4 s): a server that closes first races
    the client's next request, which then fails on a reset or is retried (seen at 5 s:
    ``benchmarks/README.md``, the proxy's keep-alive races)."""
    body_timeout_s: float = 30.0
    """Seconds a request body (``POST /runs``) may take to arrive; then 408."""
    max_chat_messages: int = 400
    """History entries a chat keeps (user turns, assistant entries, tool results): a message
    to a chat that has reached it is refused (409 ``chat_too_long``), see :mod:`._chats`."""
    max_chat_body_bytes: int = 1 << 20
    """Largest ``POST /api/chat`` body (1 MiB; ``useChat`` sends the whole conversation each
    time, of which the relay reads only the last user message); more gets 413."""
    max_ui_bytes: int = 64 * 1024
    """Largest UI payload (``ToolOutcome.ui``, as JSON, after redaction) sent to the browser
    in ``tool_finished.ui``; a larger one is left out, ``ui_omitted`` giving its size."""
    result_text: Literal["summary", "always", "never"] = "summary"
    """What of a result's model-facing text ``tool_finished.result`` carries (always a
    redacted preview of at most 200 characters): ``summary`` only when the tool returned no
    UI payload or the call failed, ``always`` every time, ``never`` not at all."""

    def __post_init__(self) -> None:
        for name in (
            "max_active_runs",
            "max_stored_runs",
            "max_run_events",
            "max_kept_bytes",
            "max_body_bytes",
            "max_message_chars",
            "sse_batch",
            "max_session_runs",
            "max_session_readers",
            "max_connections",
            "max_header_bytes",
            "max_chat_messages",
            "max_chat_body_bytes",
            "max_ui_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"RelayLimits.{name} must be a positive integer, got {value!r}")
        for name in ("heartbeat_s", "header_timeout_s", "idle_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                raise ConfigError(f"RelayLimits.{name} must be positive, got {value!r}")
        if self.result_text not in ("summary", "always", "never"):
            raise ConfigError(
                "RelayLimits.result_text must be summary, always or never, "
                f"got {self.result_text!r}"
            )
        if self.max_header_bytes < 1024:
            raise ConfigError("RelayLimits.max_header_bytes must be at least 1024")
        if self.max_stored_runs < self.max_active_runs:
            raise ConfigError("RelayLimits.max_stored_runs must be >= max_active_runs")


def shown_arguments(policy: PreviewPolicy, name: str, arguments: Mapping[str, Any]) -> Any:
    """``arguments`` as the browser may see them under ``policy``'s rule for ``name``: all
    (``full``), only the ``fields`` pointers' subtrees, or ``{}`` (``none``); every string
    passes the redactor."""
    rule = policy.rule(name)
    if rule.mode == "none":
        return {}
    if rule.mode == "full":
        return _redacted(policy, "", arguments)
    picked: dict[str, Any] = {}
    for pointer in rule.fields:
        _pick(arguments, picked, [_unescape(t) for t in pointer.split("/")[1:]])
    return _redacted(policy, "", picked)


def shown_result(policy: PreviewPolicy, limits: RelayLimits, data: dict[str, Any]) -> None:
    """Make a ``tool_finished`` event's JSON (``data``, with the tool's raw UI payload under
    ``"ui"`` when it returned one) what the browser may see, in place: ``ui`` through the
    policy's redactor, or ``ui_omitted`` (its JSON size) past ``max_ui_bytes``; ``result``
    (the redacted preview) kept or set to None per ``result_text``."""
    ui = data.pop("ui", None)
    if ui is not None:
        shown = _redacted(policy, "", ui)
        try:
            size = len(orjson.dumps(shown))
        except TypeError:  # (not JSON to orjson: shown as the relay's encoder would)
            size = len(json.dumps(shown, ensure_ascii=False, default=repr).encode())
        if size > limits.max_ui_bytes:
            data["ui_omitted"] = size
        else:
            data["ui"] = shown
    mode = limits.result_text
    if mode == "never" or (mode == "summary" and ui is not None and not data["is_error"]):
        data["result"] = None
        data.pop("result_chars", None)


def _pick(source: Any, target: dict[str, Any], tokens: list[str]) -> None:
    """Copy ``source``'s subtree at ``tokens`` into ``target`` (objects only, as paths go)."""
    key, rest = tokens[0], tokens[1:]
    if not isinstance(source, Mapping) or key not in source:
        return
    if not rest:
        target[key] = source[key]
    elif isinstance(source[key], Mapping):
        _pick(source[key], target.setdefault(key, {}), rest)


def _redacted(policy: PreviewPolicy, pointer: str, value: Any) -> Any:
    if policy.redactor is None:
        return value
    if isinstance(value, str):
        return policy.redactor(pointer, value)
    if isinstance(value, Mapping):
        return {k: _redacted(policy, f"{pointer}/{_escape(k)}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(policy, f"{pointer}/{i}", v) for i, v in enumerate(value)]
    return value


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")
