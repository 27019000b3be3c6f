"""The relay's per-session example tools: built once, each session's write_file confined to
its own directory, answering exactly as the example tool does."""

from __future__ import annotations

from pathlib import Path

import pytest

from toollatch.relay._tools import SessionTools
from toollatch.runtime import example_tools


def _write(tools: tuple[object, ...]) -> object:
    return next(t for t in tools if t.name == "write_file")  # type: ignore[attr-defined]


async def test_each_session_writes_in_its_own_directory(tmp_path: Path) -> None:
    sessions = SessionTools(tmp_path, keep=8)
    a, b = _write(sessions.get("aaaa")), _write(sessions.get("bbbb"))
    out_a = await a.invoke({"path": "notes/x.md", "content": "from a"})  # type: ignore[attr-defined]
    out_b = await b.invoke({"path": "notes/x.md", "content": "from b"})  # type: ignore[attr-defined]
    assert (tmp_path / "aaaa" / "notes" / "x.md").read_text() == "from a"
    assert (tmp_path / "bbbb" / "notes" / "x.md").read_text() == "from b"
    # the model reads what the example tool answers for its own workspace
    direct = example_tools(tmp_path / "direct")
    out_d = await _write(tuple(direct)).invoke({"path": "notes/x.md", "content": "from a"})  # type: ignore[attr-defined]
    assert out_a.content == out_d.content == '{"path":"notes/x.md","bytes":6}'
    # its UI payload (sent to the browser) names the file as the model did, not the server path
    assert out_b.ui == {"kind": "file_written", "path": "notes/x.md", "bytes": 6}


@pytest.mark.parametrize("path", ["/etc/passwd", "../bbbb/x", "a/../../bbbb/x", ""])
async def test_paths_out_of_the_session_are_refused_as_by_the_example(
    tmp_path: Path, path: str
) -> None:
    sessions = SessionTools(tmp_path, keep=8)
    got = await _write(sessions.get("aaaa")).invoke({"path": path, "content": "x"})  # type: ignore[attr-defined]
    want = await _write(tuple(example_tools(tmp_path / "aaaa"))).invoke(  # type: ignore[attr-defined]
        {"path": path, "content": "x"}
    )
    assert got.is_error and got.content == want.content
    assert not (tmp_path / "bbbb").exists()


def test_tools_are_shared_not_rebuilt_and_sessions_bounded(tmp_path: Path) -> None:
    sessions = SessionTools(tmp_path, keep=2)
    first = sessions.get("s1")
    assert sessions.get("s1") is first
    other = sessions.get("s2")
    weather = [t for t in first if t.name != "write_file"]
    assert weather == [t for t in other if t.name != "write_file"]  # the very same objects
    assert _write(first).spec is _write(other).spec  # type: ignore[attr-defined]
    sessions.get("s3")
    assert sessions.get("s1") is not first  # forgotten past keep, bound again
