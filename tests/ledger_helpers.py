"""Test helpers for the ledger: a real redis-server on loopback, and committed rounds.

``RedisServer`` starts ``redis-server`` (the Debian package) on 127.0.0.1 with an
append-only file fsynced on every write, in a temporary folder, so that a restart keeps the
records (as a production Redis used as a ledger must). Absent, the tests skip, except under
CI=true, where they fail: CI must install it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toollatch import Round, StreamParser, ToolSpec


def chat_round(specs: Sequence[ToolSpec], calls: Sequence[tuple[str, str, Any]]) -> Round:
    """A finalized OpenAI chat round of ``calls`` (id, name, arguments object)."""
    parser = StreamParser("openai_chat", tools=specs)
    for i, (call_id, name, args) in enumerate(calls):
        delta = {
            "index": i,
            "id": call_id,
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return parser.finish()


def redis_binary() -> str:
    """The redis-server path; skip without it (fail under CI=true)."""
    path = shutil.which("redis-server")
    if path:
        return path
    import pytest  # (here: ledger_worker.py, a subprocess spawned ~50 times, skips its 80 ms)

    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but redis-server is not installed (apt-get install -y redis-server)")
    raise pytest.skip.Exception("redis-server is not installed (apt-get install -y redis-server)")


def json_outputs(procs: Sequence[subprocess.Popen[str]], *, timeout: float) -> list[Any]:
    """Each process's stdout as JSON, in order, once it exited 0 (else the test fails with
    what it printed)."""
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out
        outputs.append(json.loads(out))
    return outputs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on loopback; ``restart`` keeps its port and its data."""

    def __init__(self, folder: Path) -> None:
        self.binary = redis_binary()
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--protected-mode", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
