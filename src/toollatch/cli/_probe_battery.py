"""``toollatch probe --base-url URL --model M``: how does this OpenAI-compatible server stream
tool calls?

Theory of operation. A battery of streaming tool-calling requests (:data:`BATTERY`: one
call, parallel calls, arguments long enough to pass a small ``max_tokens``, unicode and
escapes, nested objects, a required-only schema, a forced tool choice, a second turn with
results) is sent to ``URL/chat/completions``. Each answer's chunks are scanned for the
quirks of the catalogue (:func:`scan`: ``Q1`` no ``index``, ``Q2`` one index for several
calls, ``Q3`` the id repeated, ``Q5`` the name repeated, ``Q6`` an empty name, ``Q8`` whole
arguments at once, ``Q9`` arguments as an object, ``Q10`` no arguments for a schema with
required fields, ``Q11`` arguments repeated, ``Q12`` ``stop`` although calls streamed,
``Q13`` the finish reason on a content chunk, ``Q17`` one-character fragments, ``Q21``
chunks without choices besides the usage chunk), for its end signals (finish reasons,
``[DONE]``, a usage chunk) and fed to a :class:`~toollatch.StreamParser` with the request's
tools, which tells whether each call would commit and why not. ``--record DIR`` keeps each
answer as a fixture (:class:`toollatch.runtime.Recorder`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..core._pipeline import StreamParser
from ..runtime import Recorder

QUIRKS = {
    "Q1": "index missing on tool-call deltas",
    "Q2": "several calls under one index",
    "Q3": "the call id repeated on continuation chunks",
    "Q5": "the function name repeated on continuation deltas",
    "Q6": 'name "" on continuation deltas',
    "Q8": "whole arguments in the call's first chunk",
    "Q9": "arguments as a JSON object, not a string",
    "Q10": "no arguments although the schema requires some",
    "Q11": "arguments repeated ({...}{...})",
    "Q12": 'finish_reason "stop" although calls streamed',
    "Q13": "finish_reason on a chunk that also carries content",
    "Q17": "one-character argument fragments",
    "Q21": "chunks without choices (not the usage chunk)",
}
"""The quirks :func:`scan` recognises (QUIRKS.md's codes), with what they mean."""

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
_WRITE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write text to a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
_EVENT = {
    "type": "function",
    "function": {
        "name": "create_event",
        "description": "Create a calendar event.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "when": {
                    "type": "object",
                    "properties": {"date": {"type": "string"}, "time": {"type": "string"}},
                    "required": ["date"],
                },
                "attendees": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                        "required": ["name"],
                    },
                },
            },
            "required": ["title", "when", "attendees"],
        },
    },
}
_LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a term up.",
        "parameters": {"type": "object", "required": ["term"]},
    },
}


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@dataclass(frozen=True, slots=True)
class Probe:
    """One request of the battery."""

    name: str
    """Its short name (a column of the report)."""
    messages: list[dict[str, Any]]
    """The conversation sent."""
    tools: list[dict[str, Any]]
    """The tools offered."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More request fields (``max_tokens``, ``tool_choice``...)."""


