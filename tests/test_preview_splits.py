"""Previews at every split: what a UI rebuilds from the updates is the lenient parse so far.

Through the public :class:`toollatch.StreamParser`, for valid JSON argument text cut into
fragments anywhere and wire bytes cut into reads anywhere (so runs of fragments reach the
assembler together, or one by one): folding the deltas of the updates released so far gives,
at every update, the :class:`toollatch.previews.PartialJSON` snapshot of the argument text
received so far (``bytes_so_far`` of it), and after the final update the complete parse,
which equals the committed arguments.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import CallState, PreviewPolicy, PreviewUpdated, StreamParser, ToolPreview
from toollatch.stages import PartialJSON, PathDelta
from toollatch.testing import split_at, sse

_TEXT = st.text(st.sampled_from(['"', "\\", "/", "é", "😀", "a", " ", "\n", "b"]), max_size=30)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-999, 999) | st.floats(-1e6, 1e6) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=10,
)


def anthropic_call(fragments: list[str]) -> bytes:
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
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]
    return sse(*events, named=True)


def fold(root: list[Any], deltas: tuple[PathDelta, ...]) -> None:
    """Apply path deltas to ``root[0]`` as a UI would."""
    for d in deltas:
        node: Any = root
        slot: Any = 0
        for token in [t.replace("~1", "/").replace("~0", "~") for t in d.path.split("/")[1:]]:
            node = node[slot]
            slot = int(token) if isinstance(node, list) else token
        if d.op == "set":
            value = json.loads(json.dumps(d.value))
            if isinstance(node, list) and node is not root and slot == len(node):
                node.append(value)
            else:
                node[slot] = value
        elif d.op == "append":
            node[slot] += d.value


def lenient(prefix: str) -> object:
    parser = PartialJSON()
    parser.feed(prefix)
    return parser.snapshot()


def check(text: str, fragments: list[str], reads: list[bytes], every: int) -> int:
    """Feed ``reads``; check every update against the lenient parse; return the updates."""
    policy = PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=every)
    parser = StreamParser("anthropic", previews=policy)
    updates: list[PreviewUpdated] = []
    for read in reads:
        updates += [n for n in parser.feed(read) if isinstance(n, PreviewUpdated)]
    round_ = parser.finish()
    updates += [n for n in parser.finish_notices if isinstance(n, PreviewUpdated)]
    data = text.encode()
    root: list[Any] = [None]
    for update in updates:
        fold(root, update.deltas)
        if not update.final:
            assert root[0] == lenient(data[: update.bytes_so_far].decode()), update
    assert updates
    assert updates[-1].final
    assert updates[-1].error is None
    assert updates[-1].bytes_so_far == len(data)
    (call,) = round_.calls
    assert call.state is CallState.COMMITTED
    assert root[0] == json.loads(text) == call.arguments
    return len(updates)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(_TEXT, _VALUES, max_size=4),
    st.lists(st.integers(1, 9), min_size=1, max_size=6),
    st.lists(st.integers(0, 3000), max_size=8),
    st.integers(1, 40),
)
def test_every_update_is_the_lenient_parse_of_the_text_so_far(
    value: dict[str, Any], sizes: list[int], cuts: list[int], every: int
) -> None:
    text = json.dumps(value, ensure_ascii=False)
    fragments, at = [], 0
    while at < len(text):
        step = sizes[len(fragments) % len(sizes)]
        fragments.append(text[at : at + step])
        at += step
    data = anthropic_call(fragments)
    check(text, fragments, split_at(data, sorted(c % (len(data) + 1) for c in cuts)), every)


def test_every_two_read_split_of_a_call_fed_by_the_character() -> None:
    """A read ending after every event, and inside events, for a call whose text comes one
    character per event (quotes, escapes, a non-ASCII and an astral character, numbers and
    literals): the reads before the cut are one run of fragments, the rest another."""
    text = '{"path": "n\\"é😀.md", "n": [1, -2.5, true, null], "o": {"k": "v"}}'
    fragments = list(text)
    data = anthropic_call(fragments)
    ends = [i + 2 for i in range(len(data)) if data.startswith(b"\n\n", i)]
    for cut in sorted({*ends, *range(0, len(data) + 1, 97)}):
        check(text, fragments, [data[:cut], data[cut:]], 1)
        check(text, fragments, [data[:cut], data[cut:]], 7)
