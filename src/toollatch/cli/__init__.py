"""``toollatch`` command line: ``run`` an agent, or ``replay`` recorded streams through the
commit gate.

``toollatch run`` (see :mod:`toollatch.cli._run_command`) is imported only when used.

``toollatch replay [options] FILE...`` feeds each file (``-`` = standard input) through the same
decoder, adapter, assembler and gate a live stream goes through and prints what would have been
committed. ``--format json`` is a stable contract other tools rely on: one JSON object per
file, one per line, with exactly the keys ``file, provider, ended, stop_reason, text, calls,
anomalies, error_results`` (extensions only ever add keys). Exit status: 0 when every file was
replayed (whatever its calls' states), 2 for a usage error or an unreadable file, with one line
``toollatch: error: ...`` on standard error and never a traceback.

Whatever the input, the output is printable:

* JSON is serialized by orjson; when orjson refuses a value (an integer outside 64 bits, nesting
  deeper than its limit, a lone surrogate) the whole object is written by :func:`json_text`'s
  exact fallback instead, so a big integer is still printed as a JSON integer, digit for digit.
* A file name that is not valid UTF-8 (Python holds its bytes as ``surrogateescape``
  surrogates) is printed as its bytes decoded as UTF-8 with each undecodable byte shown as
  ``\\xNN`` (``b"caf\\xe9.sse"`` is printed ``caf\\xe9.sse``); see :func:`display_name`.
* On a standard output that cannot encode a character (``PYTHONIOENCODING=ascii``, a C locale
  without UTF-8 mode), JSON lines show it as a ``\\uXXXX`` escape (still valid JSON, same
  value) and text lines as a Python backslash escape (``\\xe9``, ``\\u2615``).
* With ``--provider`` given the provider is never detected. A file's framing comes from its
  suffix; for standard input or another suffix it is read from the first bytes alone (``NUL``
  first: event stream; a line starting ``data:``, ``event:``, ``id:`` or ``:``: SSE; else
  JSON Lines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import orjson

from ..core._errors import ConfigError, ToolLatchError
from ..core._events import AnomalyKind, CallKey
from ..core._limits import Limits
from ..core._messages import error_results
from ..core._pipeline import StreamParser
from ..core._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from ..core._registry import Framing, detect, providers
from ..core._round import CallRecord, Round
from ..core._specs import ToolSpec, load_tools

_FRAMING_BY_SUFFIX: dict[str, Framing] = {
    ".sse": "sse",
    ".txt": "sse",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".eventstream": "eventstream",
}


RUN_VARIABLES = """\
environment (read with or without --config; flags win over them):
  TOOLLATCH_MODEL__BASE_URL, TOOLLATCH_MODEL__MODEL, TOOLLATCH_MODEL__PROVIDER
                        the model (as --base-url, --model, --provider)
  TOOLLATCH_MODEL__API_KEY_ENV
                        the variable holding the key (default: the provider's usual one:
                        OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY)
  TOOLLATCH_LEDGER__URL the ledger (as --ledger)
  TOOLLATCH_DISPATCHER__DEFAULT_TIMEOUT_S
                        a tool's run-time limit when it sets none (seconds)
  TOOLLATCH_<SECTION>__<KEY>
                        any key of `toollatch config example`, e.g.
                        TOOLLATCH_RESULTS__MAX_BYTES=16384