BATTERY: tuple[Probe, ...] = (
    Probe("single", _user("What is the weather in Oslo? Use the tool."), [_WEATHER]),
    Probe(
        "parallel",
        _user("Weather in Oslo and in Lima? Call the tool once per city, in parallel."),
        [_WEATHER],
        {"parallel_tool_calls": True},
    ),
    Probe(
        "truncated",
        _user("Write a 400-word poem about the sea into poem.txt with the tool."),
        [_WRITE],
        {"max_tokens": 24},
    ),
    Probe(
        "unicode",
        _user('Weather in "Zürich" and 東京? Quote city names exactly, with escapes if needed.'),
        [_WEATHER],
    ),
    Probe(
        "nested",
        _user("Create an event 'Review' on 2026-12-24 at 10:00 with Ada and Alan."),
        [_EVENT],
    ),
    Probe("required_only", _user("Look up the term 'idempotent' with the tool."), [_LOOKUP]),
    Probe(
        "forced",
        _user("Tell me about Oslo."),
        [_WEATHER],
        {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    ),
    Probe(
        "second_turn",
        [
            *_user("What is the weather in Oslo?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_probe_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_probe_1", "content": "4 C, light snow"},
            *_user("And in Lima? Use the tool again."),
        ],
        [_WEATHER],
    ),
)
"""The requests ``probe`` sends, in order."""


def _entries(chunk: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    out = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        calls = delta.get("tool_calls") if isinstance(delta, Mapping) else None
        for entry in calls if isinstance(calls, list) else ():
            if isinstance(entry, Mapping):
                out.append((choice.get("index", 0), entry))
    return out


def scan(chunks: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> set[str]:
    """The quirk codes (:data:`QUIRKS`) a chat stream's decoded chunks show."""
    found: set[str] = set()
    calls: dict[tuple[int, Any], list[Mapping[str, Any]]] = {}
    fragments: list[int] = []
    for n, chunk in enumerate(chunks):
        if not chunk.get("choices") and ("usage" not in chunk or n != len(chunks) - 1):
            found.add("Q21")  # (the usage chunk, last, is the one allowed)
        _finishes(chunk, bool(calls), found)
        for choice_index, entry in _entries(chunk):
            if "index" not in entry:
                found.add("Q1")
            calls.setdefault((choice_index, entry.get("index", entry.get("id"))), []).append(entry)
            args = (entry.get("function") or {}).get("arguments")
            if args is not None and not isinstance(args, str):
                found.add("Q9")
            elif args:
                fragments.append(len(args))
    required = _required(tools)
    for entries in calls.values():
        found |= _call_quirks(entries, required)
    if len(fragments) >= 20 and sum(fragments) / len(fragments) <= 1.5:
        found.add("Q17")
    return found


def _finishes(chunk: Mapping[str, Any], calls_streamed: bool, found: set[str]) -> None:
    """Q12 and Q13, from one chunk's finish reasons."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") and (delta.get("content") or delta.get("tool_calls")):
            found.add("Q13")
        if choice.get("finish_reason") == "stop" and (calls_streamed or delta.get("tool_calls")):
            found.add("Q12")


def _call_quirks(entries: Sequence[Mapping[str, Any]], required: Mapping[str, bool]) -> set[str]:
    """The quirks of the entries sent under one call's key (index, or id without one)."""
    found = set()
    ids = {e["id"] for e in entries if e.get("id")}
    if len(ids) > 1:
        found.add("Q2")
    if sum(1 for e in entries if e.get("id")) > len(ids):
        found.add("Q3")
    names = [(e.get("function") or {}).get("name") for e in entries]
    if sum(1 for x in names if x) > max(1, len(ids)):
        found.add("Q5")
    if any(x == "" for x in names[1:]):
        found.add("Q6")
    texts = [a for e in entries if isinstance(a := (e.get("function") or {}).get("arguments"), str)]
    if texts and texts[0].strip().startswith("{") and _complete(texts[0]):
        found.add("Q8")
    text = "".join(texts)
    if not text.strip() and required.get(next((x for x in names if x), "")):
        found.add("Q10")
    if len(ids) <= 1 and "}{" in text.replace(" ", "") and not _complete(text):
        found.add("Q11")
    return found


def _required(tools: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    out = {}
    for tool in tools:
        function = tool.get("function") or tool
        params = function.get("parameters") or {}
        out[str(function.get("name"))] = bool(params.get("required"))
    return out


def _complete(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class ProbeResult:
    """What one request of the battery showed."""

    name: str
    """The probe's name."""
    status: int | None = None
    """The HTTP status (None: no answer)."""
    error: str | None = None
    """Why there is no stream to judge (a refusal, a connection error)."""
    quirks: list[str] = field(default_factory=list)
    """The quirk codes seen, sorted."""
    finish_reasons: list[str] = field(default_factory=list)
    """Every finish reason sent, in order."""
    done: bool = False
    """Whether ``[DONE]`` ended the stream."""
    usage: bool = False
    """Whether a usage chunk came."""
    ended: str | None = None
    """How toollatch's parser saw the round end (``normal``, ``truncated``...)."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Each call: id, name, ``committed`` or the error code and message."""
    anomalies: list[str] = field(default_factory=list)
    """The parser's anomaly kinds."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "name": self.name,
            "status": self.status,
            "error": self.error,
            "quirks": self.quirks,
            "finish_reasons": self.finish_reasons,
            "done": self.done,
            "usage": self.usage,
            "ended": self.ended,
            "calls": self.calls,
            "anomalies": self.anomalies,
        }


async def run_probe(
    http: httpx.AsyncClient,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    record: Path | None = None,
    battery: Sequence[Probe] = BATTERY,
    progress: Callable[[ProbeResult], None] | None = None,
) -> list[ProbeResult]:
    """Send ``battery`` to ``base_url`` one request at a time; the results in order."""
    results = []
    for probe in battery:
        result = await _one(http, base_url.rstrip("/"), model, probe, api_key, record)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


async def _one(
    http: httpx.AsyncClient,
    base_url: str,
    model: str,
    probe: Probe,
    api_key: str | None,
    record: Path | None,
) -> ProbeResult:
    body = {
        "model": model,
        "messages": probe.messages,
        "tools": probe.tools,
        "stream": True,
        "stream_options": {"include_usage": True},
        **probe.extra,
    }
    result = ProbeResult(probe.name)
    names = [t["function"]["name"] for t in probe.tools]
    parser = StreamParser("openai_chat", tools=probe.tools, eager=names)
    recorder = None
    if record is not None:
        recorder = Recorder(record, body, known=[api_key or ""], label=probe.name)
    try:
        raw = await _send(http, base_url, body, api_key, result, parser, recorder)
    finally:
        if recorder is not None:
            recorder.close()
    if result.status != 200:
        text = bytes(raw[:300]).decode("utf-8", "replace")
        result.error = result.error or f"HTTP {result.status}: {' '.join(text.split())}"
        return result
    _judge(result, raw, parser, probe.tools)
    return result


async def _send(
    http: httpx.AsyncClient,
    base_url: str,
    body: Mapping[str, Any],
    api_key: str | None,
    result: ProbeResult,
    parser: StreamParser,
    recorder: Recorder | None,
) -> bytes:
    """The answer's bytes (its status in ``result``, its stream fed to ``parser``)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    raw = bytearray()
    try:
        url = f"{base_url}/chat/completions"
        async with http.stream("POST", url, json=body, headers=headers) as answer:
            result.status = answer.status_code
            if recorder is not None:
                recorder.begin(answer.status_code, base_url)
            async for data in answer.aiter_raw():
                raw += data
                if recorder is not None:
                    recorder.write(data)
                if answer.status_code == 200:
                    parser.feed(data)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return bytes(raw)


def _judge(
    result: ProbeResult, raw: bytes, parser: StreamParser, tools: Sequence[Mapping[str, Any]]
) -> None:
    chunks: list[dict[str, Any]] = []
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            result.done = True
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            chunks.append(chunk)
    result.quirks = sorted(scan(chunks, tools), key=lambda q: int(q[1:]))
    result.finish_reasons = [
        str(c["finish_reason"])
        for ch in chunks
        for c in ch.get("choices") or ()
        if isinstance(c, dict) and c.get("finish_reason")
    ]
    result.usage = any(ch.get("usage") for ch in chunks)
    round_ = parser.finish()
    result.ended = ",".join(str(c.ended) for c in round_.choices) or "none"
    result.anomalies = sorted({str(a.kind) for a in round_.anomalies})
    for choice in round_.choices:
        for record in choice.calls:
            verdict: dict[str, Any] = {"id": record.call_id, "name": record.name}
            if record.committed is not None:
                verdict["committed"] = True
            else:
                verdict.update(committed=False, code=str(record.error), message=record.detail)
            result.calls.append(verdict)


def report(results: Sequence[ProbeResult]) -> str:
    """The results as a table, then the quirks seen with what they mean."""
    rows = [("probe", "status", "end", "finish", "calls", "quirks")]
    for r in results:
        if r.error is not None:
            rows.append((r.name, str(r.status or "-"), "-", "-", "-", r.error[:60]))
            continue
        committed = sum(1 for c in r.calls if c["committed"])
        refused = [c["code"] for c in r.calls if not c["committed"]]
        calls = f"{committed} ok" + (
            f", {len(refused)} refused ({', '.join(refused)})" if refused else ""
        )
        finish = ",".join(r.finish_reasons) or "none"
        finish += "" if r.done else " (no [DONE])"
        rows.append(
            (r.name, str(r.status), r.ended or "-", finish, calls, " ".join(r.quirks) or "-")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    seen = sorted({q for r in results for q in r.quirks}, key=lambda q: int(q[1:]))
    if seen:
        lines += ["", "quirks seen:"] + [f"  {q}: {QUIRKS[q]}" for q in seen]
    else:
        lines += ["", "no quirks seen"]
    return "\n".join(lines) + "\n"
