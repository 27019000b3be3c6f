"""StreamParser's per-event step decides exactly as the stages do, read by read.

``StreamParser.feed`` hands each read to the decoder's ``feed_payloads``, which calls back with
runs of complete events' undecoded data; the adapter's ``translate`` walks a run and returns
each stretch of bare argument fragments of one call (one parse per event, then
``_continuation``), which goes to the assembler together, then the stream events of the
event that ended the stretch.
``keep_events=True`` takes the stages in turn (``decoder.feed`` -> ``adapter.feed_frame``
-> ``assembler.feed``), so every test here feeds
the same reads to both parsers and compares the rounds, the notices and the finish notices,
one event per read, in small fixed reads, at random cuts and as one read; and counts the
fragments the step took, so that a test whose streams never reach it fails instead of
passing vacuously.
"""

from __future__ import annotations

import gc
import itertools
import json
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus_dir
from toollatch import Limits, PreviewPolicy, StreamParser, ToolPreview, UsageError
from toollatch.stages import detect
from toollatch.testing import jsonl, sse, summary

EXAMPLES = Path(__file__).parent.parent / "examples"
TOOLS = json.loads((EXAMPLES / "tools.json").read_text())


def per_event(data: bytes, framing: str) -> list[bytes]:
    """One read per event: SSE split after each blank line, JSON Lines after each line."""
    sep = b"\n\n" if framing == "sse" else b"\n"
    parts = data.split(sep)
    reads = [p + sep for p in parts[:-1]]
    return [*reads, parts[-1]] if parts[-1] else reads


def fixed(data: bytes, size: int) -> list[bytes]:
    """Reads of ``size`` bytes, cut anywhere (as a socket delivers them)."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def shapes(data: bytes, framing: str) -> dict[str, list[bytes]]:
    """The read shapes every stream is fed in: one event per read, 7-byte and 100-byte
    reads (a 16 KiB read of a stream this small), the whole stream in one read."""
    return {
        "per event": per_event(data, framing),
        "7 bytes": fixed(data, 7),
        "100 bytes": fixed(data, 100),
        "whole": [data],
    }


def run(
    provider: str, framing: str, reads: list[bytes], *, fast: bool, **options: Any
) -> tuple[dict[str, Any], list[str], int]:
    """(summary, notices as reprs, fragments the per-event step took) for one parser."""
    parser = StreamParser(provider, framing=framing, keep_events=not fast, **options)  # type: ignore[arg-type]
    taken = 0
    translate = parser._translate

    def counting(event: str, payloads: list[bytes], start: int) -> Any:
        nonlocal taken
        out = translate(event, payloads, start)
        taken += len(out[2])
        return out

    parser._translate = counting  # type: ignore[method-assign]
    notices: list[str] = []
    for read in reads:
        notices += map(repr, parser.feed(read))
    round_ = parser.finish()
    notices += ["finish", *map(repr, parser.finish_notices)]
    return summary(round_), notices, taken


def same_both_ways(provider: str, framing: str, reads: list[bytes], **options: Any) -> int:
    """Fragments the per-event step took."""
    slow = run(provider, framing, reads, fast=False, **options)
    assert slow[2] == 0  # keep_events really takes the stages in turn
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


def bedrock_stream(fragments: list[str], *, padded: bool = False) -> bytes:
    start = {"toolUse": {"toolUseId": "tu_1", "name": "write_file"}}
    events: list[Any] = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"start": start, "contentBlockIndex": 0}},
    ]
    for i, fragment in enumerate(fragments):
        delta: dict[str, Any] = {"delta": {"toolUse": {"input": fragment}}, "contentBlockIndex": 0}
        if padded:  # boto3's order, and the "p" padding (bedrock/nova_text_then_tool_use.jsonl)
            delta = {"contentBlockIndex": 0, **delta, "p": "abcXYZ019"[: i % 10]}
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
    "bedrock padded": ("jsonl", bedrock_stream(FRAGMENTS, padded=True)),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_every_fragment_of_every_read_takes_the_step(name: str, tools: Any) -> None:
    """Whatever the reads (one event each, cut anywhere, the whole stream), every fragment
    event goes from the bytes to the call's buffer."""
    framing, data = STREAMS[name]
    provider = name.split(maxsplit=1)[0]
    for shape, reads in shapes(data, framing).items():
        taken = same_both_ways(provider, framing, reads, tools=tools)
        assert taken == len(FRAGMENTS), shape
        (choice,) = run(provider, framing, reads, fast=True)[0]["choices"]
        assert [c["state"] for c in choice["calls"]] == ["committed"]
        assert choice["calls"][0]["arguments"] == json.loads(ARGS)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(STREAMS)), st.data())
