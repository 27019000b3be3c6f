"""Assembly cost: raw SSE bytes -> committed tool calls, toollatch against the floor and the SDKs.

Run it with one command (from the repository root)::

    python benchmarks/bench_assembly.py            # full run, rewrites benchmarks/README.md
    python benchmarks/bench_assembly.py --quick    # smoke run: small sizes, short cap, no README

Theory of operation
-------------------
For every provider and argument size, one synthetic stream is built: a single tool call
``write_file`` whose argument text is a JSON object ``{"path", "content"}`` of the requested
UTF-8 size (content with escapes, newlines and some non-ASCII), cut into fragments of 3-20
characters (seeded), each fragment in its own provider-shaped event. Each event is one network
read: every contender is fed the same ``list[bytes]``, one item at a time.

Every contender goes from those bytes to the parsed arguments of the call:

* **floor** - the least work anyone can do: split the bytes into events (an event that spans
  reads gathered in one buffer, each byte searched and copied once: linear, where re-joining
  the carry-over with every read was quadratic for events larger than a read; SSE's blank
  lines found at ``memchr`` speed, not by CPython's two-byte search), strip
  ``data: ``, ``orjson.loads`` each event, append the argument fragment to a list, one
  ``orjson.loads("".join(...))`` at the end. No validation, no state.
* **toollatch** - ``StreamParser(provider).feed(read)`` per read, ``finish()``, then the
  committed call's ``arguments``; ``Limits(max_argument_bytes=4 MiB)`` so 1 MiB is allowed.
* **openai SDK** / **anthropic SDK** - what their ``Stream`` classes do per read (their own
  ``SSEDecoder``, ``json.loads``, ``construct_type`` into the event model), then the documented
  accumulator (``ChatCompletionStreamState.handle_chunk``, ``ResponseStreamState.handle_event``,
  ``accumulate_event``) and the final object users read.
* **langchain-core** - ``AIMessageChunk`` objects with ``tool_call_chunks``, summed with ``+``
  as users do; decoding through the openai / anthropic SDK's SSE decoder and ``json.loads``.

Every finished run's arguments are compared with the generated object (``==``); a mismatch
aborts the benchmark. A run that passes the per-case cap stops being fed and is reported as
``> cap`` with the share of reads it got through (no signals: the loop checks the clock).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import hashlib
import io
import json
import math
import os
import platform
import pstats
import random
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

# The SDKs' own per-event pieces (private modules: exactly what their Stream classes call).
from anthropic._models import construct_type as anthropic_construct
from anthropic._streaming import SSEDecoder as AnthropicSSEDecoder
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai import omit
from openai._models import construct_type as openai_construct
from openai._streaming import SSEDecoder as OpenAISSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

try:
    from langchain_core.messages import AIMessageChunk
except ImportError:  # (optional: the table leaves its columns out; --reads never needs it)
    AIMessageChunk = None

import toollatch
from toollatch import CallState, Limits, PreviewPolicy, StreamParser, ToolPreview
from toollatch.stages import Gate

KIB = 1024
MIB = 1024 * KIB
LIMITS = Limits(max_argument_bytes=4 * MIB)
HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
BEGIN_MARK = "<!-- BEGIN GENERATED: bench_assembly.py rewrites everything below -->"
END_MARK = "<!-- END GENERATED -->"
CLOCK_EVERY = 16  # reads between two clock checks (cheap enough for the floor, tight enough)
SLOW_RUN_S = 5.0  # a contender whose run took longer than this is not repeated
BATCH_S = 0.02  # a run shorter than this is timed again as a batch of back-to-back runs
MAX_BATCH = 200
GROWTH_SIZES = (256 * KIB, MIB)  # the growth exponent is taken between these two sizes
GROWTH_ROUNDS = 15  # rounds of the growth measurement (see measure_growth)
TOOL_NAME = "write_file"
EXTRAPOLATION_NOTE = (
    "\\* Linear extrapolation from the share of events fed before the cap: a lower bound for "
    "a contender whose cost per event grows with the buffer."
)

# ---------------------------------------------------------------------------------------------
# Synthetic arguments
# ---------------------------------------------------------------------------------------------

_WORDS = ("def", "return", "self", "value", "buffer", "stream", "call", "index", "import",
          "class", "while", "assert", "yield", "parse", "token", "fragment", "commit", "gate",
          "round", "event", "delta", "state", "error", "limit", "schema", "offset")  # fmt: skip
_SPICE = (
    'print("hello, world")',
    "path = 'C:\\\\Users\\\\dev\\\\notes'",
    "\tindented\twith\ttabs",
    'msg = "she said \\"hi\\""',
    "café naïve Grüße",
    "日本語のテキスト",
    "emoji 🙂 ok",
    "regex: ^\\d+\\s*$",
    "#  -> → ≤ ≥ µs",
)


def make_arguments(size_bytes: int, rng: random.Random) -> tuple[str, dict[str, str]]:
    """A ``{"path", "content"}`` object whose compact UTF-8 JSON text is at most ``size_bytes``
    (and within a few bytes of it); returns ``(text, object)``."""
    obj = {"path": f"src/generated/module_{rng.randrange(10_000):04d}.py", "content": ""}
    overhead = len(orjson.dumps(obj))
    lines: list[str] = []
    total = overhead
    while total < size_bytes + 64:
        if rng.random() < 0.2:
            line = rng.choice(_SPICE)
        else:
            line = " " * (4 * rng.randrange(3)) + " ".join(
                rng.choices(_WORDS, k=rng.randint(3, 12))
            )
        lines.append(line)
        total += len(orjson.dumps(line)) - 2 + 2  # escaped text plus the escaped "\n"
    content = "\n".join(lines)
    lo, hi = 0, len(content)  # longest prefix that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        obj["content"] = content[:mid]
        if len(orjson.dumps(obj)) <= size_bytes:
            lo = mid
        else:
            hi = mid - 1
    obj["content"] = content[:lo]
    return orjson.dumps(obj).decode(), obj


def split_fragments(text: str, rng: random.Random) -> list[str]:
    """``text`` cut into pieces of 3-20 characters (the last one may be shorter)."""
    out, i = [], 0
    while i < len(text):
        n = rng.randint(3, 20)
        out.append(text[i : i + n])
        i += n
    return out


# ---------------------------------------------------------------------------------------------
# Provider-shaped streams: one bytes item per event = one network read
# ---------------------------------------------------------------------------------------------


def _data(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _named(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\n" + _data(obj)


def stream_openai_chat(frags: Sequence[str], rng: random.Random) -> list[bytes]:
    """Chat Completions chunks as OpenAI sends them with ``stream_options.include_usage``."""
    env = {
        "id": f"chatcmpl-B{rng.getrandbits(64):016x}",
        "object": "chat.completion.chunk",
        "created": 1754693442,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_07871e2ad8",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _data({**env, "choices": [choice]})

    opening = {
        "index": 0,
        "id": f"call_{rng.getrandbits(96):024x}",
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": ""},
    }
    reads = [
        chunk({"role": "assistant", "content": None, "tool_calls": [opening], "refusal": None})
    ]
    reads += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}) for f in frags]
    reads.append(chunk({}, "tool_calls"))
    usage = {
        "prompt_tokens": 412,
        "completion_tokens": len(frags),
        "total_tokens": 412 + len(frags),
    }
    reads.append(_data({**env, "choices": [], "usage": usage}))
    reads.append(b"data: [DONE]\n\n")
    return reads


def stream_anthropic(frags: Sequence[str], rng: random.Random) -> list[bytes]:
    """Messages stream events with ``event:`` lines, one ``tool_use`` block."""
    usage = {
        "input_tokens": 412,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
        "service_tier": "standard",
    }
    message = {
        "id": f"msg_{rng.getrandbits(96):024x}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-20250514",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    block = {
        "type": "tool_use",
        "id": f"toolu_{rng.getrandbits(96):024x}",
        "name": TOOL_NAME,
        "input": {},
    }
    reads = [
        _named({"type": "message_start", "message": message}),
        _named({"type": "content_block_start", "index": 0, "content_block": block}),
        _named({"type": "ping"}),
    ]
    for f in ["", *frags]:  # Anthropic opens every tool_use block with an empty partial_json
        delta = {"type": "input_json_delta", "partial_json": f}
        reads.append(_named({"type": "content_block_delta", "index": 0, "delta": delta}))
    reads += [
        _named({"type": "content_block_stop", "index": 0}),
        _named(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": len(frags)},
            }
        ),
        _named({"type": "message_stop"}),
    ]
    return reads


def stream_openai_responses(frags: Sequence[str], rng: random.Random) -> list[bytes]:
    """Responses API semantic events for one ``function_call`` output item."""
    seq = iter(range(1 << 30))
    item_id = f"fc_{rng.getrandbits(192):048x}"
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": f"call_{rng.getrandbits(96):024x}",
        "name": TOOL_NAME,
        "arguments": "",
        "status": "in_progress",
    }
    response = {
        "id": f"resp_{rng.getrandbits(192):048x}",
        "object": "response",
        "created_at": 1743082657,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": "gpt-4.1-2025-04-14",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": None,
    }
    arguments = "".join(frags)
    done_item = {**item, "arguments": arguments, "status": "completed"}
    usage = {"input_tokens": 412, "output_tokens": len(frags), "total_tokens": 412 + len(frags)}
    completed = {**response, "status": "completed", "output": [done_item], "usage": usage}

    def ev(kind: str, **fields: Any) -> bytes:
        return _named({"type": kind, "sequence_number": next(seq), **fields})

    reads = [
        ev("response.created", response=response),
        ev("response.in_progress", response=response),
        ev("response.output_item.added", output_index=0, item=item),
    ]
    reads += [
        ev("response.function_call_arguments.delta", item_id=item_id, output_index=0, delta=f)
        for f in frags
    ]
    reads += [
        ev(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=0,
            arguments=arguments,
        ),
        ev("response.output_item.done", output_index=0, item=done_item),
        ev("response.completed", response=completed),
    ]
    return reads


def stream_bedrock(frags: Sequence[str], rng: random.Random) -> list[bytes]:
    """ConverseStream events as JSON Lines (one-key dicts, with the ``p`` padding field)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

    def line(name: str, body: dict[str, Any]) -> bytes:
        body = {**body, "p": alphabet[: rng.randint(1, len(alphabet))]}
        return orjson.dumps({name: body}) + b"\n"

    tool = {"toolUse": {"name": TOOL_NAME, "toolUseId": f"tooluse_{rng.getrandbits(88):022x}"}}
    reads = [
        line("messageStart", {"role": "assistant"}),
        line("contentBlockStart", {"contentBlockIndex": 0, "start": tool}),
    ]
    reads += [
        line("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": f}}})
        for f in frags
    ]
    usage = {"inputTokens": 412, "outputTokens": len(frags), "totalTokens": 412 + len(frags)}
    reads += [
        line("contentBlockStop", {"contentBlockIndex": 0}),
        line("messageStop", {"stopReason": "tool_use"}),
        line("metadata", {"usage": usage, "metrics": {"latencyMs": 4210}}),
    ]
    return reads


