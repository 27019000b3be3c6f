"""``toollatch`` command line: replay recorded streams through the commit gate.

``toollatch replay [options] FILE...`` feeds each file (``-`` = standard input) through the same
decoder, adapter, assembler and gate a live stream goes through and prints what would have been
committed. ``--format json`` is a stable contract other tools rely on: one JSON object per
file, one per line, with exactly the keys ``file, provider, ended, stop_reason, text, calls,
anomalies, error_results`` (extensions only ever add keys). Exit status: 0 when every file was
replayed (whatever its calls' states), 2 for a usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from ._errors import ConfigError, ToolLatchError, UsageError
from ._limits import Limits
from ._pipeline import StreamParser
from ._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from ._registry import Framing, detect, providers
from ._round import CallRecord, Round
from ._specs import ToolSpec, load_tools

_FRAMING_BY_SUFFIX: dict[str, Framing] = {
    ".sse": "sse",
    ".txt": "sse",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".eventstream": "eventstream",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"toollatch: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = _Parser(prog="toollatch", description="Commit-gated streamed tool calls.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    replay = sub.add_parser(
        "replay", help="replay recorded streams (.sse, .jsonl, .eventstream) through the gate"
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="recorded stream; - = stdin")
    replay.add_argument("--provider", default="auto", choices=("auto", *_all_providers()))
    replay.add_argument("--tools", metavar="FILE", help="JSON list of tool definitions")
    replay.add_argument("--format", default="text", choices=("text", "json"))
    replay.add_argument("--max-args-bytes", type=_positive, metavar="N")
    replay.add_argument("--max-calls", type=_positive, metavar="N")
    replay.add_argument("--max-depth", type=_positive, metavar="N")
    replay.add_argument(
        "--chunk-bytes",
        type=_positive,
        metavar="N",
        help="feed the input in N-byte pieces (reproduces network splits)",
    )
    replay.add_argument(
        "--previews", action="store_true", help="also show the preview timeline of each call"
    )
    replay.add_argument(
        "--preview-mode",
        choices=("none", "fields", "full"),
        default="full",
        help="what --previews may show: none (name and bytes), fields, full (default)",
    )
    replay.add_argument(
        "--preview-fields",
        metavar="POINTERS",
        default="",
        help="comma-separated JSON pointers shown in --previews fields mode",
    )
    replay.add_argument(
        "--preview-every",
        type=_positive,
        metavar="N",
        default=256,
        help="release a preview update every N argument bytes (default 256)",
    )
    return parser


def _all_providers() -> tuple[str, ...]:
    return providers()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toollatch`` script; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `toollatch replay ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = _limits(args)
        tools = load_tools(args.tools) if args.tools else None
        previews = _previews(args)
    except ConfigError as exc:
        return _fail(str(exc))
    inputs: list[tuple[str, bytes]] = []
    for name in args.files:
        try:
            data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            return _fail(f"cannot read {name}: {exc.strerror or exc}")
        inputs.append((name, data))
    for name, data in inputs:
        try:
            round_, previews_seen = replay_stream(
                data,
                name=name,
                provider=args.provider,
                tools=tools,
                limits=limits,
                chunk_bytes=args.chunk_bytes,
                previews=previews,
            )
        except UsageError as exc:
            return _fail(f"{name}: {exc}")
        if args.format == "json":
            out = round_json(name, round_)
            if previews is not None:
                out["previews"] = [preview_json(p) for p in previews_seen]
            sys.stdout.write(orjson.dumps(out).decode() + "\n")
        else:
            sys.stdout.write(round_text(name, round_))
            if previews is not None:
                sys.stdout.write("".join(preview_text(p) + "\n" for p in previews_seen))
        sys.stdout.flush()
    return 0


def _fail(message: str) -> int:
    sys.stderr.write(f"toollatch: error: {message}\n")
    return 2


def _limits(args: argparse.Namespace) -> Limits:
    overrides = {
        "max_argument_bytes": args.max_args_bytes,
        "max_calls_per_round": args.max_calls,
        "max_json_depth": args.max_depth,
    }
    return Limits(**{k: v for k, v in overrides.items() if v is not None})


def _previews(args: argparse.Namespace) -> PreviewPolicy | None:
    if not args.previews:
        return None
    fields = tuple(f.strip() for f in args.preview_fields.split(",") if f.strip())
    rule = ToolPreview(mode=args.preview_mode, fields=fields)
    return PreviewPolicy(default=rule, every_bytes=args.preview_every)


def replay_bytes(
    data: bytes,
    *,
    name: str = "-",
    provider: str = "auto",
    tools: Sequence[ToolSpec] | None = None,
    limits: Limits | None = None,
    chunk_bytes: int | None = None,
) -> Round:
    """Replay one recorded stream held in memory; raises ``UsageError`` if it is unrecognizable."""
    return replay_stream(
        data, name=name, provider=provider, tools=tools, limits=limits, chunk_bytes=chunk_bytes
    )[0]


def replay_stream(
    data: bytes,
    *,
    name: str = "-",
    provider: str = "auto",
    tools: Sequence[ToolSpec] | None = None,
    limits: Limits | None = None,
    chunk_bytes: int | None = None,
    previews: PreviewPolicy | None = None,
) -> tuple[Round, list[PreviewUpdated]]:
    """Like :func:`replay_bytes`, also returning the preview updates in order."""
    framing = _FRAMING_BY_SUFFIX.get(Path(name).suffix.lower()) if name != "-" else None
    if provider == "auto" or framing is None:
        detected, detected_framing = detect(data[:65536])
        provider = detected if provider == "auto" else provider
        framing = framing or detected_framing
    parser = StreamParser(provider, framing=framing, tools=tools, limits=limits, previews=previews)
    step = chunk_bytes or len(data) or 1
    notices = []
    for start in range(0, len(data), step):
        notices += parser.feed(data[start : start + step])
    round_ = parser.finish()
    notices += parser.finish_notices
    return round_, [n for n in notices if isinstance(n, PreviewUpdated)]


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
        shown = orjson.dumps(d.value).decode() if d.op != "end" else ""
        shown = shown if len(shown) <= 40 else shown[:39] + "…"
        parts.append(f"{d.path or '/'} {'+' if d.op == 'append' else d.op} {shown}".rstrip())
    state = " final" if preview.final else ""
    error = f" (preview stopped: {preview.error})" if preview.error else ""
    body = "; ".join(parts) if parts else "…"
    return f"  preview {preview.name or '?'} {preview.bytes_so_far} B{state}{error}: {body}"


def round_json(name: str, round_: Round) -> dict[str, Any]:
    """The ``--format json`` object of one replayed file."""
    out: dict[str, Any] = {
        "file": name,
        "provider": round_.provider,
        "ended": round_.ended.value,
        "stop_reason": round_.stop_reason,
        "text": round_.text,
        "calls": [_call_json(c) for c in round_.calls],
        "anomalies": [{"kind": a.kind.value, "detail": a.detail} for a in round_.anomalies],
        "error_results": [r.as_dict() for r in round_.error_results()],
    }
    if len(round_.choices) > 1:
        out["choices"] = [
            {
                "index": c.index,
                "ended": c.ended.value,
                "stop_reason": c.stop_reason,
                "text": c.text,
                "calls": [_call_json(x) for x in c.calls],
            }
            for c in round_.choices
        ]
    return out


def _call_json(call: CallRecord) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "name": call.name,
        "state": call.state.value,
        "arguments": dict(call.arguments) if call.arguments is not None else None,
        "error": call.error.value if call.error else None,
    }


def round_text(name: str, round_: Round) -> str:
    """The human-readable summary of one replayed file."""
    reason = f" ({round_.stop_reason})" if round_.stop_reason else ""
    lines = [f"{name}: {round_.provider}, ended {round_.ended.value}{reason}"]
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
            lines.append(prefix + _call_line(call))
    for anomaly in round_.anomalies:
        lines.append(f"  anomaly {anomaly.kind.value}: {anomaly.detail}")
    return "\n".join(lines) + "\n"


def _call_line(call: CallRecord) -> str:
    head = f"[{call.position}] {call.name or '<no name>'} ({call.call_id or 'no id'})"
    if call.arguments is not None:
        args = orjson.dumps(dict(call.arguments)).decode()
        args = args if len(args) <= 160 else args[:159] + "…"
        return f"{head} COMMITTED {args}"
    return f"{head} {call.state.value.upper()} {call.error}: {call.detail}"


if __name__ == "__main__":  # pragma: no cover
    try:
        raise SystemExit(main())
    except ToolLatchError as exc:
        raise SystemExit(_fail(str(exc))) from None