def test_random_reads_decide_as_the_stages_do(name: str, data: st.DataObject) -> None:
    """Cut at random points (several events per read, events across reads)."""
    framing, stream = STREAMS[name]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    points = [0, *cuts, len(stream)]
    reads = [stream[a:b] for a, b in itertools.pairwise(points)]
    assert same_both_ways(name.split(maxsplit=1)[0], framing, reads) == len(FRAGMENTS)


def test_limits_previews_and_ends_are_the_stages_own() -> None:
    """Over max_argument_bytes mid-stream, previews on, truncation, no terminal event."""
    small = Limits(max_argument_bytes=20)
    for provider, (framing, data) in (
        ("openai_chat", STREAMS["openai_chat"]),
        ("anthropic", STREAMS["anthropic"]),
        ("bedrock", STREAMS["bedrock padded"]),
    ):
        previews = PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=7)
        for reads in shapes(data, framing).values():
            assert same_both_ways(provider, framing, reads, limits=small) > 0
            assert same_both_ways(provider, framing, reads, previews=previews) > 0
        unended = per_event(data, framing)[:-3]
        assert same_both_ways(provider, framing, unended) > 0
        assert same_both_ways(provider, framing, [b"".join(unended)]) > 0
    for provider, data in (
        ("anthropic", anthropic_stream(FRAGMENTS, stop="max_tokens")),
        ("openai_chat", chat_stream(FRAGMENTS, finish="length")),
    ):
        for reads in shapes(data, "sse").values():
            assert same_both_ways(provider, "sse", reads) > 0


def taken(reads: list[bytes], limit: int) -> int | None:
    """Fragments the per-event step takes: all of them, unless the call fails for its size in
    a stream of several reads (its round is over there, so later reads are not parsed: then
    anything up to all of them, compared both ways by ``same_both_ways``)."""
    if limit >= len(ARGS.encode()) or len(reads) == 1:
        return len(FRAGMENTS)
    return None


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["openai_chat obfuscated", "anthropic", "bedrock padded"]),
    st.integers(1, len(ARGS.encode()) + 2),
    st.integers(1, 120),
)
def test_a_run_of_fragments_meets_the_byte_limit_where_the_stages_do(
    name: str, limit: int, size: int
) -> None:
    """The fragments of a read reach the assembler together: the call fails at the same
    fragment, with the same notices, wherever the limit falls."""
    framing, data = STREAMS[name]
    provider = name.split(maxsplit=1)[0]
    options = {"limits": Limits(max_argument_bytes=limit)}
    for reads in ([data], fixed(data, size)):
        got, want = same_both_ways(provider, framing, reads, **options), taken(reads, limit)
        assert got == want if want is not None else got <= len(FRAGMENTS)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["openai_chat obfuscated", "anthropic", "bedrock padded"]),
    st.integers(1, len(ARGS.encode()) + 2),
    st.integers(1, 120),
    st.integers(1, 40),
    st.sampled_from(["full", "fields"]),
)
def test_previews_of_a_run_are_released_where_the_stages_release_them(
    name: str, limit: int, size: int, every: int, mode: str
) -> None:
    """With previews on, a run of fragments reaching the assembler together releases the
    same updates after the same fragments, and fails the call at the same one, wherever the
    byte limit falls."""
    framing, data = STREAMS[name]
    provider = name.split(maxsplit=1)[0]
    rule = ToolPreview(mode=mode, fields=("/path",) if mode == "fields" else ())  # type: ignore[arg-type]
    previews = PreviewPolicy(default=rule, every_bytes=every)
    options = {"limits": Limits(max_argument_bytes=limit), "previews": previews}
    for reads in ([data], fixed(data, size)):
        got, want = same_both_ways(provider, framing, reads, **options), taken(reads, limit)
        assert got == want if want is not None else got <= len(FRAGMENTS)