"""
"""The variables ``run --help`` lists (every key has one: see ``toollatch config example``)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(_fail(message))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A duration in seconds: a finite number >= 0 (0: no limit, where the flag says so)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("toollatch")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = _Parser(prog="toollatch", description="Commit-gated streamed tool calls.")
    parser.add_argument("--version", action="version", version=f"toollatch {_version()}")
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
    run = sub.add_parser(
        "run",
        help="run an agent: the model streams, the gate commits, the tools run, repeat",
        description="Without --base-url: the scripted model server on loopback with the "
        "built-in example tools (no key, no network).",
        epilog=RUN_VARIABLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("message", nargs="?", help="the user's message (default: a demo question)")
    run.add_argument(
        "--provider",
        default=None,
        choices=("openai_chat", "openai_responses", "anthropic", "gemini"),
        help="default: the config's model.provider, else openai_chat",
    )
    run.add_argument("--model", help="model name (default with the scripted server: scripted)")
    run.add_argument("--base-url", help="the provider's base URL (as its official SDK takes it)")
    run.add_argument(
        "--tools",
        action="append",
        metavar="FILE.py",
        help="register every @toollatch.tool function of FILE.py (repeatable; replaces the "
        "examples)",
    )
    run.add_argument(
        "--mcp",
        action="append",
        metavar="SERVER",
        help="the tools of an MCP server: 'stdio:COMMAND ARGS...' or http://HOST:PORT/PATH "
        "(repeatable; replaces the examples; needs the [mcp] extra)",
    )
    run.add_argument(
        "--eager",
        action="append",
        metavar="NAME[,NAME...]",
        help="tools that may start before their round ends (besides eager=True ones)",
    )
    run.add_argument("--max-rounds", type=_positive, default=None, metavar="N", help="default 8")
    run.add_argument(
        "--deadline",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="wall-clock limit of the whole run; at it the round in flight is cancelled, every "
        "call paired (default: the config's relay.deadline_s, 900; 0: none)",
    )
    run.add_argument(
        "--workspace",
        metavar="DIR",
        help="where the example write_file writes (default: a new temporary folder, kept; "
        "the run prints its path)",
    )
    run.add_argument("--json", action="store_true", help="one JSON agent event per line")
    run.add_argument(
        "--full-results",
        action="store_true",
        help="--json's tool_finished carries each whole result (still redacted), not a "
        "200-character preview",
    )
    run.add_argument(
        "--ledger",
        metavar="URL",
        help="a durable call ledger: sqlite:///PATH or redis://HOST:PORT/DB (a call id runs at "
        "most once across processes and restarts)",
    )
    run.add_argument(
        "--session",
        metavar="ID",
        help="the run's session (the ledger's scope); default: a new id per run with --ledger",
    )
    run.add_argument(
        "--resume",
        metavar="ID",
        help="continue the stored run of session ID (needs --ledger; MESSAGE, if given, is a "
        "new user turn after it)",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (see `toollatch config example`); flags win over it",
    )
    config = sub.add_parser("config", help="print an example configuration, or check one")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    config_sub.add_parser("example", help="print a commented example (every key, its default)")
    check = config_sub.add_parser(
        "check", help="validate FILE (and TOOLLATCH_... overrides); print the effective config"
    )
    check.add_argument("file", metavar="FILE")
    from ._serve_command import add_serve_parser  # noqa: PLC0415 (no [run] import until used)

    add_serve_parser(sub)
    return parser


def _all_providers() -> tuple[str, ...]:
    return providers()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toollatch`` script; returns the exit status (never raises).

    A usage error, an unreadable file and anything unexpected while replaying a file end with
    one ``toollatch: error: ...`` line on standard error and status 2; files before it were
    printed in full.
    """
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `toollatch replay ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed its line (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "run":
        return _run(args)
    if args.command == "config":
        return _config(args)
    if args.command == "serve":
        from ._serve_command import serve_command  # noqa: PLC0415 (the [run] extra, lazily)

        return serve_command(args)
    try:
        limits = _limits(args)
        tools = load_tools(args.tools) if args.tools else None
        previews = _previews(args)
    except ConfigError as exc:
        return _fail(_with_display_name(str(exc), args.tools))
    except Exception as exc:  # a tools file the loader did not foresee: one line all the same
        shown = f"{display_name(args.tools)}: " if args.tools else ""
        return _fail(f"{shown}internal error: {_one_line(exc)}")
    inputs: list[tuple[str, bytes]] = []
    for name in args.files:
        try:
            data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            return _fail(f"cannot read {display_name(name)}: {exc.strerror or exc}")
        inputs.append((name, data))
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
            return _fail(f"{display_name(name)}: {exc}")
        except Exception as exc:  # a bug in toollatch: still one line, never a traceback
            return _fail(f"{display_name(name)}: internal error: {_one_line(exc)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    """``toollatch run``: the runtime is imported only here (it needs the ``[run]`` extra)."""
    try:
        from ._run_command import run_command  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return _fail(f"toollatch run needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    return run_command(args)


def _config(args: argparse.Namespace) -> int:
    """``toollatch config example|check FILE``: exit 0, or 2 with every problem listed."""
    try:
        from ._app_config import config_command  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return _fail(
            f"toollatch config needs the [run] extra (pip install 'toollatch[run]'): {exc}"
        )
    return config_command(args)


def _emit(name: str, round_: Round, previews: list[PreviewUpdated] | None, format_: str) -> None:
    shown = display_name(name)
    if format_ == "json":
        out = round_json(shown, round_)
        if previews is not None:
            out["previews"] = [preview_json(p) for p in previews]
        _write(sys.stdout, json_text(out) + "\n", json_line=True)
    else:
        text = round_text(shown, round_)
        if previews is not None:
            text += "".join(preview_text(p) + "\n" for p in previews)
        _write(sys.stdout, text)
    sys.stdout.flush()


def _with_display_name(message: str, name: str | None) -> str:
    return message.replace(name, display_name(name)) if name else message


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fail(message: str) -> int:
    _write(sys.stderr, f"toollatch: error: {' '.join(message.split())}\n")
    return 2


def display_name(name: str) -> str:
    """``name`` as printed: unchanged when it is valid Unicode without surrogates; else its
    bytes (``os.fsencode``, which undoes ``surrogateescape``) decoded as UTF-8 with each byte
    that does not decode shown as ``\\xNN`` (``backslashreplace``)."""
    if not _has_surrogates(name):
        return name
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:  # a surrogate that no byte stands for
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _write(stream: TextIO, text: str, *, json_line: bool = False) -> None:
    """Write ``text`` whatever ``stream`` can encode: JSON gets ``\\uXXXX`` escapes (the same
    JSON value), text Python backslash escapes."""
    if not text.isascii():
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except LookupError:
            pass
        except UnicodeEncodeError:
            if json_line:
                text = _NON_ASCII.sub(_json_escape, text)
            else:
                text = text.encode(encoding, "backslashreplace").decode(encoding)
    stream.write(text)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _json_escape(match: re.Match[str]) -> str:
    # Outside strings JSON text is ASCII, so each non-ASCII character is inside one.
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(value: object) -> str:
    """``value`` as compact JSON text, as orjson writes it; when orjson refuses the value (an
    integer outside 64 bits, nesting over its depth limit, a lone surrogate), the whole value
    is written by an iterative serializer with the same output conventions: integers exact,
    non-finite floats ``null``, strings as written by ``json.dumps`` (surrogates escaped)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _slow_json(value)


class _Raw(str):
    """JSON text already written (punctuation), as opposed to a string value to encode."""

    __slots__ = ()


def _slow_json(value: object) -> str:
    out: list[str] = []
    work: list[object] = [value]  # a stack, so depth costs no Python recursion
    while work:
        item = work.pop()
        if type(item) is _Raw:
            out.append(item)
        elif isinstance(item, Mapping):
            out.append("{")
            work.append(_Raw("}"))
            for i, (key, member) in reversed(list(enumerate(item.items()))):
                work.append(member)
                work.append(_Raw(("," if i else "") + _json_string(str(key)) + ":"))
        elif isinstance(item, list | tuple):
            out.append("[")
            work.append(_Raw("]"))
            for i, element in reversed(list(enumerate(item))):
                work.append(element)
                if i:
                    work.append(_Raw(","))
        else:
            out.append(_json_scalar(item))
    return "".join(out)


def _json_scalar(item: object) -> str:
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return int.__repr__(item)
    if isinstance(item, float):
        return float.__repr__(item) if math.isfinite(item) else "null"
    if isinstance(item, str):
        return _json_string(item)
    raise TypeError(f"cannot write {type(item).__name__} as JSON")


def _json_string(text: str) -> str:
    written = json.dumps(text, ensure_ascii=False)
    return written if not _has_surrogates(written) else json.dumps(text)


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


_HEAD_BYTES = 65536
"""How much of a stream's start detection reads."""

_SSE_FIELDS = re.compile(rb"^[ \t]*(?:data|event|id)?:", re.MULTILINE)


def _framing_of(head: bytes) -> Framing:
    """The framing of a stream whose provider was given: never guesses the provider."""
    if head[:1] == b"\x00":  # an event-stream prelude (a length under 16 MiB); text never is
        return "eventstream"
    lines = head.removeprefix(b"\xef\xbb\xbf").replace(b"\r", b"\n")
    return "sse" if _SSE_FIELDS.search(lines) else "jsonl"


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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
