"""How ``toollatch replay`` shows a replayed file: the ``--format json`` object (a stable
contract: exactly the keys ``file, provider, ended, stop_reason, text, calls, anomalies,
error_results``, and ``choices`` / ``previews`` when there are several choices or
``--previews``; extensions only ever add keys) and the lines for people."""

from __future__ import annotations

from typing import Any

from ..core._events import AnomalyKind, CallKey
from ..core._messages import error_results
from ..core._preview import PreviewUpdated
from ..core._round import CallRecord, Round
from ._output import json_text


def round_json(name: str, round_: Round) -> dict[str, Any]:
    """The ``--format json`` object of one replayed file."""
    sent = _stream_ids(round_)
    out: dict[str, Any] = {
        "file": name,
        "provider": round_.provider,
        "ended": round_.ended.value,
        "stop_reason": round_.stop_reason,
        "text": round_.text,
        "calls": [_call_json(c, sent) for c in round_.calls],
        "anomalies": [{"kind": a.kind.value, "detail": a.detail} for a in round_.anomalies],
        "error_results": [r.as_dict() for r in error_results(round_)],
    }
    if len(round_.choices) > 1:
        out["choices"] = [
            {
                "index": c.index,
                "ended": c.ended.value,
                "stop_reason": c.stop_reason,
                "text": c.text,
                "calls": [_call_json(x, sent) for x in c.calls],
            }
            for c in round_.choices
        ]
    return out


def _stream_ids(round_: Round) -> frozenset[CallKey]:
    """Keys of the calls whose id the stream carried: the provider's, or one its adapter made
    up (and said so). The replay contract prints ``null`` for the others' ids."""
    made_up_by_adapter = {
        a.key for a in round_.anomalies if a.kind is AnomalyKind.SYNTHESIZED_ID and a.key
    }
    return frozenset(
        c.key
        for choice in round_.choices
        for c in choice.calls
        if not c.id_made_up or c.key in made_up_by_adapter
    )


def _call_json(call: CallRecord, sent: frozenset[CallKey]) -> dict[str, Any]:
    return {
        "id": call.call_id if call.key in sent else None,
        "name": call.name,
        "state": call.state.value,
        "arguments": dict(call.arguments) if call.arguments is not None else None,
        "error": call.error.value if call.error else None,
    }


def round_text(name: str, round_: Round) -> str:
    """The human-readable summary of one replayed file."""
    reason = f" ({round_.stop_reason})" if round_.stop_reason else ""
    lines = [f"{name}: {round_.provider}, ended {round_.ended.value}{reason}"]
    sent = _stream_ids(round_)
    if round_.error:
        lines.append(f"  stream error: {round_.error}")
    if round_.text:
        text = " ".join(round_.text.split())
        lines.append(f"  text: {text[:200]}{'…' if len(text) > 200 else ''}")
    for choice in round_.choices:
        prefix = f"  choice {choice.index}: " if len(round_.choices) > 1 else "  "
        if not choice.calls:
            lines.append(f"{prefix}no tool calls")
        for call in choice.calls:
            lines.append(prefix + _call_line(call, sent))
    for anomaly in round_.anomalies:
        lines.append(f"  anomaly {anomaly.kind.value}: {anomaly.detail}")
    return "\n".join(lines) + "\n"


def _call_line(call: CallRecord, sent: frozenset[CallKey]) -> str:
    shown = call.call_id if call.key in sent else "no id"
    head = f"[{call.position}] {call.name or '<no name>'} ({shown})"
    if call.arguments is not None:
        args = json_text(dict(call.arguments))
        args = args if len(args) <= 160 else args[:159] + "…"
        return f"{head} COMMITTED {args}"
    return f"{head} {call.state.value.upper()} {call.error}: {call.detail}"


def preview_json(preview: PreviewUpdated) -> dict[str, Any]:
    """One preview update as JSON (``--previews --format json``)."""
    return {
        "call": preview.key.part,
        "id": preview.call_id,
        "name": preview.name,
        "bytes": preview.bytes_so_far,
        "deltas": [[d.path, d.op, d.value] for d in preview.deltas],
        "provisional": sorted(preview.provisional),
        "final": preview.final,
        "error": preview.error,
    }


def preview_text(preview: PreviewUpdated) -> str:
    """One preview update as a line for people."""
    parts = []
    for d in preview.deltas:
        shown = json_text(d.value) if d.op != "end" else ""
        shown = shown if len(shown) <= 40 else shown[:39] + "…"
        parts.append(f"{d.path or '/'} {'+' if d.op == 'append' else d.op} {shown}".rstrip())
    state = " final" if preview.final else ""
    error = f" (preview stopped: {preview.error})" if preview.error else ""
    body = "; ".join(parts) if parts else "…"
    return f"  preview {preview.name or '?'} {preview.bytes_so_far} B{state}{error}: {body}"