_QUOTED = st.text(alphabet='ab\\"\n é😀', max_size=40)
"""String content where backslashes run before quotes: ``\\"``, ``\\\\\"`` and the like."""


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["anthropic", "bedrock"]),
    st.lists(_QUOTED, min_size=1, max_size=4),
    st.lists(st.integers(0, 400), max_size=80),
    st.integers(1, 64),
    st.booleans(),
)
def test_escaped_quotes_in_a_run_release_where_the_stages_release(
    provider: str, strings: list[str], cuts: list[int], every: int, structure: bool
) -> None:
    """In a run, a fragment whose quotes are all escaped stays on the fast path as text the
    tracker holds (judged with the run's text before it); a quote that ends a string, after
    any number of backslashes, still releases its update at the same fragment as the stages
    in turn, with the same deltas."""
    text = json.dumps({f"k{i}": value for i, value in enumerate(strings)})
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    fragments = [text[a:b] for a, b in itertools.pairwise(points)]
    data = anthropic_stream(fragments) if provider == "anthropic" else bedrock_stream(fragments)
    framing = "sse" if provider == "anthropic" else "jsonl"
    previews = PreviewPolicy(
        default=ToolPreview(mode="full"), every_bytes=every, on_structure=structure
    )
    assert same_both_ways(provider, framing, [data], previews=previews) == len(fragments)


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
    same_both_ways("anthropic", "sse", [b"".join(reads)])  # one read: events share it


def _delta(index: int, rest: bytes) -> bytes:
    """A fragment read spelled as the API spells it up to the fragment; ``rest`` follows."""
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
        b'"delta":{"type":"input_json_delta","partial_json":%s\n\n' % (index, rest)
    )


def _named(event: dict[str, Any]) -> bytes:
    return sse(event, named=True)


_RAW_READS = [
    # the API's spellings, taken as fragments while their block is open
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
    reads = [*head, *(_RAW_READS[i] for i in picks)]
    same_both_ways("anthropic", "sse", reads)
    same_both_ways("anthropic", "sse", [b"".join(reads)])  # one read: events share it


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
    reads = [*head, _RAW_READS[0], after, _RAW_READS[0]]
    for shape in (reads, [b"".join(reads)]):
        assert same_both_ways("anthropic", "sse", shape) == 1


# -- the recorded corpus -----------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("shape", ["per event", "7 bytes", "100 bytes", "whole"])
def test_recorded_streams_in_every_read_shape(shape: str) -> None:
    root = corpus_dir()
    taken: dict[str, int] = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".sse", ".jsonl", ".bin", ".eventstream"):
            continue
        data = path.read_bytes()
        provider, framing = detect(data[:65536])
        key = f"{provider}/{framing}"
        if framing != "eventstream":
            data = data.replace(b"\r\n", b"\n")
        reads = shapes(data, framing)[shape] if framing != "eventstream" else fixed(data, 7)
        taken[key] = taken.get(key, 0) + same_both_ways(provider, framing, reads)
    for provider in ("openai_chat/sse", "anthropic/sse", "openai_responses/sse"):
        assert taken.get(provider, 0) > 20, taken
    # Every client tool fragment of the recorded Anthropic streams: 39 in the .sse files,
    # whatever the reads.
    assert taken["anthropic/sse"] == 39, taken


class _Chunk(bytes):
    """A bytes subclass, as a transport library might hand over."""


@pytest.mark.corpus
@pytest.mark.parametrize("kind", [bytearray, memoryview, _Chunk])
def test_recorded_streams_as_other_bytes_types(kind: type) -> None:
    """Reads that are not exact ``bytes`` (a bytearray, a memoryview, a subclass) give what
    bytes give, cut anywhere."""
    root = corpus_dir()
    checked = 0
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".sse", ".jsonl"):
            continue
        data = path.read_bytes().replace(b"\r\n", b"\n")
        provider, framing = detect(data[:65536])
        for reads in (fixed(data, 7), per_event(data, framing)):
            expected = run(provider, framing, reads, fast=True)
            assert run(provider, framing, [kind(read) for read in reads], fast=True) == expected
            checked += 1
    assert checked > 40


# -- misuse is uniform -------------------------------------------------------------------------

_CHAT = STREAMS["openai_chat"][1]
_ENTRY_POINTS = {
    "feed": lambda parser: parser.feed(b"data: {}\n\n"),
    "feed_frames": lambda parser: parser.feed_frames([]),
    "feed_event": lambda parser: parser.feed_event({"choices": []}),
}


