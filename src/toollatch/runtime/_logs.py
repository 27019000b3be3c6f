"""Redacted logs of the tool path (internal; public names in :mod:`toollatch.runtime`).

Stdlib logging only (no extra needed): one record per agent event with ids, tool names, error
codes and sizes; never argument values, text or error details, unless the preview policy
given to :class:`RedactedLog` shows a tool's arguments (``full``, or the ``fields`` it names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from ..core._preview import PreviewPolicy
from ..core._round import Round
from ._agent_events import (
    AgentEvent,
    CallCommittedEvent,
    CallFailedEvent,
    RunEndedEvent,
    TextEvent,
    ToolFinishedEvent,
)


def _size(arguments: Mapping[str, Any]) -> int:
    """UTF-8 bytes of the arguments as compact JSON (a size, never the values)."""
    return len(json.dumps(arguments, ensure_ascii=False, separators=(",", ":")).encode())


class RedactedLog:
    """One record per agent event on ``logger`` (default ``toollatch``), redacted (see the
    module docstring). Text chunks are logged at DEBUG with their size only."""

    def __init__(
        self, logger: logging.Logger | None = None, *, previews: PreviewPolicy | None = None
    ) -> None:
        self.logger = logger or logging.getLogger("toollatch")
        self.previews = previews

    def on_round_start(self, provider: str, round_no: int) -> None:
        """Log the round's request."""
        self._log(logging.INFO, "round_started", provider=provider, round=round_no)

    def on_notice(self, provider: str, notice: object) -> None:
        """Notices are not logged."""

    def on_round(self, provider: str, round_: Round) -> None:
        """Anomalies by kind (never their detail)."""
        for anomaly in round_.anomalies:
            self._log(logging.WARNING, "anomaly", provider=provider, kind=str(anomaly.kind))

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """The event's redacted fields."""
        if isinstance(event, TextEvent):
            self._log(logging.DEBUG, "text", provider=provider, chars=len(event.text))
            return
        fields: dict[str, Any] = {"provider": provider}
        data = event.to_json()
        for key in ("id", "name", "early", "error", "is_error", "round", "ended", "rounds"):
            if key in data:
                fields[key] = data[key]
        if isinstance(event, CallCommittedEvent):
            fields["argument_bytes"] = _size(event.arguments)
            shown = self._shown(event.name, event.arguments)
            if shown is not None:
                fields["arguments"] = shown
        if isinstance(event, RunEndedEvent):
            fields["calls"] = len(event.calls)
            fields["error"] = None if event.error is None else "model_error"
        failed = isinstance(event, CallFailedEvent) or (
            isinstance(event, ToolFinishedEvent) and event.is_error
        )
        self._log(logging.WARNING if failed else logging.INFO, event.type, **fields)

    def on_not_committed(self, provider: str, detail: str) -> None:
        """An error: a call that was not committed was about to run."""
        self._log(logging.ERROR, "rejected_not_committed", provider=provider)

    def _shown(self, name: str, arguments: Mapping[str, Any]) -> Any:
        if self.previews is None:
            return None
        rule = self.previews.rule(name)
        if rule.mode == "full":
            return dict(arguments)
        if rule.mode == "fields":
            found = {p: _pointer(arguments, p) for p in rule.fields}
            return {p: v for p, v in found.items() if v is not _MISSING}
        return None

    def _log(self, level: int, event: str, **fields: Any) -> None:
        if self.logger.isEnabledFor(level):
            text = " ".join(f"{k}={v}" for k, v in fields.items() if k != "arguments")
            self.logger.log(
                level, "%s %s", event, text, extra={"toollatch": {"event": event, **fields}}
            )


_MISSING = object()


def _pointer(document: Any, pointer: str) -> Any:
    """The value at RFC 6901 ``pointer`` in ``document``, or ``_MISSING``."""
    value = document
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message`` and the
    record's ``toollatch`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        data: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(getattr(record, "toollatch", {}))
        return json.dumps(data, ensure_ascii=False, default=str)


def configure_logging(format: str = "text", level: str = "INFO") -> logging.Handler:
    """Send the ``toollatch`` logger to standard error in ``format`` (``text``/``json``) at
    ``level`` (the ``logging`` section of the config); returns the handler added."""
    handler = logging.StreamHandler()
    if format == "json":
        handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("toollatch")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
