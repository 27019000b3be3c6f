"""The preview channel through the assembler: modes, redaction, throttling, finality, type wall."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_chunks import chunk, fragments, tc
from hypothesis import given
from hypothesis import strategies as st

from toollatch import (
    CallKey,
    CommittedCall,
    ConfigError,
    Gate,
    PreviewPolicy,
    PreviewUpdated,
    StreamParser,
    ToolPreview,
    UsageError,
)
from toollatch.testing import sse, split_at

ARGS = {"path": "notes/today.md", "content": "line one\nsk-SECRETKEY1234 and more é😀",
        "meta": {"tags": ["a", "b"], "size": 12}}
TEXT = json.dumps(ARGS, ensure_ascii=False)
STREAM = sse(chunk(tc(0, "c1", "write_file", "")), *fragments(0, TEXT, 3),
             chunk(tc(1, "c2", "get_time", "{}")), chunk(finish="tool_calls"), done=True)


def previews(data: bytes | list[bytes], policy: PreviewPolicy) -> list[PreviewUpdated]:
    parser = StreamParser("openai_chat", previews=policy)
    notices = []
    for piece in [data] if isinstance(data, bytes) else data:
        notices += parser.feed(piece)
    parser.finish()
    notices += parser.finish_notices
    return [n for n in notices if isinstance(n, PreviewUpdated)]


def tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def fold(updates: list[PreviewUpdated], call_id: str) -> Any:
    """What a UI rebuilds from the deltas alone."""
    root: list[Any] = [None]
    for update in updates:
        if update.call_id != call_id:
            continue
        for d in update.deltas:
            node: Any = root
            slot: Any = 0
            for token in tokens(d.path):
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
    return root[0]


def test_default_policy_shows_name_and_byte_count_only():
    updates = previews(STREAM, PreviewPolicy(every_bytes=20))
    mine = [u for u in updates if u.call_id == "c1"]
    assert all(u.deltas == () and u.name == "write_file" for u in mine)
    assert [u.bytes_so_far for u in mine] == sorted(u.bytes_so_far for u in mine)
    assert mine[-1].final and mine[-1].bytes_so_far == len(TEXT.encode())
    assert "SECRET" not in repr(updates)


def test_full_mode_folds_to_the_arguments():
    updates = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full")))
    assert fold(updates, "c1") == ARGS
    assert fold(updates, "c2") == {}
    assert [u.final for u in updates if u.call_id == "c1"][-1] is True


def test_fields_mode_shows_only_allowed_pointers():
    policy = PreviewPolicy(tools={"write_file": ToolPreview(mode="fields",
                                                           fields=("/path", "/meta/tags"))})
    updates = previews(STREAM, policy)
    assert fold(updates, "c1") == {"path": "notes/today.md", "content": "[redacted]",
                                   "meta": {"tags": ["a", "b"], "size": "[redacted]"}}
    assert "SECRET" not in repr(updates) and "line one" not in repr(updates)
    assert fold(updates, "c2") is None  # get_time falls back to the default: none


def test_redactor_sees_whole_strings_even_when_a_secret_is_split():
    def redactor(pointer: str, text: str) -> str:
        return text.replace("sk-SECRETKEY1234", "sk-***")

    policy = PreviewPolicy(default=ToolPreview(mode="full"), redactor=redactor, every_bytes=1)
    updates = previews(STREAM, policy)
    assert "SECRET" not in repr(updates)
    assert fold(updates, "c1")["content"] == "line one\nsk-*** and more é😀"


def test_throttle_every_bytes_and_on_structure():
    full = ToolPreview(mode="full")
    dense = previews(STREAM, PreviewPolicy(default=full, every_bytes=1))
    sparse = previews(STREAM, PreviewPolicy(default=full, every_bytes=10_000, on_structure=False))
    assert len([u for u in sparse if u.call_id == "c1"]) == 2  # the first and the final one
    assert len(dense) > len(sparse)
    assert fold(dense, "c1") == fold(sparse, "c1") == ARGS


def test_provisional_marks_the_growing_edge():
    updates = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=1))
    growing = [u for u in updates if "/content" in u.provisional]
    assert growing and all("" in u.provisional for u in growing)
    assert updates[-1].provisional == frozenset()


def test_numbers_and_literals_are_never_shown_unfinished():
    text = '{"size": 123456, "ok": true}'
    data = sse(chunk(tc(0, "c", "f", "")), *fragments(0, text, 1), chunk(finish="stop"))
    updates = previews(data, PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=1))
    sets = [d.value for u in updates for d in u.deltas if d.op == "set" and d.path != ""]
    assert sets == [123456, True]


def test_final_preview_on_failure_and_truncation_and_malformed_text():
    big = '{"content": "' + "x" * 3000 + '"}'
    policy = PreviewPolicy(default=ToolPreview(mode="full"))
    parser = StreamParser("openai_chat", previews=policy,
                          limits=__import__("toollatch").Limits(max_argument_bytes=1000))
    notices = parser.feed(sse(chunk(tc(0, "c", "f", "")), *fragments(0, big, 100)))
    kinds = [type(n).__name__ for n in notices]
    assert kinds[-2:] == ["PreviewUpdated", "CallFailed"] and notices[-2].final
    truncated = previews(sse(chunk(tc(0, "c", "f", '{"a": "b')), chunk(finish="length")), policy)
    assert truncated[-1].final and truncated[-1].call_id == "c"
    bad = previews(sse(chunk(tc(0, "c", "f", '{"a": tru}')), chunk(finish="stop")), policy)
    assert bad[-1].error and "invalid literal" in bad[-1].error and "tru" not in bad[-1].error.replace("literal", "")


@given(st.lists(st.integers(0, len(STREAM)), max_size=30))
def test_folded_preview_is_the_same_at_any_chunking(cuts):
    policy = PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=7)
    assert fold(previews(split_at(STREAM, cuts), policy), "c1") == ARGS


def test_previews_can_never_be_executed():
    update = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full")))[0]
    assert not isinstance(update, CommittedCall)
    assert not set(type(update).__mro__) & set(CommittedCall.__mro__[:-1])
    gate = Gate(None)
    with pytest.raises(UsageError):
        gate.check(key=CallKey(0, 0, 0), position=0, call_id="c", name="f", text=update)


def test_previews_are_refused_by_type(tmp_path: Path):
    # mypy --strict with warn_unused_ignores: if the ignore were unnecessary, mypy would fail.
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from toollatch import CommittedCall, PreviewUpdated\n"
        "def run(call: CommittedCall) -> None: ...\n"
        "def ui(update: PreviewUpdated) -> None:\n"
        "    run(update)  # type: ignore[arg-type]\n"
    )
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(snippet)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_bad_policies_are_config_errors():
    with pytest.raises(ConfigError):
        ToolPreview(mode="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ToolPreview(mode="fields", fields=("path",))
    with pytest.raises(ConfigError):
        PreviewPolicy(every_bytes=0)


def test_previews_off_by_default_cost_nothing():
    parser = StreamParser("openai_chat")
    assert parser.feed(STREAM) == [] and parser.assembler._trackers == {}