@pytest.mark.parametrize("end", ["finish", "cancel"])
@pytest.mark.parametrize("entry", sorted(_ENTRY_POINTS))
@pytest.mark.parametrize("keep_events", [False, True])
def test_every_feed_after_the_end_raises(end: str, entry: str, keep_events: bool) -> None:
    parser = StreamParser("openai_chat", keep_events=keep_events)
    parser.feed(_CHAT[:200])
    first = getattr(parser, end)()
    with pytest.raises(UsageError, match=rf"StreamParser\.{entry}\(\) called after {end}"):
        _ENTRY_POINTS[entry](parser)
    assert parser.finish() is first  # the same Round, again
    assert parser.cancel() is first


def test_finish_twice_returns_the_same_round_and_flushes_once() -> None:
    parser = StreamParser("openai_chat")
    for read in fixed(_CHAT, 100):
        parser.feed(read)
    first = parser.finish()
    notices = list(parser.finish_notices)
    assert parser.finish() is first
    assert parser.finish_notices == notices
    assert [c.state.value for c in first.calls] == ["committed"]


@pytest.mark.parametrize("entry", sorted(_ENTRY_POINTS))
def test_after_a_framing_error_input_is_ignored_until_finish(entry: str) -> None:
    """Not misuse: the round failed at the error; what follows changes nothing."""
    rounds = []
    for more in (False, True):
        parser = StreamParser("openai_chat", limits=Limits(max_line_bytes=300))
        assert parser.feed(per_event(_CHAT, "sse")[0]) == []  # the call opens
        parser.feed(b"data: " + b"x" * 300 + b"\n\n")  # a line over the limit
        if more:
            assert _ENTRY_POINTS[entry](parser) == []
            assert parser.feed(_CHAT) == []
        rounds.append(summary(parser.finish()))
        with pytest.raises(UsageError):
            _ENTRY_POINTS[entry](parser)
    assert rounds[0] == rounds[1]
    assert rounds[0]["error"].startswith("framing error")
    assert [c["state"] for c in rounds[0]["choices"][0]["calls"]] == ["failed"]


def test_a_sealed_round_stops_reading_so_the_adapter_stops_growing():
    # Past twice max_calls_per_round the stream fails and nothing more is kept: the parser
    # ignores further input, so 10,000 more tiny calls leave no state behind.
    def call(i):
        return (
            b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"c%d",'
            b'"function":{"name":"f","arguments":"{}"}}]}}]}\n\n' % (i, i)
        )

    parser = StreamParser("openai_chat", limits=Limits(max_calls_per_round=2))
    fed = [parser.feed(call(i)) for i in range(5)]
    assert [len(n) for n in fed] == [0, 0, 1, 1, 2]  # two placeholders, then two failed calls
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5, 10_000):
            assert parser.feed(call(i)) == []
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024  # (each call kept would cost hundreds of bytes: megabytes)
    round_ = parser.finish()
    assert len(round_.calls) == 4
    assert round_.ended.value == "interrupted"
    events = StreamParser("openai_chat", limits=Limits(max_calls_per_round=2))
    assert [len(events.feed_event(json.loads(call(i)[6:]))) for i in range(7)] == [
        0,
        0,
        1,
        1,
        2,
        0,
        0,
    ]
    assert len(events.finish().calls) == 4


# -- Bedrock's spelling (JSON Lines, the "p" padding) and near it --------------------------------


def _bedrock_delta(index: int, rest: bytes) -> bytes:
    """A Bedrock fragment line spelled as boto3's event dumps it up to the fragment."""
    head = b'{"contentBlockDelta":{"contentBlockIndex":%d,"delta":{"toolUse":{"input":'
    return head % index + rest + b"\n"


def _bedrock(event: dict[str, Any]) -> bytes:
    return jsonl(event)


