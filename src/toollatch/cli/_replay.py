"""``toollatch replay [options] FILE...``: recorded streams through the commit gate.

Each file (``-`` = standard input) goes through the same decoder, adapter, assembler and gate
a live stream goes through, and what would have been committed is printed: with
``--format json`` one object per file, one per line (the contract is in
:mod:`toollatch.cli._replay_output`). Exit status: 0 when every file was replayed (whatever its
calls' states), 2 for a usage error or an unreadable file, with one line
``toollatch: error: ...`` on standard error and never a traceback; files before it were
printed in full (every file is read before the first is replayed).

With ``--provider`` given the provider is never detected. A file's framing comes from its
suffix; for standard input or another suffix it is read from the first bytes alone (``NUL``
first: event stream; a line starting ``data:``, ``event:``, ``id:`` or ``:``: SSE; else JSON
Lines).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ..core._errors import ConfigError, ToolLatchError
from ..core._limits import Limits
from ..core._pipeline import StreamParser
from ..core._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from ..core._registry import Framing, detect, providers
from ..core._round import Round
from ..core._specs import ToolSpec, load_tools
from ._args import Subparsers, positive
from ._output import display_name, fail, json_text, one_line, write
from ._replay_output import preview_json, preview_text, round_json, round_text

NAME = "replay"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``replay`` and its arguments to ``subparsers``; returns its parser."""
    replay: argparse.ArgumentParser = subparsers.add_parser(
        NAME, help="replay recorded streams (.sse, .jsonl, .eventstream) through the gate"
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="recorded stream; - = stdin")
    replay.add_argument("--provider", default="auto", choices=("auto", *providers()))
    replay.add_argument("--tools", metavar="FILE", help="JSON list of tool definitions")
    replay.add_argument("--format", default="text", choices=("text", "json"))
    replay.add_argument("--max-args-bytes", type=positive, metavar="N")
    replay.add_argument("--max-calls", type=positive, metavar="N")
    replay.add_argument("--max-depth", type=positive, metavar="N")
    replay.add_argument(
        "--chunk-bytes",
        type=positive,
        metavar="N",
        help="feed the input in N-byte pieces (reproduces network splits)",
    )
    _add_preview_arguments(replay)
    return replay


def _add_preview_arguments(replay: argparse.ArgumentParser) -> None:
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
        type=positive,
        metavar="N",
        default=256,
        help="release a preview update every N argument bytes (default 256)",
    )


class _Refused(Exception):
    """A problem told as one error line (status 2)."""


def command(args: argparse.Namespace) -> int:
    """Replay ``args.files`` with parsed ``args``; the exit status (see the module)."""
    try:
        limits, tools, previews = _settings(args)
        inputs = [(name, _read(name)) for name in args.files]
    except _Refused as exc:
        return fail(str(exc))
    for name, data in inputs:
        try:
            round_, seen = replay_stream(
                data,
                name=name,
                provider=args.provider,
                tools=tools,
                limits=limits,
                chunk_bytes=args.chunk_bytes,
                previews=previews,
            )
            _emit(name, round_, seen if previews is not None else None, args.format)
        except ToolLatchError as exc:
            return fail(f"{display_name(name)}: {exc}")
        except Exception as exc:  # a bug in toollatch: still one line, never a traceback
            return fail(f"{display_name(name)}: internal error: {one_line(exc)}")
    return 0


def _settings(
    args: argparse.Namespace,
) -> tuple[Limits, Sequence[ToolSpec] | None, PreviewPolicy | None]:
    """The limits, the ``--tools`` file's tools and the preview policy of the flags."""
    try:
        limits = _limits(args)
        tools = load_tools(args.tools) if args.tools else None
        return limits, tools, _previews(args)
    except ConfigError as exc:
        raise _Refused(_with_display_name(str(exc), args.tools)) from None
    except Exception as exc:  # a tools file the loader did not foresee: one line all the same
        shown = f"{display_name(args.tools)}: " if args.tools else ""
        raise _Refused(f"{shown}internal error: {one_line(exc)}") from None


def _with_display_name(message: str, name: str | None) -> str:
    return message.replace(name, display_name(name)) if name else message


def _read(name: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise _Refused(f"cannot read {display_name(name)}: {exc.strerror or exc}") from None


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


def _emit(name: str, round_: Round, previews: list[PreviewUpdated] | None, format_: str) -> None:
    shown = display_name(name)
    if format_ == "json":
        out = round_json(shown, round_)
        if previews is not None:
            out["previews"] = [preview_json(p) for p in previews]
        write(sys.stdout, json_text(out) + "\n", json_line=True)
    else:
        text = round_text(shown, round_)
        if previews is not None:
            text += "".join(preview_text(p) + "\n" for p in previews)
        write(sys.stdout, text)
    sys.stdout.flush()


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
    if provider == "auto":
        provider, detected_framing = detect(data[:_HEAD_BYTES])
        framing = framing or detected_framing
    elif framing is None:
        framing = _framing_of(data[:_HEAD_BYTES])
    parser = StreamParser(provider, framing=framing, tools=tools, limits=limits, previews=previews)
    step = chunk_bytes or len(data) or 1
    notices = []
    for start in range(0, len(data), step):
        notices += parser.feed(data[start : start + step])
    round_ = parser.finish()
    notices += parser.finish_notices
    return round_, [n for n in notices if isinstance(n, PreviewUpdated)]


_FRAMING_BY_SUFFIX: dict[str, Framing] = {
    ".sse": "sse",
    ".txt": "sse",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".eventstream": "eventstream",
}

_HEAD_BYTES = 65536
"""How much of a stream's start detection reads."""

_SSE_FIELDS = re.compile(rb"^[ \t]*(?:data|event|id)?:", re.MULTILINE)


def _framing_of(head: bytes) -> Framing:
    """The framing of a stream whose provider was given: never guesses the provider."""
    if head[:1] == b"\x00":  # an event-stream prelude (a length under 16 MiB); text never is
        return "eventstream"
    lines = head.removeprefix(b"\xef\xbb\xbf").replace(b"\r", b"\n")
    return "sse" if _SSE_FIELDS.search(lines) else "jsonl"