def stream_gemini(args: dict[str, Any], rng: random.Random) -> list[bytes]:
    """``streamGenerateContent?alt=sse`` chunks: text, the whole ``functionCall``, finish."""
    meta = {"modelVersion": "gemini-2.5-flash", "responseId": f"{rng.getrandbits(88):022x}"}

    def chunk(parts: list[dict[str, Any]], **extra: Any) -> bytes:
        cand = {"content": {"parts": parts, "role": "model"}, "index": 0, **extra}
        return _data({"candidates": [cand], **meta})

    usage = {"promptTokenCount": 412, "candidatesTokenCount": 9000, "totalTokenCount": 9412}
    return [
        chunk([{"text": "I'll write the module now."}]),
        chunk([{"functionCall": {"name": TOOL_NAME, "args": args}}]),
        _data(
            {
                "candidates": [
                    {
                        "content": {"parts": [{"text": ""}], "role": "model"},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": usage,
                **meta,
            }
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Contenders: (reads, deadline) -> Outcome
# ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run produced: the parsed arguments, or ``None`` if it hit the cap."""

    arguments: Any
    fed: int
    """Reads consumed before the end (or before the cap)."""


class Pacer:
    """Yields reads until the deadline passes (checked every ``CLOCK_EVERY`` reads)."""

    def __init__(self, reads: Sequence[bytes], deadline: float) -> None:
        self.reads, self.deadline, self.fed, self.capped = reads, deadline, 0, False

    def __iter__(self) -> Iterator[bytes]:
        clock, deadline = time.perf_counter, self.deadline
        for i, read in enumerate(self.reads):
            if not i % CLOCK_EVERY and clock() > deadline:
                self.capped = True
                return
            self.fed = i + 1
            yield read


Contender = Callable[[Sequence[bytes], float], Outcome]


def _pick_chat(obj: dict[str, Any], out: list[Any]) -> None:
    for choice in obj.get("choices") or ():
        for tc in choice["delta"].get("tool_calls") or ():
            frag = tc.get("function", {}).get("arguments")
            if frag:
                out.append(frag)


def _pick_anthropic(obj: dict[str, Any], out: list[Any]) -> None:
    if obj["type"] == "content_block_delta" and obj["delta"]["type"] == "input_json_delta":
        out.append(obj["delta"]["partial_json"])


def _pick_responses(obj: dict[str, Any], out: list[Any]) -> None:
    if obj["type"] == "response.function_call_arguments.delta":
        out.append(obj["delta"])


def _pick_bedrock(obj: dict[str, Any], out: list[Any]) -> None:
    delta = obj.get("contentBlockDelta")
    if delta is not None and "toolUse" in delta["delta"]:
        out.append(delta["delta"]["toolUse"]["input"])


def _pick_gemini(obj: dict[str, Any], out: list[Any]) -> None:
    for cand in obj.get("candidates") or ():
        for part in cand.get("content", {}).get("parts") or ():
            if "functionCall" in part:
                out.append(part["functionCall"]["args"])


def _join_parse(frags: list[Any]) -> Any:
    return orjson.loads("".join(frags))


def find_blank(data: bytes | bytearray, start: int = 0) -> int:
    """``data.find(b"\n\n", start)`` at ``memchr`` speed: CPython's search for a two-byte
    needle (and its split on one) steps through every byte in a loop, about 2 ns a byte, while
    a one-byte ``find`` runs on ``memchr``. A blank line starts at a LF, so each LF found is
    tested for a second one after it; an event of one long ``data`` line (Gemini's whole
    call) is then one C search, not a byte loop."""
    find, size = data.find, len(data)
    at = find(b"\n", start)
    while at >= 0:
        if at + 1 < size and data[at + 1] == 10:
            return at
        at = find(b"\n", at + 1)
    return -1


def split_blank(data: bytes) -> list[bytes]:
    """``data.split(b"\n\n")`` with the blank lines found by :func:`find_blank`."""
    events, pos = [], 0
    stop = find_blank(data)
    while stop >= 0:
        events.append(data[pos:stop])
        pos = stop + 2
        stop = find_blank(data, pos)
    events.append(data[pos:])
    return events


def _split_bytes(separator: bytes) -> Callable[[bytes], list[bytes]]:
    def split(data: bytes) -> list[bytes]:
        return data.split(separator)

    return split


def make_floor(
    pick: Callable[[dict[str, Any], list[Any]], None],
    *,
    separator: bytes = b"\n\n",
    finalize: Callable[[list[Any]], Any] = _join_parse,
    two_byte_search: bool = False,
) -> Contender:
    """The end-to-end floor: split on ``separator``, strip ``data: ``, one ``orjson.loads`` per
    event, ``pick`` the fragment, ``finalize`` (one parse of the joined text) at the end. SSE's
    blank lines are found at ``memchr`` speed (:func:`find_blank`), as the SSE decoder finds its
    line ends; ``two_byte_search`` keeps CPython's two-byte search and split (the floor
    before, about 2 ns a byte slower: kept to show what that flattered)."""
    sse = separator == b"\n\n"
    memchr = sse and not two_byte_search
    split = split_blank if memchr else _split_bytes(separator)
    width = len(separator) - 1  # how much of a separator the pending bytes may end with

    def run(reads: Sequence[bytes], deadline: float) -> Outcome:
        loads, clock, frags = orjson.loads, time.perf_counter, []
        find = find_blank if memchr else lambda buf, at: buf.find(separator, at)
        # Linear in the bytes whatever the reads: an event that spans reads is gathered in
        # one growing buffer, each read searched once (from where a separator could start),
        # and copied out once when it is complete; a read that starts with nothing pending
        # (one event per read) is split as it is, with no copy.
        pending, scan = bytearray(), 0
        for i, read in enumerate(reads):
            if not i % CLOCK_EVERY and clock() > deadline:
                return Outcome(None, i)
            data = read
            if pending:
                pending += read
                if find(pending, scan) < 0:
                    scan = max(0, len(pending) - width)
                    continue
                data = bytes(pending)
                pending.clear()
            *events, tail = split(data)
            if tail:
                pending += tail
                scan = max(0, len(pending) - width)
            for event in events:
                payload = event
                if sse:
                    at = event.find(b"data: ")
                    if at < 0:
                        continue
                    payload = event[at + 6 :]
                if payload[:1] == b"{":  # skips [DONE] and blank lines
                    pick(loads(payload), frags)
        return Outcome(finalize(frags), len(reads))

    return run


def make_toollatch(provider: str, framing: str = "sse") -> Contender:
    """``StreamParser.feed`` per read, ``finish()``, the one committed call's arguments."""

    def run(reads: Sequence[bytes], deadline: float) -> Outcome:
        parser = StreamParser(provider, framing=framing, limits=LIMITS)  # type: ignore[arg-type]
        feed, clock = parser.feed, time.perf_counter
        for i, read in enumerate(reads):
            if not i % CLOCK_EVERY and clock() > deadline:
                return Outcome(None, i)
            feed(read)
        round_ = parser.finish()
        calls = round_.calls
        if len(calls) != 1 or calls[0].state is not CallState.COMMITTED:
            detail = [(c.state.value, c.error, c.detail) for c in calls]
            raise AssertionError(f"toollatch did not commit one call: {detail} {round_.anomalies}")
        return Outcome(calls[0].arguments, len(reads))

    return run


def run_openai_chat_sdk(reads: Sequence[bytes], deadline: float) -> Outcome:
    """openai ``Stream`` per-event work (SSEDecoder, json.loads, construct_type into
    ``ChatCompletionChunk``) + ``ChatCompletionStreamState``; final arguments via json.loads."""
    pacer, state = Pacer(reads, deadline), ChatCompletionStreamState()
    for sse in OpenAISSEDecoder().iter_bytes(iter(pacer)):
        if sse.data.startswith("[DONE]"):
            break
        state.handle_chunk(openai_construct(type_=ChatCompletionChunk, value=sse.json()))
    if pacer.capped:
        return Outcome(None, pacer.fed)
    message = state.get_final_completion().choices[0].message
    assert message.tool_calls, "the openai SDK state assembled no tool call"
    return Outcome(json.loads(message.tool_calls[0].function.arguments), pacer.fed)


def run_openai_responses_sdk(reads: Sequence[bytes], deadline: float) -> Outcome:
    """openai ``Stream`` per-event work into ``ResponseStreamEvent`` + ``ResponseStreamState``;
    arguments from the completed response (checked against the delta-accumulated snapshot)."""
    pacer = Pacer(reads, deadline)
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    final, snapshot = None, None
    for sse in OpenAISSEDecoder().iter_bytes(iter(pacer)):
        for out in state.handle_event(
            openai_construct(type_=ResponseStreamEvent, value=sse.json())
        ):
            if out.type == "response.function_call_arguments.delta":
                snapshot = out.snapshot
            elif out.type == "response.completed":
                final = out.response
    if pacer.capped:
        return Outcome(None, pacer.fed)
    assert final is not None, "the openai SDK Responses state saw no response.completed"
    text = next(item.arguments for item in final.output if item.type == "function_call")
    assert text == snapshot, "the SDK's accumulated arguments differ from the final ones"
    return Outcome(json.loads(text), pacer.fed)


def run_anthropic_sdk(reads: Sequence[bytes], deadline: float) -> Outcome:
    """anthropic ``Stream`` per-event work (SSEDecoder, skip ping, json.loads, construct_type
    into ``RawMessageStreamEvent``) + ``accumulate_event``; final ``content[0].input``."""
    pacer, snapshot, bufs = Pacer(reads, deadline), None, {}
    for sse in AnthropicSSEDecoder().iter_bytes(iter(pacer)):
        if sse.event in (None, "ping") or not sse.data:
            continue
        event = anthropic_construct(type_=RawMessageStreamEvent, value=sse.json())
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    if pacer.capped:
        return Outcome(None, pacer.fed)
    assert snapshot is not None
    return Outcome(snapshot.content[0].input, pacer.fed)


def _lc_sum(chunks: Iterator[dict[str, Any]], pacer: Pacer) -> Outcome:
    total = None
    for tcc in chunks:
        chunk = AIMessageChunk(content="", tool_call_chunks=[{**tcc, "type": "tool_call_chunk"}])
        total = chunk if total is None else total + chunk
    if pacer.capped:
        return Outcome(None, pacer.fed)
    assert total is not None, "langchain-core saw no tool call chunk"
    assert total.tool_calls, "langchain-core assembled no tool call"
    return Outcome(total.tool_calls[0]["args"], pacer.fed)


def run_langchain_openai_chat(reads: Sequence[bytes], deadline: float) -> Outcome:
    """openai SDK SSEDecoder + json.loads, one ``AIMessageChunk`` per tool-call delta, summed."""
    pacer = Pacer(reads, deadline)

    def chunks() -> Iterator[dict[str, Any]]:
        for sse in OpenAISSEDecoder().iter_bytes(iter(pacer)):
            if sse.data.startswith("[DONE]"):
                return
            for choice in sse.json()["choices"]:
                for tc in choice["delta"].get("tool_calls") or ():
                    fn = tc.get("function", {})
                    yield {
                        "name": fn.get("name"),
                        "args": fn.get("arguments"),
                        "id": tc.get("id"),
                        "index": tc.get("index"),
                    }

    return _lc_sum(chunks(), pacer)


def run_langchain_anthropic(reads: Sequence[bytes], deadline: float) -> Outcome:
    """anthropic SDK SSEDecoder + json.loads, one ``AIMessageChunk`` per tool_use event, summed."""
    pacer = Pacer(reads, deadline)

    def chunks() -> Iterator[dict[str, Any]]:
        for sse in AnthropicSSEDecoder().iter_bytes(iter(pacer)):
            if sse.event in (None, "ping") or not sse.data:
                continue
            ev = sse.json()
            if ev["type"] == "content_block_start" and ev["content_block"]["type"] == "tool_use":
                block = ev["content_block"]
                yield {"name": block["name"], "args": "", "id": block["id"], "index": ev["index"]}
            elif ev["type"] == "content_block_delta" and ev["delta"]["type"] == "input_json_delta":
                yield {
                    "name": None,
                    "args": ev["delta"]["partial_json"],
                    "id": None,
                    "index": ev["index"],
                }

    return _lc_sum(chunks(), pacer)


# ---------------------------------------------------------------------------------------------
# Providers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    """One provider's stream builder, its floor, toollatch, and the competitors."""

    name: str
    title: str
    build: Callable[[list[str], dict[str, Any], random.Random], list[bytes]]
    floor: Contender
    toollatch: Contender
    competitors: dict[str, Contender] = field(default_factory=dict)
    default_sizes: tuple[int, ...] = (KIB, 16 * KIB, 256 * KIB, MIB)


PROVIDERS = {
    p.name: p
    for p in (
        Provider(
            "openai_chat",
            "OpenAI Chat Completions (SSE)",
            lambda frags, _obj, rng: stream_openai_chat(frags, rng),
            make_floor(_pick_chat),
            make_toollatch("openai_chat"),
            {"openai SDK": run_openai_chat_sdk}
            | ({"langchain-core": run_langchain_openai_chat} if AIMessageChunk else {}),
        ),
        Provider(
            "anthropic",
            "Anthropic Messages (SSE)",
            lambda frags, _obj, rng: stream_anthropic(frags, rng),
            make_floor(_pick_anthropic),
            make_toollatch("anthropic"),
            {"anthropic SDK": run_anthropic_sdk}
            | ({"langchain-core": run_langchain_anthropic} if AIMessageChunk else {}),
        ),
        Provider(
            "openai_responses",
            "OpenAI Responses (SSE)",
            lambda frags, _obj, rng: stream_openai_responses(frags, rng),
            make_floor(_pick_responses),
            make_toollatch("openai_responses"),
            {"openai SDK": run_openai_responses_sdk},
        ),
        Provider(
            "bedrock",
            "Bedrock ConverseStream (decoded events as JSON Lines)",
            lambda frags, _obj, rng: stream_bedrock(frags, rng),
            make_floor(_pick_bedrock, separator=b"\n"),
            make_toollatch("bedrock", "jsonl"),
        ),
        Provider(
            "gemini",
            "Gemini streamGenerateContent (SSE, whole functionCall)",
            lambda _frags, obj, rng: stream_gemini(obj, rng),
            make_floor(_pick_gemini, finalize=lambda objs: objs[0]),
            make_toollatch("gemini"),
            default_sizes=(256 * KIB,),
        ),
    )
}


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One contender at one size: the best finished run, or how far a capped run got."""

    planned: int
    runs: int = 0
    best_s: float | None = None
    capped: tuple[float, float] | None = None
    """``(share of reads fed, elapsed seconds)`` when the run hit the cap."""
    skipped: str | None = None
    done: bool = False
    single_s: float | None = None
    """Best single run (``best_s`` is the best batch mean when the run is short: BATCH_S)."""


@dataclass
class Case:
    """One provider at one size: its stream and every contender's cell."""

    size: int
    arg_bytes: int
    events: int
    cells: dict[str, Cell]


def repeats_for(size: int, quick: bool) -> int:
    """Best-of-N: 15 up to 16 KiB, 9 above (quick: 2 / 1).

    The machine is shared: more repeats let the best run find a quiet moment. Runs of the
    slow contenders stop repeating after one slow run (see ``SLOW_RUN_S``), so the extra
    repeats cost seconds, not minutes."""
    if quick:
        return 2 if size <= 16 * KIB else 1
    return 15 if size <= 16 * KIB else 9


def _as_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    try:
        return dict(value)
    except (TypeError, ValueError):
        return value


def time_one(
    name: str, fn: Contender, reads: list[bytes], expected: Any, cell: Cell, cap_s: float
) -> None:
    """One timed run of ``fn`` into ``cell``; raises if a finished run got other arguments."""
    gc.collect()
    start = time.perf_counter()
    out = fn(reads, start + cap_s)
    elapsed = time.perf_counter() - start
    if out.arguments is None:
        cell.capped, cell.done = (out.fed / len(reads), elapsed), True
        return
    if _as_plain(out.arguments) != expected:
        raise SystemExit(f"FAIL: {name} produced different arguments than the generated object")
    cell.runs += 1
    cell.single_s = elapsed if cell.single_s is None else min(cell.single_s, elapsed)
    if elapsed < BATCH_S:
        # A run this short is mostly timer and scheduling noise, and it starts with caches
        # that the contender run before it left cold: time a batch of back-to-back runs and
        # take their mean, as timeit does (the steady-state cost per stream).
        batch = min(MAX_BATCH, int(BATCH_S / max(elapsed, 1e-6)))
        start = time.perf_counter()
        for _ in range(batch):
            fn(reads, math.inf)
        elapsed = (time.perf_counter() - start) / batch
    cell.best_s = elapsed if cell.best_s is None else min(cell.best_s, elapsed)
    if elapsed > SLOW_RUN_S:
        cell.done = True


def measure(
    contenders: dict[str, Contender],
    reads: list[bytes],
    expected: Any,
    repeats: int,
    cap_s: float,
    skip: dict[str, str],
) -> dict[str, Cell]:
    """Round-robin repeats (every contender once per round, so load drift hits all alike)."""
    cells = {name: Cell(planned=repeats, skipped=skip.get(name)) for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            cell = cells[name]
            if not (cell.done or cell.skipped):
                time_one(name, fn, reads, expected, cell, cap_s)
    return cells


def build_case(provider: Provider, size: int, seed: int) -> tuple[list[bytes], Any, int]:
    """``(reads, expected arguments, argument bytes)`` for one provider and size (seeded)."""
    rng = random.Random(f"{seed}-{size}")
    text, obj = make_arguments(size, rng)
    frags = split_fragments(text, rng)
    reads = provider.build(frags, obj, random.Random(f"{seed}-{size}-{provider.name}"))
    return reads, obj, len(text.encode())


def run_provider(provider: Provider, sizes: Sequence[int], opts: argparse.Namespace) -> list[Case]:
    """Every size of one provider, smallest first; a competitor capped at one size is skipped
    at the larger ones (it would only be capped again)."""
    contenders = {"floor": provider.floor, "toollatch": provider.toollatch, **provider.competitors}
    skip: dict[str, str] = {}
    cases = []
    for size in sorted(sizes):
        reads, expected, arg_bytes = build_case(provider, size, opts.seed)
        repeats = opts.repeats or repeats_for(size, opts.quick)
        cells = measure(contenders, reads, expected, repeats, opts.timeout_s, skip)
        cases.append(Case(size, arg_bytes, len(reads), cells))
        for name, cell in cells.items():
            if cell.capped and name not in skip:
                skip[name] = f"skipped (capped at {fmt_size(size)})"
        summary = ", ".join(f"{n} {fmt_cell(c, opts.timeout_s)}" for n, c in cells.items())
        print(f"  {provider.name} {fmt_size(size)}: {summary}", file=sys.stderr, flush=True)
    return cases


def measure_growth(provider: Provider, opts: argparse.Namespace) -> dict[str, float] | None:
    """The growth exponent's own measurement, or ``None`` when the run does not cover both
    ``GROWTH_SIZES``: ``{"floor": k, "toollatch": k}`` from each contender's best time at
    each size, and ``"floor median"``/``"toollatch median"`` (the median of the per-round
    exponents) beside them.

    The speed of this shared machine drifts by up to 1.4x within minutes (the Anthropic floor
    at 1 MiB: 183 and 257 ms two minutes apart, CPU time moving with wall time, so it is not
    time stolen from the process), and the table measures each size minutes after the
    previous one, around the competitors' long runs: the exponent taken from its columns
    moves by +-0.1. Here each of ``GROWTH_ROUNDS`` rounds takes one contender's samples of
    both sizes back to back, in the order small, big, big, small, so both sizes are sampled
    across the same minutes. A sample of the small size is the sum of ``big // small``
    consecutive runs, so that samples of both sizes last about as long: the best of many
    short samples catches a fast moment of the machine more often than the best of as many
    long ones, which made even the floor's exponent come out at 1.03-1.07 from single runs.
    A slowdown only ever adds time, so the exponent is taken from the best sample at each
    size, as the table takes its times. The median of the per-round exponents (each from the
    round's two means, where a steady drift within the round cancels) is reported too: one
    slowed sample moves it, and over 11 rounds of single runs it gave 1.18 for a count of
    instructions that grows x3.99 (exponent 0.998)."""
    if not set(GROWTH_SIZES) <= set(sizes_for(provider, opts)):
        return None
    contenders = {"floor": provider.floor, "toollatch": provider.toollatch}
    built = {size: build_case(provider, size, opts.seed) for size in GROWTH_SIZES}
    small, big = GROWTH_SIZES
    scale = math.log(big / small)
    runs = {small: big // small, big: 1}  # runs per sample: samples of equal length
    best = {name: {small: math.inf, big: math.inf} for name in contenders}
    rounds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(opts.repeats or GROWTH_ROUNDS):
        for name, fn in contenders.items():
            times = {small: 0.0, big: 0.0}
            for size in (small, big, big, small):
                reads, expected, _ = built[size]
                sample = 0.0
                for _ in range(runs[size]):
                    gc.collect()
                    start = time.perf_counter()
                    out = fn(reads, math.inf)
                    sample += time.perf_counter() - start
                    if _as_plain(out.arguments) != expected:
                        raise SystemExit(f"FAIL: {name} produced different arguments (growth)")
                times[size] += sample
                best[name][size] = min(best[name][size], sample / runs[size])
            rounds[name].append(math.log(times[big] / (times[small] / runs[small])) / scale)
    found = {name: math.log(t[big] / t[small]) / scale for name, t in best.items()}
    for name, ks in rounds.items():
        found[f"{name} median"] = statistics.median(ks)
    return found


def warm_up(providers: Sequence[Provider], seed: int) -> None:
    """One untimed 1 KiB run of every contender of every provider, before anything is timed:
    imports (adapters load lazily) and lazy pydantic schema building are not what we measure,
    and importing everything up front pins the code the whole run measures."""
    for provider in providers:
        reads, expected, _ = build_case(provider, KIB, seed)
        contenders = {"floor": provider.floor, "toollatch": provider.toollatch}
        for name, fn in {**contenders, **provider.competitors}.items():
            time_one(name, fn, reads, expected, Cell(planned=1), math.inf)


def peak_memory(fn: Contender, reads: list[bytes]) -> int:
    """Peak bytes traced while ``fn`` runs once (the input reads are allocated before)."""
    gc.collect()
    tracemalloc.start()
    try:
        fn(reads, math.inf)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def profile_toollatch(provider: Provider, size: int, seed: int, top: int = 15) -> str:
    """cProfile of one toollatch run; the ``top`` functions by own time."""
    reads, _, _ = build_case(provider, size, seed)
    profiler = cProfile.Profile()
    profiler.runcall(provider.toollatch, reads, math.inf)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------
# Read sizes, previews and the per-request gateway (--reads)
# ---------------------------------------------------------------------------------------------

READ_SHAPES = ("one event", "16 KiB", "whole stream")
"""How a stream is cut into network reads: one event per read (as the table above), 16 KiB
reads (cut anywhere, as a socket delivers them), or the whole stream in one read."""
READ_PROVIDERS = ("openai_chat", "anthropic", "openai_responses", "bedrock")
"""The providers with a per-call fragment path (Gemini sends a call whole)."""
READ_ROUNDS = 5


def reshape(reads: list[bytes], shape: str) -> list[bytes]:
    """``reads`` (one event each) cut as ``shape`` says (see ``READ_SHAPES``)."""
    if shape == "one event":
        return reads
    blob = b"".join(reads)
    if shape == "whole stream":
        return [blob]
    step = 16 * KIB
    return [blob[i : i + step] for i in range(0, len(blob), step)]


def make_toollatch_previews(provider: str, framing: str, preview: Any) -> Contender:
    """:func:`make_toollatch` with previews on (``PreviewUpdated`` notices produced, dropped)."""

    def run(reads: Sequence[bytes], deadline: float) -> Outcome:
        parser = StreamParser(
            provider,  # type: ignore[arg-type]
            framing=framing,  # type: ignore[arg-type]
            limits=LIMITS,
            previews=PreviewPolicy(default=preview),
        )
        for read in reads:
            parser.feed(read)
        calls = parser.finish().calls
        assert len(calls) == 1
        assert calls[0].state is CallState.COMMITTED
        return Outcome(calls[0].arguments, len(reads))

    return run


def _sample(
    fn: Contender,
    reads: list[bytes],
    expected: Any,
    runs: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds for ``runs`` back-to-back runs (collected before each; arguments checked), by
    ``clock`` (``bench_targets.py`` passes ``time.process_time``: CPU, not the wall)."""
    total = 0.0
    for _ in range(runs):
        gc.collect()
        start = clock()
        out = fn(reads, math.inf)
        total += clock() - start
        if _as_plain(out.arguments) != expected:
            raise SystemExit("FAIL: a contender produced different arguments (--reads)")
    return total


def read_size_row(
    contenders: dict[str, Contender], built: dict[int, tuple[list[bytes], Any, int]], rounds: int
) -> dict[str, dict[int, float]]:
    """Best time per run of each contender at both ``GROWTH_SIZES``: every round takes each
    contender's samples back to back in the order small, big, big, small (a small sample is
    ``big // small`` runs, so samples last alike; see :func:`measure_growth`)."""
    small, big = GROWTH_SIZES
    runs = {small: big // small, big: 1}
    best = {name: {small: math.inf, big: math.inf} for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            for size in (small, big, big, small):
                reads, expected, _ = built[size]
                t = _sample(fn, reads, expected, runs[size]) / runs[size]
                best[name][size] = min(best[name][size], t)
    return best


def reads_report(opts: argparse.Namespace) -> list[str]:
    """The read-size table (toollatch / floor at 1 MiB and the growth exponent, per provider
    and read shape), the previews rows and the gateway rows."""
    rounds = opts.repeats or READ_ROUNDS
    small, big = GROWTH_SIZES
    scale = math.log(big / small)
    lines = [
        "### Read sizes (1 MiB of arguments; exponent 256 KiB -> 1 MiB)",
        "",
        "| Provider | Reads | Floor ms | toollatch ms | toollatch / floor | exponent (floor) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    worst, worst_k = 0.0, 0.0
    names = [n for n in opts.providers if n in READ_PROVIDERS]
    for name in names:
        provider = PROVIDERS[name]
        framing = "jsonl" if name == "bedrock" else "sse"
        cases = {size: build_case(provider, size, opts.seed) for size in GROWTH_SIZES}
        for shape in READ_SHAPES:
            built = {s: (reshape(r, shape), e, b) for s, (r, e, b) in cases.items()}
            contenders = {"floor": provider.floor, "toollatch": make_toollatch(name, framing)}
            best = read_size_row(contenders, built, rounds)
            ratio_ = best["toollatch"][big] / best["floor"][big]
            k = {n: math.log(t[big] / t[small]) / scale for n, t in best.items()}
            worst, worst_k = max(worst, ratio_), max(worst_k, k["toollatch"])
            row = (
                f"| {name} | {shape} | {fmt_ms(best['floor'][big])} "
                f"| {fmt_ms(best['toollatch'][big])} | {ratio_:.2f}x "
                f"| {k['toollatch']:.2f} ({k['floor']:.2f}) |"
            )
            print(row, file=sys.stderr, flush=True)
            lines.append(row)
    lines += [
        "",
        f"- worst toollatch / floor: **{worst:.2f}x** (target <= 1.3x: "
        f"{'met' if worst <= 1.3 else 'NOT met'}); worst exponent **{worst_k:.2f}** "
        f"(target <= 1.05: {'met' if worst_k <= 1.05 else 'NOT met'})",
        f"- best of {rounds} rounds, each timing floor then toollatch at 256 KiB and 1 MiB "
        "(small, big, big, small; a 256 KiB sample is 4 runs in a row); gc on, collected "
        "before each run",
        "",
    ]
    lines += previews_report(names, opts, rounds)
    lines += gateway_report(opts)
    return lines


def previews_report(names: Sequence[str], opts: argparse.Namespace, rounds: int) -> list[str]:
    """toollatch with previews on (``full``, and ``fields`` showing ``/path``) / the floor."""
    modes = {
        "full": ToolPreview(mode="full"),
        "fields": ToolPreview(mode="fields", fields=("/path",)),
    }
    lines = [
        "### Previews on (1 MiB of arguments, one event per read; default every_bytes)",
        "",
        "| Provider | Floor ms | full ms | full / floor | fields ms | fields / floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    big = GROWTH_SIZES[1]
    worst = 0.0
    for name in names:
        provider = PROVIDERS[name]
        framing = "jsonl" if name == "bedrock" else "sse"
        built = build_case(provider, big, opts.seed)
        contenders = {"floor": provider.floor}
        for mode, preview in modes.items():
            contenders[mode] = make_toollatch_previews(name, framing, preview)
        best = dict.fromkeys(contenders, math.inf)
        for _ in range(rounds):
            for n, fn in contenders.items():
                best[n] = min(best[n], _sample(fn, built[0], built[1], 1))
        cells = [fmt_ms(best["floor"])]
        for mode in modes:
            worst = max(worst, best[mode] / best["floor"])
            cells += [fmt_ms(best[mode]), f"{best[mode] / best['floor']:.2f}x"]
        row = f"| {name} | " + " | ".join(cells) + " |"
        print(row, file=sys.stderr, flush=True)
        lines.append(row)
    verdict = "met" if worst <= 1.5 else "NOT met"
    return [*lines, "", f"- worst: **{worst:.2f}x** (target <= 1.5x: {verdict})", ""]


def gateway_tools(count: int = 20) -> list[dict[str, Any]]:
    """``count`` distinct tool dicts with small object schemas (``write_file`` among them)."""
    tools = []
    for i in range(count):
        props: dict[str, Any] = {f"field_{j}": {"type": "string"} for j in range(4)}
        props["limit"] = {"type": "integer", "minimum": 0}
        tools.append(
            {
                "name": TOOL_NAME if i == 0 else f"tool_{i}",
                "description": f"tool number {i}",
                "parameters": {"type": "object", "properties": props},
            }
        )
    tools[0]["parameters"] = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }
    return tools


def gateway_report(opts: argparse.Namespace) -> list[str]:
    """A gateway that builds a parser per request from 20 tool dicts, against one that
    shares a :class:`Gate`: microseconds per request (build, feed a 1 KiB stream, finish)."""
    tools = gateway_tools()
    gate = Gate(tools, limits=LIMITS)
    provider = PROVIDERS["openai_chat"]
    reads, expected, _ = build_case(provider, KIB, opts.seed)

    def per_request(shared: bool) -> float:
        start = time.perf_counter()
        for _ in range(200):
            if shared:
                parser = StreamParser("openai_chat", gate=gate)
            else:
                parser = StreamParser("openai_chat", tools=tools, limits=LIMITS)
            for read in reads:
                parser.feed(read)
            (call,) = parser.finish().committed()
            assert call.arguments == expected
        return (time.perf_counter() - start) / 200

    best = {True: math.inf, False: math.inf}
    per_request(True)
    per_request(False)  # (compiles the schemas once: the cache is per process)
    for _ in range(opts.repeats or 9):
        for shared in (True, False):
            gc.collect()
            best[shared] = min(best[shared], per_request(shared))
    ratio_ = best[False] / best[True]
    verdict = "met" if ratio_ <= 1.3 else "NOT met"
    return [
        "### Gateway: a parser per request (OpenAI chat, 1 KiB of arguments, 20 tools)",
        "",
        "| Parser built with | us per request |",
        "|---|---:|",
        f"| a shared `Gate` | {best[True] * 1e6:.0f} |",
        f"| `tools=` 20 dicts | {best[False] * 1e6:.0f} |",
        "",
        f"- per-request tools / shared gate: **{ratio_:.2f}x** (target <= 1.3x: {verdict}); "
        f"best of {opts.repeats or 9} batches of 200 requests, alternating",
        "",
    ]


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def fmt_size(size: int) -> str:
    if size % MIB == 0:
        return f"{size // MIB} MiB"
    return f"{size // KIB} KiB" if size % KIB == 0 else f"{size} B"


def fmt_ms(seconds: float) -> str:
    """Milliseconds with about three significant digits."""
    ms = seconds * 1000
    if ms < 1:
        return f"{ms:.3f}"
    if ms < 10:
        return f"{ms:.2f}"
    return f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def fmt_cell(cell: Cell, cap_s: float) -> str:
    """Milliseconds of the best run; ``> cap`` with progress and a marked extrapolation."""
    if cell.skipped:
        return cell.skipped
    if cell.capped:
        share, elapsed = cell.capped
        guess = f", ~{fmt_ms(elapsed / share)} extrapolated*" if share > 0 else ""
        return f"> {fmt_ms(cap_s)} ({share:.0%} done{guess})"
    assert cell.best_s is not None
    note = f" (n={cell.runs})" if cell.runs < cell.planned else ""
    return fmt_ms(cell.best_s) + note


def ratio(num: Cell, den: Cell, cap_s: float) -> str:
    """``num / den`` as ``1.23x``; ``> N x`` when ``num`` was capped."""
    if den.best_s is None or num.skipped:
        return "-"
    if num.capped:
        return f"> {cap_s / den.best_s:,.0f}x"
    assert num.best_s is not None
    return f"{num.best_s / den.best_s:.2f}x"


def exponent(cases: Sequence[Case], name: str) -> float | None:
    """Time-growth exponent from the table's columns: log(t_1M / t_256K) / log(4)."""
    times = {c.size: c.cells[name].best_s for c in cases}
    small, big = (times.get(size) for size in GROWTH_SIZES)
    if not small or not big:
        return None
    return math.log(big / small) / math.log(GROWTH_SIZES[1] / GROWTH_SIZES[0])


def provider_table(
    provider: Provider,
    cases: Sequence[Case],
    cap_s: float,
    growth: dict[str, float] | None = None,
) -> list[str]:
    """The markdown table and target lines for one provider."""
    comps = list(provider.competitors)
    head = ["Size", "Arg bytes", "Events", "Floor ms", "toollatch ms", "toollatch / floor"]
    for comp in comps:
        head += [f"{comp} ms", f"{comp} / toollatch"]
    lines = [
        f"### {provider.title}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" for _ in head) + "|",
    ]
    for case in cases:
        c = case.cells
        row = [
            fmt_size(case.size),
            f"{case.arg_bytes:,}",
            f"{case.events:,}",
            fmt_cell(c["floor"], cap_s),
            fmt_cell(c["toollatch"], cap_s),
            ratio(c["toollatch"], c["floor"], cap_s),
        ]
        for comp in comps:
            row += [fmt_cell(c[comp], cap_s), ratio(c[comp], c["toollatch"], cap_s)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += target_lines(cases, growth)
    return lines


def target_lines(cases: Sequence[Case], growth: dict[str, float] | None = None) -> list[str]:
    """Max toollatch/floor ratio and the growth exponents, each against its target (the
    exponent from ``growth``, the alternating measurement, when there is one)."""
    ratios = [
        c.cells["toollatch"].best_s / c.cells["floor"].best_s  # type: ignore[operator]
        for c in cases
        if c.cells["toollatch"].best_s and c.cells["floor"].best_s
    ]
    out = []
    if ratios:
        worst = max(ratios)
        verdict = "met" if worst <= 1.5 else "NOT met"
        out.append(f"- toollatch / floor, worst size: **{worst:.2f}x** (target <= 1.5x: {verdict})")
    singles = [
        f"{fmt_size(c.size)} {c.cells['toollatch'].single_s / c.cells['floor'].single_s:.2f}x"
        for c in cases
        if c.cells["toollatch"].single_s
        and c.cells["floor"].single_s
        and c.cells["floor"].best_s != c.cells["floor"].single_s
    ]
    if singles:
        out.append(
            "- the same ratio from single runs, each right after the other contenders "
            f"(cold caches; not batched): {', '.join(singles)}"
        )
    exp_t, exp_f = exponent(cases, "toollatch"), exponent(cases, "floor")
    if growth is not None:
        verdict = "met" if growth["toollatch"] <= 1.05 else "NOT met"
        out.append(
            f"- time-growth exponent 256 KiB -> 1 MiB, toollatch: **{growth['toollatch']:.2f}** "
            f"(target <= 1.05: {verdict}; floor: {growth['floor']:.2f}), from the best of "
            f"{2 * GROWTH_ROUNDS} samples at each size (a 256 KiB sample: 4 runs in a row), "
            f"both sizes alternating (small, big, big, small) over {GROWTH_ROUNDS} rounds; "
            "the median of the rounds' own exponents: "
            f"toollatch {growth['toollatch median']:.2f}, floor {growth['floor median']:.2f}"
        )
        if exp_t is not None and exp_f is not None:
            out.append(
                f"- the same exponent from the table's columns: toollatch {exp_t:.2f}, "
                f"floor {exp_f:.2f}"
            )
    elif exp_t is not None:
        verdict = "met" if exp_t <= 1.05 else "NOT met"
        floor_note = f"; floor: {exp_f:.2f}" if exp_f is not None else ""
        out.append(
            f"- time-growth exponent 256 KiB -> 1 MiB, toollatch: **{exp_t:.2f}** "
            f"(target <= 1.05: {verdict}{floor_note}), from the table's columns"
        )
    return [*out, ""]


def memory_lines(rows: Sequence[tuple[str, int, int, int]]) -> list[str]:
    """``(provider, arg bytes, toollatch peak, floor peak)`` rows as a table."""
    if not rows:
        return []
    lines = [
        "### Peak memory (tracemalloc, one run, largest size per provider)",
        "",
        "| Provider | Arg bytes | toollatch peak | x args | floor peak | x args |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, arg_bytes, tl, fl in rows:
        lines.append(
            f"| {name} | {arg_bytes:,} | {tl / MIB:.2f} MiB | {tl / arg_bytes:.1f}x "
            f"| {fl / MIB:.2f} MiB | {fl / arg_bytes:.1f}x |"
        )
    return [*lines, ""]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, check=True)
    return done.stdout.decode(errors="replace").strip()


def source_state() -> str:
    """The toollatch source being measured: commit, plus a digest of uncommitted src/ changes."""
    try:
        rev = _git("rev-parse", "--short", "HEAD")
        diff = _git("diff", "HEAD", "--", "../src") + _git(
            "ls-files", "--others", "--exclude-standard", "--", "../src"
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    if not diff:
        return f"git {rev}"
    digest = hashlib.sha1(diff.encode()).hexdigest()[:8]
    return f"git {rev} + uncommitted changes in src/ (diff digest {digest})"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return found.group(1).strip() if found else platform.processor() or "unknown"


def _repeats_text(opts: argparse.Namespace) -> str:
    if opts.repeats:
        plan = f"best of {opts.repeats}"
    elif opts.quick:
        plan = "best of 2 (<= 16 KiB), 1 above (--quick)"
    else:
        plan = "best of 15 (<= 16 KiB), 9 (256 KiB and 1 MiB)"
    return (
        f"{plan}; a run under {BATCH_S * 1000:g} ms is timed as the mean of a batch of "
        f"back-to-back runs (at most {MAX_BATCH}); a run over {SLOW_RUN_S:g} s is not "
        "repeated; gc enabled, collected before each run"
    )


_SRC_AT_START = ""


def _src_tree() -> str:
    """What identifies the measured code: the committed src/ tree and any uncommitted diff."""
    try:
        return _git("rev-parse", "HEAD:src") + _git("diff", "HEAD", "--", "../src")
    except (OSError, subprocess.CalledProcessError):
        return ""


def _changed_note(source: str) -> str:
    now = source_state()
    if now == source or _src_tree() == _SRC_AT_START:
        return ""  # (commits outside src/ during the run do not change what was measured)
    return f" (**src/ changed during the run**; now {now})"


def machine_lines(
    opts: argparse.Namespace, load_start: tuple[float, ...], source: str
) -> list[str]:
    """Machine, software and run settings, as a bullet list."""
    dists = ("toollatch", "orjson", "openai", "anthropic", "langchain-core", "pydantic", "jiter")
    load_end = os.getloadavg()
    return [
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- CPU: {_cpu_model()} ({os.cpu_count()} logical CPUs, shared; nice {os.nice(0)})",
        f"- Load average (1 min) at start / end: {load_start[0]:.2f} / {load_end[0]:.2f}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}) "
        f"on {platform.system()} {platform.release()}",
        "- Packages: " + ", ".join(f"{d} {_version(d)}" for d in dists),
        f"- toollatch source: {source}" + _changed_note(source),
        f"- Settings: cap {opts.timeout_s:g} s per run, seed {opts.seed}, {_repeats_text(opts)}",
        "",
    ]


def write_readme(body: list[str]) -> None:
    """Replace the generated section of ``benchmarks/README.md`` (keeping the intro above)."""
    old = README.read_text() if README.exists() else "# Benchmarks\n\n"
    intro = old.split(BEGIN_MARK)[0].rstrip() + "\n\n"
    generated = "\n".join(body).rstrip()
    README.write_text(f"{intro}{BEGIN_MARK}\n\n{generated}\n\n{END_MARK}\n")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    found = re.fullmatch(r"\s*(\d+)\s*([KkMm]i?[Bb]?)?\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 1K, 16K, 256K, 1M)")
    unit = (found.group(2) or "").upper()[:1]
    return int(found.group(1)) * {"": 1, "K": KIB, "M": MIB}[unit]


CALL_COUNTS = (200, 2000, 20000)
"""N complete chat calls in one read (``--calls``): issue 28 R8."""
CALL_ROUNDS = 5


def many_calls_read(n: int) -> bytes:
    """One read holding ``n`` complete OpenAI chat tool calls (each ``{}`` in the chunk that
    opens it, as servers that send whole calls do), the finish chunk and ``[DONE]``."""
    out = bytearray()
    for i in range(n):
        entry = {
            "index": i,
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_time", "arguments": "{}"},
        }
        delta = {"tool_calls": [entry]}
        out += _data(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        )
    end = {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    out += _data({"id": "c", "object": "chat.completion.chunk", "choices": [end]})
    return bytes(out) + b"data: [DONE]\n\n"


def _calls_run(data: bytes, limits: Limits) -> tuple[float, int, int]:
    """(seconds, stream events fed to the assembler, calls in the Round) of one parser fed
    ``data`` in one read, then finished."""
    parser = StreamParser("openai_chat", limits=limits)
    count = 0
    feed = parser.assembler.feed

    def counting(event: Any) -> Any:
        nonlocal count
        count += 1
        return feed(event)

    parser.assembler.feed = counting  # type: ignore[method-assign]
    gc.collect()
    start = time.perf_counter()
    parser.feed(data)
    round_ = parser.finish()
    return time.perf_counter() - start, count, len(round_.calls)


def calls_report(opts: argparse.Namespace) -> list[str]:
    """N complete chat calls in one read, at the default limits (past twice
    ``max_calls_per_round`` the rest is not kept) and with every call kept: best time, time
    per call, the stream events the assembler was fed, and the tracemalloc peak."""
    rounds = opts.repeats or CALL_ROUNDS
    lines = [
        "### N complete chat calls in one read (issue 28 R8)",
        "",
        "| limits | N calls | read KiB | calls kept | events fed | best ms | us / call "
        "| peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, keep in (("default (64 kept)", False), ("max_calls_per_round = N", True)):
        for n in CALL_COUNTS:
            data = many_calls_read(n)
            limits = Limits(max_calls_per_round=n) if keep else Limits()
            runs = [_calls_run(data, limits) for _ in range(rounds)]
            best = min(t for t, _, _ in runs)
            _, events, kept = runs[0]
            tracemalloc.start()
            _calls_run(data, limits)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            row = (
                f"| {label} | {n:,} | {len(data) / KIB:,.0f} | {kept:,} | {events:,} "
                f"| {best * 1000:.1f} | {best / n * 1e6:.1f} | {peak / MIB:.1f} |"
            )
            print(row, file=sys.stderr, flush=True)
            lines.append(row)
    lines += [
        "",
        f"- best of {rounds} runs each (gc on, collected before each run); *events fed*: "
        "calls of `Assembler.feed` (fragments go by `feed_fragments` and are not counted)",
        "",
    ]
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: sizes <= 16 KiB, 5 s cap, 1-2 repeats, no README",
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [parse_size(x) for x in s.split(",")],
        help="comma list for every provider, e.g. 1K,16K,256K,1M "
        "(default: 1K,16K,256K,1M; Gemini 256K)",
    )
    parser.add_argument(
        "--providers",
        type=lambda s: s.split(","),
        default=list(PROVIDERS),
        help=f"comma list of {', '.join(PROVIDERS)}",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="per-run cap in seconds (default 60; --quick 5)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="override best-of-N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--readme",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite benchmarks/README.md (default: yes unless --quick)",
    )
    parser.add_argument(
        "--reads",
        action="store_true",
        help="only the read-size table (one event, 16 KiB, whole stream), previews on and "
        "the per-request gateway case (a few minutes; prints, never rewrites the README)",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="only the table of N complete chat calls in one read (200, 2,000, 20,000; "
        "seconds; prints, never rewrites the README)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print a cProfile (top 15 by own time) of toollatch at 256 KiB "
        "for each selected provider",
    )
    opts = parser.parse_args(argv)
    unknown = set(opts.providers) - set(PROVIDERS)
    if unknown:
        parser.error(f"unknown provider(s) {', '.join(sorted(unknown))}")
    if opts.timeout_s is None:
        opts.timeout_s = 5.0 if opts.quick else 60.0
    if opts.readme is None:
        opts.readme = not opts.quick
    return opts


def sizes_for(provider: Provider, opts: argparse.Namespace) -> list[int]:
    if opts.sizes:
        return opts.sizes
    if opts.quick:
        return [s for s in provider.default_sizes if s <= 16 * KIB] or [16 * KIB]
    return list(provider.default_sizes)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    load_start = os.getloadavg()
    source = source_state()
    if opts.calls:
        print(f"toollatch from {Path(toollatch.__file__).parent}", file=sys.stderr)
        body = calls_report(opts)
        print("\n".join([*body, "### Machine", "", *machine_lines(opts, load_start, source)]))
        return 0
    if opts.reads:
        print(f"toollatch from {Path(toollatch.__file__).parent}", file=sys.stderr)
        warm_up([PROVIDERS[name] for name in opts.providers], opts.seed)
        body = reads_report(opts)
        print("\n".join([*body, "### Machine", "", *machine_lines(opts, load_start, source)]))
        return 0
    global _SRC_AT_START  # noqa: PLW0603 - one run per process
    _SRC_AT_START = _src_tree()
    warm_up([PROVIDERS[name] for name in opts.providers], opts.seed)
    body: list[str] = []
    memory: list[tuple[str, int, int, int]] = []
    for name in opts.providers:
        provider = PROVIDERS[name]
        print(f"{provider.title} ...", file=sys.stderr, flush=True)
        cases = run_provider(provider, sizes_for(provider, opts), opts)
        growth = measure_growth(provider, opts)
        if growth is not None:
            print(
                f"  {provider.name} growth exponent (best runs): toollatch "
                f"{growth['toollatch']:.3f}, floor {growth['floor']:.3f}; median of rounds: "
                f"toollatch {growth['toollatch median']:.3f}, floor {growth['floor median']:.3f}",
                file=sys.stderr,
                flush=True,
            )
        body += provider_table(provider, cases, opts.timeout_s, growth)
        reads, _, arg_bytes = build_case(provider, cases[-1].size, opts.seed)
        peaks = peak_memory(provider.toollatch, reads), peak_memory(provider.floor, reads)
        memory.append((f"{name} ({fmt_size(cases[-1].size)})", arg_bytes, *peaks))
    if "extrapolated*" in "\n".join(body):
        body += [EXTRAPOLATION_NOTE, ""]
    body += memory_lines(memory)
    body += ["### Machine", "", *machine_lines(opts, load_start, source)]
    print("\n".join(body))
    if opts.profile:
        for name in opts.providers:
            print(f"### cProfile: toollatch, {name}, 256 KiB (top 15 by own time)")
            print(profile_toollatch(PROVIDERS[name], 256 * KIB, opts.seed))
    if opts.readme:
        write_readme(body)
        print(f"wrote {README.relative_to(HERE.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