_BEDROCK_TAKEN = [  # fragments while block 0 (or 1) is an open call
    _bedrock_delta(0, b'"ab"}},"p":"abc"}}'),
    _bedrock_delta(0, b'"a\\"b\\\\"}},"p":"Zz09"}}'),  # an escaped quote and backslash
    _bedrock_delta(0, b'"\\u00e9 \xc3\xa9"}},"p":""}}'),  # no padding at all
    _bedrock_delta(0, b'""}},"p":"x"}}'),  # empty: a fragment on both routes
    _bedrock_delta(1, b'"x"}},"p":"q"}}'),
]
_BEDROCK_READS = [
    *_BEDROCK_TAKEN,
    # near misses: the decoded path decides, as the stages do
    _bedrock_delta(0, b'"a"}},"p":"a-b"}}'),  # padding that is not letters and digits
    _bedrock_delta(0, b'"a"}},"p":"x","p":"y"}}'),
    _bedrock_delta(0, b'"a"}},"p":"x","delta":{"toolUse":{"input":"b"}}}}'),  # a second delta
    _bedrock_delta(0, b'"a","input":"b"}},"p":"x"}}'),  # a second input
    _bedrock_delta(0, b'5}},"p":"x"}}'),  # not a string
    _bedrock_delta(0, b'"a"}},"p":"x"}'),  # unclosed
    _bedrock_delta(0, b'"a"}},"p":"x"}}}'),
    _bedrock_delta(0, b'"a"}},"p":5}}'),
    _bedrock_delta(0, b'"\\ud800"}},"p":"x"}}'),  # a lone surrogate
    _bedrock_delta(0, b'"\xff"}},"p":"x"}}'),  # not UTF-8
    _bedrock_delta(2, b'"t"}},"p":"x"}}'),  # block 2: text, or never started
    # the structure around them
    _bedrock({"contentBlockStop": {"contentBlockIndex": 0}}),
    _bedrock({"contentBlockStop": {"contentBlockIndex": 1}}),
    BEDROCK_OPEN_1 := _bedrock(
        {
            "contentBlockStart": {
                "contentBlockIndex": 1,
                "start": {"toolUse": {"toolUseId": "tu_2", "name": "write_file"}},
            }
        }
    ),
    _bedrock({"contentBlockStart": {"contentBlockIndex": 2, "start": {"text": ""}}}),
    _bedrock({"messageStop": {"stopReason": "tool_use"}}),
    _bedrock({"throttlingException": {"message": "slow down"}}),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(len(_BEDROCK_READS))), max_size=12))
def test_bedrock_raw_spellings_decide_as_the_stages_do(picks: list[int]) -> None:
    """Fragments in boto3's spelling and its near misses, before and after their block
    stops, another call starts, the message stops or an exception arrives."""
    head = per_event(bedrock_stream([]), "jsonl")[:2]  # messageStart, block 0 (a call)
    reads = [*head, *(_BEDROCK_READS[i] for i in picks)]
    same_both_ways("bedrock", "jsonl", reads)
    same_both_ways("bedrock", "jsonl", [b"".join(reads)])


# -- OpenAI chat's learned spelling and near it -----------------------------------------------


def _chat_delta(index: int, token: bytes, tail: bytes = b"", finish: bytes = b"null") -> bytes:
    """A chat fragment chunk spelled as OpenAI sends it: ``token`` is the arguments' JSON,
    ``tail`` follows the choices (e.g. the obfuscation padding)."""
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"choices":'
        b'[{"index":0,"delta":{"tool_calls":[{"index":%d,"function":{"arguments":%s}}]},'
        b'"logprobs":null,"finish_reason":%s}]%s}\n\n' % (index, token, finish, tail)
    )


_PAD = b',"usage":null,"obfuscation":"%s"'
_CHAT_READS = [
    _chat_delta(0, b'"ab"'),
    _chat_delta(0, b'"c\\"d\\\\"'),  # an escaped quote and backslash at the end
    _chat_delta(0, b'"\\"arguments\\":"'),
    _chat_delta(0, b'"e"', _PAD % b"Xy1"),
    _chat_delta(0, b'"f"', _PAD % b""),
    _chat_delta(1, b'"g"'),
    _chat_delta(0, b'""'),  # empty: the general path, on both routes
    _chat_delta(0, b"null"),
    _chat_delta(0, b'"a","arguments":"b"'),  # a repeated key: the last one counts
    _chat_delta(0, b'"a"', _PAD % b"a-b"),  # padding that is not letters and digits
    _chat_delta(0, b'"a"', b',"usage":{"total_tokens":1}'),
    _chat_delta(0, b'"a"', finish=b'"length"'),
    _chat_delta(0, b'"\\ud800"'),
    _chat_delta(0, b'"\xff"'),
    _chat_delta(2, b'"t"'),  # index 2: never opened
    sse(chat_chunk({}, "tool_calls")),
    CHAT_OPEN_1 := sse(
        chat_chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_2", "function": {"name": "f", "arguments": ""}}
                ]
            }
        )
    ),
    sse(chat_args(0, "h", usage={"total_tokens": 3})),
    b"data: [DONE]\n\n",
    sse({"error": {"message": "busy"}}),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(len(_CHAT_READS))), max_size=14))
