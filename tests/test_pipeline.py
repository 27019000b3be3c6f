"""StreamParser's one-event fast path decides exactly as the stages do, read by read.

``StreamParser.feed`` takes a shortcut for a network read that is exactly one event carrying a
bare argument fragment (decoder ``single`` -> orjson -> adapter ``_continuation`` -> assembler
``_append``), and a shorter one when the event is spelled as the adapter's ``_raw`` says (only
the fragment's JSON string is decoded). ``keep_events=True`` turns both off, so every test here
feeds the same reads to both parsers and compares the rounds, the notices and the finish
notices; and counts the reads each shortcut took, so that a test whose streams never reach one
fails instead of passing vacuously.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus_dir
from toollatch import Limits, PreviewPolicy, ToolPreview
from toollatch._pipeline import StreamParser
from toollatch._registry import detect
from toollatch.testing import jsonl, sse, summary

EXAMPLES = Path(__file__).parent.parent / "examples"
TOOLS = json.loads((EXAMPLES / "tools.json").read_text())


def per_event(data: bytes, framing: str) -> list[bytes]:
    """One read per event: SSE split after each blank line, JSON Lines after each line."""
    sep = b"\n\n" if framing == "sse" else b"\n"
    parts = data.split(sep)
    reads = [p + sep for p in parts[:-1]]
    return [*reads, parts[-1]] if parts[-1] else reads


RAW_TAKEN: list[int] = []
"""Reads the raw shortcut took in the last :func:`run` (one item, replaced on each run)."""


def run(
    provider: str, framing: str, reads: list[bytes], *, fast: bool, **options: Any
) -> tuple[dict[str, Any], list[str], int]:
    """(summary, notices as reprs, reads either shortcut took) for one parser; the raw
    shortcut's share goes to ``RAW_TAKEN``."""
    parser = StreamParser(provider, framing=framing, keep_events=not fast, **options)  # type: ignore[arg-type]
    taken = decoded = 0
    append, continuation = parser._append, parser._continuation

    def counting(key: Any, fragment: str) -> Any:
        nonlocal taken
        taken += 1
        return append(key, fragment)

    def counting_decoded(event: dict[str, Any], sse_event: str | None) -> Any:
        nonlocal decoded
        hit = continuation(event, sse_event)
        decoded += hit is not None
        return hit

    parser._append = counting
    parser._continuation = counting_decoded
    notices: list[str] = []
    for read in reads:
        notices += map(repr, parser.feed(read))
    round_ = parser.finish()
    notices += ["finish", *map(repr, parser.finish_notices)]
    RAW_TAKEN[:] = [taken - decoded]
    return summary(round_), notices, taken


def same_both_ways(provider: str, framing: str, reads: list[bytes], **options: Any) -> int:
    """Reads either shortcut took (the raw one's share in ``RAW_TAKEN``)."""
    slow = run(provider, framing, reads, fast=False, **options)
    assert slow[2] == 0  # keep_events really turns the shortcuts off
    fast = run(provider, framing, reads, fast=True, **options)
    assert fast[:2] == slow[:2]
    return fast[2]


# -- hand-written streams ----------------------------------------------------------------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [choice], **extra}


def chat_args(index: int, text: str, **extra: Any) -> dict[str, Any]:
    return chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]}, **extra)


def chat_stream(
    fragments: list[str], *, finish: str = "tool_calls", obfuscation: bool = False
) -> bytes:
    opener = {"index": 0, "id": "call_1", "type": "function"}
    opener["function"] = {"name": "write_file", "arguments": ""}
    events: list[Any] = [chat_chunk({"role": "assistant", "tool_calls": [opener]})]
    for i, fragment in enumerate(fragments):
        extra = {"obfuscation": "x" * (i % 7)} if obfuscation else {}
        events.append(chat_args(0, fragment, **extra))
    events.append(chat_chunk({}, finish))
    return sse(*events, done=True)


def anthropic_stream(
    fragments: list[str], *, stop: str = "tool_use", padded: bool = False, inner: bool = False
) -> bytes:
    start = {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}
    events: list[Any] = [
        {"type": "message_start", "message": {"id": "m", "content": [], "model": "x"}},
        {"type": "content_block_start", "index": 0, "content_block": start},
    ]
    for fragment in fragments:
        delta = {"type": "input_json_delta", "partial_json": fragment}
        events.append({"type": "content_block_delta", "index": 0, "delta": delta})
    events += [
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": stop}},
        {"type": "message_stop"},
    ]
    data = sse(*events, named=True)
    if padded:  # Anthropic pads its JSON with spaces (parallel_empty_input_padded.sse)
        data = data.replace(b"}\n\n", b"}   \n\n")
    if inner:  # ... also between the last two braces (max_tokens_truncated_tool_use.sse)
        data = data.replace(b"}}\n\n", b"}      }\n\n")
    return data


def responses_stream(fragments: list[str]) -> bytes:
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "write_file"}
    events: list[Any] = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "arguments": ""}}
    ]
    for n, fragment in enumerate(fragments):
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                "sequence_number": n,
                "item_id": "fc_1",
                "output_index": 0,
                "delta": fragment,
            }
        )
    text = "".join(fragments)
    events += [
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "arguments": text},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**item, "arguments": text},
        },
        {"type": "response.completed", "response": {"status": "completed"}},
    ]
    return sse(*events, named=True)


