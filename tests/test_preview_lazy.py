"""The preview tracker parses lazily: the same updates as parsing every fragment, less work.

``PreviewTracker`` holds the fragments that cannot change structure (inside a string, no
``"``) and feeds them to its parser in one piece when an update is due or a fragment may start
or end a value. These tests pin that this changes nothing a UI sees: every update (its place
in the stream, bytes, deltas after coalescing, provisional pointers, error) equals that of a
reference that feeds the parser every fragment as it comes (the tracker before issue 12), and
each update folds to the lenient parse of the text so far.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import PreviewPolicy, PreviewUpdated, ToolPreview
from toollatch.core._preview import PreviewTracker, _coalesce, _Filter, quotes_escaped
from toollatch.stages import CallKey, PartialJSON, PathDelta

KEY = CallKey(0, 0, 0)


class EagerTracker:
    """The reference: every fragment goes to the parser at once (same filter and release rule)."""

    def __init__(self, policy: PreviewPolicy) -> None:
        self.policy = policy
        rule = policy.rule("f")
        self.parser = PartialJSON(max_depth=64) if rule.mode != "none" else None
        self.filter = _Filter(rule, policy.redactor)
        self.pending: list[PathDelta] = []
        self.nbytes = 0
        self.last = 0

    def feed(self, fragment: str) -> bool:
        self.nbytes += len(fragment.encode("utf-8", "surrogatepass"))
        structural = False
        if self.parser is not None and self.parser.failed is None:
            for delta in self.filter.apply(self.parser.feed(fragment)):
                structural = structural or delta.op != "append"
                self.pending.append(delta)
        due = self.nbytes - self.last >= self.policy.every_bytes
        return due or (structural and self.policy.on_structure) or self.last == 0

    def release(self, *, final: bool = False) -> tuple[Any, ...]:
        parser = self.parser
        if final and parser is not None and parser.failed is None:
            self.pending += self.filter.apply(parser.finish())
        self.last = max(self.nbytes, 1)
        deltas, self.pending = _coalesce(self.pending), []
        provisional = frozenset() if final or parser is None else self.filter.provisional(parser)
        error = parser.failed if parser is not None else None
        return (self.nbytes, deltas, provisional, final, error)


def seen(update: PreviewUpdated) -> tuple[Any, ...]:
    return (update.bytes_so_far, update.deltas, update.provisional, update.final, update.error)


def run_both(pieces: list[str], policy: PreviewPolicy) -> tuple[list[Any], list[Any]]:
    """(fragment index, update) for every update of the tracker and of the reference."""
    tracker = PreviewTracker(policy, "f", max_depth=64)
    eager = EagerTracker(policy)
    got: list[Any] = []
    want: list[Any] = []
    nbytes = 0
    for i, piece in enumerate(pieces):
        nbytes += len(piece.encode("utf-8", "surrogatepass"))
        if tracker.feed(piece, nbytes):
            got.append((i, seen(tracker.release(KEY, "c", "f"))))
        if eager.feed(piece):
            want.append((i, eager.release()))
    got.append((len(pieces), seen(tracker.release(KEY, "c", "f", final=True))))
    want.append((len(pieces), eager.release(final=True)))
    return got, want


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


_strings = st.text(alphabet='ab"\\/\n\té😀\ud83d', max_size=12)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(-1e6, 1e6) | _strings,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_strings, inner, max_size=4),
    max_leaves=14,
)


@st.composite
def _texts(draw: st.DrawFn) -> str:
    """JSON text: whole, cut short, with one character replaced (often malformed), or with
    escapes written as \\uXXXX (split surrogate pairs across fragments)."""
    text = json.dumps(draw(_values), ensure_ascii=draw(st.booleans()))
    how = draw(st.sampled_from(["whole", "short", "flip"]))
    if how == "short":
        return text[: draw(st.integers(0, len(text)))]
    if how == "flip" and text:
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + draw(st.sampled_from('"\\{}[],: x\x01')) + text[i + 1 :]
    return text


def _policies() -> st.SearchStrategy[PreviewPolicy]:
    rules = st.sampled_from(
        [
            ToolPreview(mode="full"),
            ToolPreview(mode="fields", fields=("/a", "/b/0", "/ab")),
            ToolPreview(mode="fields", fields=("/0", "/1/a")),
            ToolPreview(mode="none"),
        ]
    )
    return st.builds(
        PreviewPolicy,
        default=rules,
        redactor=st.none() | st.just(lambda pointer, text: text.replace("a", "*")),
        every_bytes=st.integers(1, 40) | st.integers(100, 10**6),  # (then structure only)
        on_structure=st.booleans(),
    )


@settings(max_examples=300)  # (cheap: each example is a few hundred characters)
@given(
    text=_texts(),
    cuts=st.lists(st.integers(0, 200), max_size=60) | st.just(list(range(200))),
    policy=_policies(),
)
def test_lazy_tracker_releases_what_the_eager_one_does(text, cuts, policy):
    got, want = run_both(cut(text, cuts), policy)
    assert got == want


@given(value=_values, cuts=st.lists(st.integers(0, 200), max_size=60), every=st.integers(1, 40))
def test_every_update_folds_to_the_lenient_parse_of_the_text_so_far(value, cuts, every):
    """The UI contract: the updates so far rebuild the partial parse of all text fed so far."""
    text = json.dumps(value)
    pieces = cut(text, cuts)
    tracker = PreviewTracker(
        PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=every), "f", max_depth=64
    )
    root: list[Any] = [None]
    nbytes = 0
    for i, piece in enumerate(pieces):
        nbytes += len(piece.encode())
        if tracker.feed(piece, nbytes):
            fold(root, tracker.release(KEY, "c", "f").deltas)
            once = PartialJSON()
            once.feed("".join(pieces[: i + 1]))
            assert root[0] == once.snapshot()
    fold(root, tracker.release(KEY, "c", "f", final=True).deltas)
    assert root[0] == value


def _escaped_quotes(text: str) -> set[int]:
    """Where ``text`` (a JSON string's text, from its opening quote) has a quote that an
    escape covers, by reading it from the start as a JSON decoder does."""
    escaped: set[int] = set()
    i = 1
    while i < len(text):
        if text[i] == "\\":
            if text[i + 1 : i + 2] == '"':
                escaped.add(i + 1)
            i += 2
        else:
            i += 1
    return escaped


@settings(max_examples=500)
@given(value=st.text(alphabet='a\\"é', max_size=30), data=st.data())
def test_a_quote_is_called_escaped_only_when_an_escape_covers_it(value, data):
    """``quotes_escaped`` (the rule by which text is held, by the tracker and in the
    assembler's runs) never calls a quote that ends the string escaped, however little of the
    text before it it sees; seeing the string from its opening quote, it calls every covered
    quote escaped (an odd run of backslashes, ``\\\\\\"`` too)."""
    text = json.dumps(value, ensure_ascii=False)
    covered = _escaped_quotes(text)
    a = data.draw(st.integers(0, len(text)) | st.just(0))  # what the caller knows of the text
    b = data.draw(st.integers(a, len(text)) | st.just(len(text)))
    seen = text[a:b]
    start = data.draw(st.integers(0, len(seen)))
    end = data.draw(st.integers(start, len(seen)))
    quotes = {a + i for i in range(start, end) if seen[i] == '"'}
    if quotes_escaped(seen, start, end):
        assert quotes <= covered
    elif a == 0:  # (the whole text before is known: only an uncovered quote says no)
        assert not quotes <= covered


def fold(root: list[Any], deltas: tuple[PathDelta, ...]) -> None:
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


def test_string_content_is_parsed_in_pieces_not_per_fragment(monkeypatch):
    """The point of it: 10,000 quiet fragments of a long string cost the parser a feed per
    update (every 256 bytes), not one per fragment; quotes and structure still go at once."""
    calls = 0
    feed = PartialJSON.feed

    def counting(self: PartialJSON, fragment: str) -> list[PathDelta]:
        nonlocal calls
        calls += 1
        return feed(self, fragment)

    monkeypatch.setattr(PartialJSON, "feed", counting)
    pieces = ['{"path": "a.md", ', '"content": "', *["text\\n " for _ in range(10_000)], '"}']
    tracker = PreviewTracker(PreviewPolicy(default=ToolPreview(mode="full")), "f", max_depth=64)
    counts = itertools.accumulate(len(p) for p in pieces)  # (ASCII: bytes are characters)
    updates = [
        tracker.release(KEY, "c", "f")
        for p, n in zip(pieces, counts, strict=False)
        if tracker.feed(p, n)
    ]
    nbytes = sum(len(p) for p in pieces)
    assert len(updates) >= nbytes // 256
    assert calls <= len(updates) + 4  # the first pieces, the closing quote, the end
    final = tracker.release(KEY, "c", "f", final=True)
    root: list[Any] = [None]
    for update in [*updates, final]:
        fold(root, update.deltas)
    assert root[0] == json.loads("".join(pieces))
