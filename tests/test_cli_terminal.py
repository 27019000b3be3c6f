"""``toollatch run``'s terminal view never lets a model drive the terminal: control
characters in model text, tool names, call ids and arguments (CSI, OSC 8 links, OSC 52
clipboard writes, OSC 0 titles, C1 controls, bidi overrides) are shown escaped, never written
raw; ``--json`` carries them exactly (JSON-escaped). Run as a user runs it: a subprocess,
under a pseudo-terminal and on a pipe, against a scripted model server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

ROOT = Path(__file__).resolve().parents[1]

CLEAR = "\x1b[2J\x1b[H"
LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
TITLE = "\x1b]0;pwned\x07"
C1_CSI = "\x9b31m"  # a one-character CSI
BIDI = "\u202eevil\u202c"
TEXT = f"hello {CLEAR}{LINK}{CLIPBOARD}{TITLE}{C1_CSI}{BIDI}\rover\nsecond line"
EVIL_ID = "call_\x1b]0;id-title\x07x"
EVIL_NAME = "tool\x1b[2Jname"

RAW = [
    b"\x1b]",  # any OSC (8, 52, 0): rich writes none in this view
    b"\x07",
    b"\x1b[2J",
    b"\x1b\\",
    "\x9b".encode(),
    "\x9d".encode(),
    "\u202e".encode(),
    b"\rover",
]
"""Sequences the view itself never writes: each one here came from the model."""


def _script() -> Script:
    calls = (
        Call(call_id=EVIL_ID, name=EVIL_NAME, arguments="{}"),
        Call(
            call_id="call_args",
            name="get_weather",
            arguments=json.dumps({"city": "Oslo\x9b2J\u202e"}, ensure_ascii=False),
        ),
    )
    return Script(turns=(Turn(items=(Text(text=TEXT), *calls), delay_ms=0),))


@pytest.fixture(scope="module")
def server():
    with ScriptedServer({"evil": _script()}, delay_scale=0) as running:
        yield running


def _args(server: ScriptedServer, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "toollatch.cli",
        "run",
        "--base-url",
        server.base_url("openai_chat"),
        "--model",
        "evil",
        "--max-rounds",
        "1",
        *flags,
    ]


def _under_pty(args: list[str]) -> tuple[int, bytes]:
    """Run ``args`` with a pseudo-terminal as stdout and stderr: (status, every byte)."""
    import pty

    primary, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "220", "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(args, cwd=ROOT, stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    return proc.wait(timeout=60), b"".join(chunks)


def _assert_no_raw(out: bytes) -> None:
    for raw in RAW:
        assert raw not in out, (raw, out[-2000:])


@pytest.mark.skipif(os.name != "posix", reason="a pseudo-terminal")
def test_the_terminal_view_under_a_terminal_shows_control_characters_escaped(server):
    status, out = _under_pty(_args(server))
    assert status == 0, out[-2000:]
    assert b"\x1b[" in out  # it is a terminal: rich drew its live view
    _assert_no_raw(out)
    for shown in (
        rb"\x1b]52;c;cm0gLXJmIH4K\x07",
        rb"\x1b]0;pwned\x07",
        rb"\x1b]8;;https://evil.example/\x1b\click",
        rb"\x9b31m",
        rb"\u202eevil\u202c",
        rb"\x0dover",
        rb"tool\x1b[2Jname",
        rb"call_\x1b]0;id-title\x07x",
        rb"Oslo\x9b2J\u202e",
    ):
        assert shown in out, shown


def test_the_terminal_view_on_a_pipe_shows_control_characters_escaped(server):
    done = subprocess.run(
        _args(server),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "220"},
    )
    assert done.returncode == 0, done.stderr
    _assert_no_raw(done.stdout)
    assert b"\x1b" not in done.stdout  # not a terminal: no codes at all
    assert rb"hello \x1b[2J\x1b[H" in done.stdout
    assert b"second line" in done.stdout.split(b"\n", 1)[1]  # a newline stays a line break


def test_json_carries_the_same_text_exactly(server):
    done = subprocess.run(
        _args(server, "--json"), cwd=ROOT, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    _assert_no_raw(done.stdout.replace("\u202e".encode(), b"").replace(b"\x9b", b""))
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert "".join(e["text"] for e in events if e["type"] == "text") == TEXT
    opened = [(e["id"], e["name"]) for e in events if e["type"] == "call_opened"]
    assert (EVIL_ID, EVIL_NAME) in opened
    committed = [e for e in events if e["type"] == "call_committed"]
    assert committed[0]["arguments"] == {"city": "Oslo\x9b2J\u202e"}


async def test_an_error_line_from_the_model_shows_control_characters_escaped():
    from loopback_http import json_reply, loopback

    message = f"bad request {TITLE}{CLIPBOARD}{C1_CSI}"
    async with loopback() as server:
        server.replies.append(json_reply(400, {"error": {"message": message}}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toollatch.cli",
            "run",
            "--json",
            "--base-url",
            f"{server.url}/v1",
            "--model",
            "m",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 1, err
    assert err.startswith(b"toollatch: error: model:")
    assert err.count(b"\n") == 1
    _assert_no_raw(err)
    assert rb"bad request \x1b]0;pwned\x07\x1b]52;c;" in err