def bedrock_stream(fragments: list[str]) -> bytes:
    start = {"toolUse": {"toolUseId": "tu_1", "name": "write_file"}}
    events: list[Any] = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"start": start, "contentBlockIndex": 0}},
    ]
    for fragment in fragments:
        delta = {"delta": {"toolUse": {"input": fragment}}, "contentBlockIndex": 0}
        events.append({"contentBlockDelta": delta})
    events += [
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "tool_use"}},
    ]
    return jsonl(*events)


ARGS = '{"path": "notes/é.md", "content": "line 1\\nline \\"2\\" 😀"}'
FRAGMENTS = [ARGS[i : i + 5] for i in range(0, len(ARGS), 5)]

STREAMS = {
    "openai_chat": ("sse", chat_stream(FRAGMENTS)),
    "openai_chat obfuscated": ("sse", chat_stream(FRAGMENTS, obfuscation=True)),
    "anthropic": ("sse", anthropic_stream(FRAGMENTS)),
    "anthropic padded": ("sse", anthropic_stream(FRAGMENTS, padded=True)),
    "anthropic padded inside": ("sse", anthropic_stream(FRAGMENTS, inner=True)),
    "openai_responses": ("sse", responses_stream(FRAGMENTS)),
    "bedrock": ("jsonl", bedrock_stream(FRAGMENTS)),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_every_fragment_read_takes_the_shortcut(name: str, tools: Any) -> None:
    framing, data = STREAMS[name]
    provider = name.split(maxsplit=1)[0]
    taken = same_both_ways(provider, framing, per_event(data, framing), tools=tools)
    assert taken == len(FRAGMENTS)
    assert RAW_TAKEN == [taken if provider == "anthropic" else 0]
    (choice,) = run(provider, framing, per_event(data, framing), fast=True)[0]["choices"]
    assert [c["state"] for c in choice["calls"]] == ["committed"]
    assert choice["calls"][0]["arguments"] == json.loads(ARGS)


def test_limits_previews_and_ends_are_the_stages_own() -> None:
    """Over max_argument_bytes mid-stream, previews on, truncation, no terminal event."""
    small = Limits(max_argument_bytes=20)
    for provider, (framing, data) in (
        ("openai_chat", STREAMS["openai_chat"]),
        ("anthropic", STREAMS["anthropic"]),
    ):
        reads = per_event(data, framing)
        assert same_both_ways(provider, framing, reads, limits=small) > 0
        assert (
            same_both_ways(
                provider,
                framing,
                reads,
                previews=PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=7),
            )
            > 0
        )
        assert same_both_ways(provider, framing, reads[:-3]) > 0
    truncated = anthropic_stream(FRAGMENTS, stop="max_tokens")
    assert same_both_ways("anthropic", "sse", per_event(truncated, "sse")) > 0
    cut = chat_stream(FRAGMENTS, finish="length")
    assert same_both_ways("openai_chat", "sse", per_event(cut, "sse")) > 0


# -- reads that look like fragments but are not ------------------------------------------------

_NEAR_MISSES = [
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"\\u00e9\\""}}\n\n',
    # invalid UTF-8 inside the fragment: the decoder replaces it, the stages decide
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"\xff\xfe"}}\n\n',
    # a CR or LF inside the event (JSON whitespace): two lines, the data is the first one
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,\r'
    b'"delta":{"type":"input_json_delta","partial_json":"y"}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,\n'
    b'"delta":{"type":"input_json_delta","partial_json":"z"}}\n\n',
    # two events in one read, and half an event
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"a"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"b"}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","ind',
    b'ex":0,"delta":{"type":"input_json_delta","partial_json":"c"}}\n\n',
    # an id line and a comment before the data; an unknown block index; not an object
    b'id: 7\n: keep-alive\nevent: content_block_delta\ndata: {"type":"content_block_delta",'
    b'"index":0,"delta":{"type":"input_json_delta","partial_json":"d"}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":5,'
    b'"delta":{"type":"input_json_delta","partial_json":"e"}}\n\n',
    b"event: content_block_delta\ndata: [1, 2]\n\n",
    b"event: content_block_delta\ndata: {not json}\n\n",
    b'data: {"type":"ping"}\n\n',
    b"\n\n",
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"f"}}\n\n',
    # an error frame shaped like a fragment: the stream fails, nothing is appended
    b'event: error\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":"x"}}\n\n',
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(_NEAR_MISSES))), max_size=10), st.booleans())
def test_near_misses_decide_as_the_stages_do(picks: list[int], stop: bool) -> None:
    reads = per_event(anthropic_stream(FRAGMENTS[:3]), "sse")
    tail = reads[-3:] if stop else []
    reads = reads[:-3] + [_NEAR_MISSES[i] for i in picks] + tail
    same_both_ways("anthropic", "sse", reads)