def test_chat_raw_spellings_decide_as_the_stages_do(picks: list[int]) -> None:
    """Chunks in OpenAI's spelling (learned from the first fragment) and near it, before and
    after another call opens, the choice finishes, [DONE] or an error arrives."""
    head = per_event(chat_stream([]), "sse")[:1]  # the chunk that opens call 0
    reads = [*head, *(_CHAT_READS[i] for i in picks)]
    same_both_ways("openai_chat", "sse", reads)
    same_both_ways("openai_chat", "sse", [b"".join(reads)])


def test_a_run_after_a_string_ends_shows_its_fragments_to_the_tracker() -> None:
    """In a run, once a fragment ends the string (the tracker is no longer quiet), a later
    fragment without a quote still reaches the tracker and releases its update where one at
    a time does (fails when the run keeps the quiet bound read before the tracker's call)."""
    fragments = ['{"path": ["a', "b", '"', ", 2", "]}"]
    data = chat_stream(fragments)
    cut = data.index(b"\n\n", data.index(b'\\"a')) + 2  # the first fragment's read alone
    previews = PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=1000)
    assert same_both_ways("openai_chat", "sse", [data[:cut], data[cut:]], previews=previews) > 0


_TEXT = st.text(
    st.sampled_from(['"', "\\", "/", "é", "😀", "日", "a", "b", " ", "\n", "\x01", "'"]),
    max_size=40,
)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-99, 99) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["openai_chat", "anthropic", "openai_responses", "bedrock padded"]),
    _VALUES,
    st.lists(st.integers(1, 9), min_size=1, max_size=8),
    st.integers(1, 300),
    st.booleans(),
    st.sampled_from(["full", "fields", "none"]),
    st.sampled_from([None, 16, 64, 512]),
    st.integers(0, 3),
)
def test_previews_of_any_run_are_released_where_the_stages_release_them(
    name: str,
    value: Any,
    cuts: list[int],
    every: int,
    on_structure: bool,
    mode: str,
    size: int | None,
    broken: int,
) -> None:
    """The run walk (quiet stretches found by character counts, exact bytes near the bound
    and at each quote, held as slices) releases the same updates after the same fragments as
    one fragment at a time, for any argument text (quotes, escapes, non-ASCII, astral
    characters, text cut anywhere, malformed tails that stop the parser mid-run), any
    cadence and any read size."""
    text = json.dumps({"content": value}, ensure_ascii=False)
    text = text[: len(text) - broken] + "\x01}"[:broken]  # (some tails malformed)
    fragments, at = [], 0
    while at < len(text):
        step = cuts[len(fragments) % len(cuts)]
        fragments.append(text[at : at + step])
        at += step
    provider = name.split(maxsplit=1)[0]
    builders = {
        "openai_chat": chat_stream,
        "anthropic": anthropic_stream,
        "openai_responses": responses_stream,
        "bedrock padded": lambda f: bedrock_stream(f, padded=True),
    }
    framing = "jsonl" if provider == "bedrock" else "sse"
    data = builders[name](fragments)
    rule = ToolPreview(mode=mode, fields=("/content",) if mode == "fields" else ())  # type: ignore[arg-type]
    previews = PreviewPolicy(default=rule, every_bytes=every, on_structure=on_structure)
    reads = [data] if size is None else fixed(data, size)
    assert same_both_ways(provider, framing, reads, previews=previews) == len(fragments)


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
def test_a_parser_is_freed_when_dropped_without_the_cyclic_collector(provider: str) -> None:
    """Nothing a parser holds points back at it (a bound method of its own kept on it was a
    cycle): dropped, it and its stages go at once, not at the cyclic collector's next pass,
    which every request's parser, adapter, assembler and buffers otherwise waited for."""
    data = chat_stream(['{"path": "a', '.txt"}']) if provider == "openai_chat" else None
    data = data or anthropic_stream(['{"path": "a', '.txt"}'])
    gc.collect()
    gc.disable()
    try:
        parser = StreamParser(provider, framing="sse")
        for read in per_event(data, "sse"):
            parser.feed(read)
        round_ = parser.finish()
        refs = [weakref.ref(o) for o in (parser, parser.adapter, parser.assembler)]
        del parser
        assert [ref() for ref in refs] == [None, None, None]
        assert round_.calls  # (the stream reached the stages)
    finally:
        gc.enable()
