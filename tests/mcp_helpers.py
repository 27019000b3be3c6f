"""Helpers of the MCP tests: the example MCP server (toollatch.mcp.example_server) as a real
process on stdio or on loopback HTTP, and its own log of what it received."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toollatch import Round, StreamParser, ToolSpec
from toollatch.mcp import McpServer

SERVER = [sys.executable, "-m", "toollatch.mcp.example_server"]


def stdio_server(tmp: Path, name: str = "ex", **policy: Any) -> McpServer:
    """The example server over stdio, logging to ``tmp/<name>.log``, notes in ``tmp``."""
    argv = (*SERVER, "--log", str(tmp / f"{name}.log"), "--notes", str(tmp), "--name", name)
    return McpServer(name=name, command=argv, **{"env": tree_env(), **policy})


def tree_env() -> dict[str, str]:
    """``PYTHONPATH`` when set (a stdio server gets a minimal environment, so the tests'
    source tree is passed on explicitly)."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


@contextmanager
def http_server(tmp: Path, name: str = "web") -> Iterator[str]:
    """The example server on streamable HTTP, 127.0.0.1, a free port; yields its URL."""
    argv = [*SERVER, "--http", "0", "--log", str(tmp / f"{name}.log"), "--notes", str(tmp)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"the example server exited {proc.returncode}")
            if m := re.search(r"listening on (http://\S+)", line):
                url = m.group(1)
        assert url, "the example server did not start"
        # drain its standard error, so a chatty server never blocks on a full pipe
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def http(tmp: Path, url: str, name: str = "web", **policy: Any) -> McpServer:
    return McpServer(name=name, url=url, **policy)


def log_of(tmp: Path, name: str) -> list[dict[str, Any]]:
    """What the server ``name`` logged, one dict per line (empty when nothing yet)."""
    path = tmp / f"{name}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_of(tmp: Path, name: str) -> list[tuple[str, Any]]:
    """The ``tools/call`` requests the server received: (tool, arguments), in order."""
    return [(e["tool"], e["arguments"]) for e in log_of(tmp, name) if e["event"] == "call"]


async def wait_for_log(tmp: Path, name: str, event: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in log_of(tmp, name):
            if entry["event"] == event:
                return entry
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} never logged {event}: {log_of(tmp, name)}")


def chat_round(specs: Sequence[ToolSpec], calls: Sequence[tuple[str, str, Any]]) -> Round:
    """A finalized openai_chat round of ``calls`` (id, name, arguments object or text)."""
    parser = StreamParser("openai_chat", tools=specs)
    for i, (call_id, name, args) in enumerate(calls):
        text = args if isinstance(args, str) else json.dumps(args)
        delta = {"index": i, "id": call_id, "function": {"name": name, "arguments": text}}
        parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return parser.finish()