def test_the_near_misses_include_reads_the_shortcut_takes() -> None:
    """So the property above compares both paths, not the slow path with itself."""
    reads = per_event(anthropic_stream([]), "sse")
    assert same_both_ways("anthropic", "sse", [*reads[:-3], *_NEAR_MISSES, *reads[-3:]]) == 2


# -- reads in the provider's own spelling (the raw shortcut) and near it ------------------------


def _delta(index: int, rest: bytes) -> bytes:
    """A fragment read spelled as the API spells it up to the fragment; ``rest`` follows."""
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
        b'"delta":{"type":"input_json_delta","partial_json":%s\n\n' % (index, rest)
    )


def _named(event: dict[str, Any]) -> bytes:
    return sse(event, named=True)


_RAW_READS = [
    # the API's spellings: the raw shortcut takes them while their block is open
    _delta(0, b'"ab"}}'),
    _delta(0, b'"a\\"b\\\\"}     }'),  # an escaped quote and backslash at the end
    _delta(0, b'"\\u00e9 \xc3\xa9"}}   '),
    _delta(0, b'  "a"}  }  '),  # whitespace before the string: still one JSON string
    _delta(1, b'"x"}}'),
    # near misses: the decoded path decides, as the stages do
    _delta(0, b'"a"}\t}'),  # a tab is JSON whitespace, but not the raw spelling
    _delta(0, b"5}}"),  # not a string
    _delta(0, b'"a" "b"}}'),  # two values
    _delta(0, b'"a"}},'),  # trailing data
    _delta(0, b'"a"}'),  # unclosed
    _delta(0, b'"a"}}}'),
    _delta(0, b'"a","x":"y"}}'),  # another member after the fragment
    _delta(0, b'"a"},"index":1}'),  # a duplicate index after the delta
    _delta(0, b'"\\ud800"}}'),  # a lone surrogate
    _delta(0, b'"\xff"}}'),  # not UTF-8
    _delta(2, b'"t"}}'),  # block 2 is text, or not started
    _delta(0, b'"a"}}').replace(b"content_block_delta\n", b"error\n"),  # an error frame
    # the structure around them: stops, restarts, another call, the message's end
    _named({"type": "content_block_stop", "index": 0}),
    _named({"type": "content_block_stop", "index": 1}),
    _named({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}}),
    OPEN_1 := _named(
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "write_file"},
        }
    ),
    _named({"type": "content_block_start", "index": 2, "content_block": {"type": "text"}}),
    _named({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
    _named({"type": "message_stop"}),
    _named({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
    _named({"type": "ping"}),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(len(_RAW_READS))), max_size=12))
def test_raw_spellings_decide_as_the_stages_do(picks: list[int]) -> None:
    """Fragments in the API's spelling and its near misses, before and after their block
    stops, another call starts, the message ends or the stream fails."""
    head = per_event(anthropic_stream([]), "sse")[:2]  # message_start, block 0 (a call)
    same_both_ways("anthropic", "sse", [*head, *(_RAW_READS[i] for i in picks)])


@pytest.mark.parametrize(
    "after",
    [
        _named({"type": "content_block_stop", "index": 0}),
        _named({"type": "message_stop"}),
        _named({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
    ],
)
def test_no_raw_fragment_once_its_call_cannot_take_one(after: bytes) -> None:
    """A fragment read after its block stopped, the message ended or the stream failed is the
    stages' to judge (an anomaly, or nothing), never appended by the shortcut."""
    head = per_event(anthropic_stream([]), "sse")[:2]
    assert same_both_ways("anthropic", "sse", [*head, _RAW_READS[0], after, _RAW_READS[0]]) == 1
    assert RAW_TAKEN == [1]


def test_the_raw_reads_include_reads_the_raw_shortcut_takes() -> None:
    """So the property above compares both paths, not the decoded path with itself."""
    head = per_event(anthropic_stream([]), "sse")[:2]
    spelled, near = _RAW_READS[:4], _RAW_READS[5:16]  # for block 0; 4 is for block 1
    same_both_ways("anthropic", "sse", [*head, *spelled, *near, OPEN_1, _RAW_READS[4]])
    assert RAW_TAKEN == [5]


# -- the recorded corpus -----------------------------------------------------------------------


@pytest.mark.corpus
def test_recorded_streams_read_event_by_event() -> None:
    root = corpus_dir()
    taken = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".sse", ".jsonl"):
            continue
        data = path.read_bytes()
        provider, framing = detect(data[:65536])
        if framing == "eventstream":
            continue
        key = f"{provider}/{framing}"
        reads = per_event(data.replace(b"\r\n", b"\n"), framing)
        taken[key] = taken.get(key, 0) + same_both_ways(provider, framing, reads)
        taken[f"{key} raw"] = taken.get(f"{key} raw", 0) + RAW_TAKEN[0]
    for provider in ("openai_chat/sse", "anthropic/sse", "openai_responses/sse"):
        assert taken.get(provider, 0) > 20, taken
    # Every client tool fragment of the recorded Anthropic streams is in the API's spelling,
    # padded or not: 39 in the .sse files.
    assert taken["anthropic/sse raw"] == taken["anthropic/sse"] == 39, taken
