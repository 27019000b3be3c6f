"""``toollatch serve``: serves the page and runs on the scripted model; stops on Ctrl-C with
status 0; usage errors are status 2 with one line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from relay_helpers import parse_sse

CLI = [sys.executable, "-c", "import sys; from toollatch.cli import main; sys.exit(main())"]


@pytest.fixture(autouse=True)
def _data_home(tmp_path, monkeypatch):
    """serve's default ledger goes in the user's data folder: a temporary one here."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def test_serve_runs_the_demo_and_stops_on_ctrl_c_with_130(tmp_path):
    proc = subprocess.Popen([*CLI, "serve", "--port", "0"], stderr=subprocess.PIPE, text=True)
    with proc:
        _demo(proc)
    assert proc.returncode == 130


def _demo(proc: subprocess.Popen[str], *, not_port: int | None = None) -> None:
    try:
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        assert int(match.group(1)) != not_port, line
        with httpx.Client(base_url=match.group(0), timeout=20) as client:
            assert "toollatch" in client.get("/").text
            run = client.post("/runs", json={"message": "hi"}).json()
            frames, _ = parse_sse(client.get(run["events_url"]).text)
            assert frames[-1].event == "run_ended" and frames[-1].data["rounds"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130


def test_serve_tools_file_is_used(tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(
        "import toollatch\n\n@toollatch.tool\ndef ping() -> str:\n"
        '    """Ping."""\n    return "pong"\n'
    )
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--tools", str(tools)], stderr=subprocess.PIPE, text=True
    )
    with proc:
        _ping(proc)
    assert proc.returncode == 130


def _ping(proc: subprocess.Popen[str]) -> None:
    try:
        match = re.search(r"http://127\.0\.0\.1:\d+", proc.stderr.readline())
        assert match
        with httpx.Client(base_url=match.group(0), timeout=20) as client:
            run = client.post("/runs", json={"message": "hi"}).json()
            frames, _ = parse_sse(client.get(run["events_url"]).text)
            failed = [f.data for f in frames if f.event == "call_failed"]
            assert failed and all(f["error"] == "unknown_tool" for f in failed)  # no get_weather
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130


def test_serve_usage_errors_are_status_2(tmp_path):
    for args, needle in (
        (["--tools", str(tmp_path / "missing.py")], "no such file"),
        (["--base-url", "http://127.0.0.1:9"], "--model is required"),
        (["--port", "70000"], "port"),
    ):
        done = subprocess.run([*CLI, "serve", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert needle in done.stderr and done.stderr.count("\n") == 1


def test_serve_takes_its_port_and_provider_from_a_config_file(tmp_path):
    config = tmp_path / "toollatch.yaml"
    config.write_text("relay:\n  port: 0\nmodel:\n  provider: anthropic\n")
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)], stderr=subprocess.PIPE, text=True
    )
    with proc:
        _demo(proc, not_port=8000)  # port 0 from the file: a free port, not the default
    assert proc.returncode == 130
    bad = tmp_path / "bad.yaml"
    bad.write_text("relay:\n  prot: 1\n")
    done = subprocess.run(
        [*CLI, "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "relay.prot" in done.stderr


def test_serve_settles_its_heap_once_started():
    """``toollatch serve`` freezes what its start made and makes full collections rarer
    (``settle_heap``); garbage made afterwards is still collected. In a child process: a
    frozen heap is never given back, so the test process must not freeze its own."""
    script = """
import gc, weakref
from toollatch.relay import _server
from toollatch.cli import _serve_command as _command
called = []
_server.settle_heap, real = (lambda: (called.append(1), real())), _server.settle_heap
class Stub:
    ledger_url, store_url, url, token_url = None, None, "http://x", "http://x/"
    async def __aenter__(self): return self
    async def __aexit__(self, *exc): pass
    async def serve_forever(self): pass
import asyncio
assert asyncio.run(_command._serve(Stub())) == 0
assert called == [1], called
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold() == (20000, 20, 100), gc.get_threshold()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_serve_beyond_loopback_without_a_token_is_status_2():
    for args in (["--host", "0.0.0.0"], ["--host", "::"]):  # refused before anything is bound
        done = subprocess.run(
            [*CLI, "serve", *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2, done.stderr
        assert "relay.token" in done.stderr
        assert "--token" in done.stderr
        assert done.stderr.count("\n") == 1


def test_serve_with_a_generated_token_prints_it_once_and_needs_it():
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--token", "auto"], stderr=subprocess.PIPE, text=True
    )
    with proc:
        try:
            line = proc.stderr.readline()
            match = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]{43}) ", line)
            assert match, line
            base, token = match.groups()
            with httpx.Client(base_url=base, timeout=20) as anonymous:
                assert anonymous.get("/").status_code == 401
                assert anonymous.post("/runs", json={"message": "hi"}).status_code == 401
            with httpx.Client(base_url=base, timeout=20, follow_redirects=True) as browser:
                opened = browser.get(f"/?token={token}")  # the printed URL: cookie, then page
                assert opened.status_code == 200
                assert "toollatch" in opened.text
                assert str(opened.url) == base + "/"  # the token left the address bar
                run = browser.post("/runs", json={"message": "hi"}).json()
                frames, _ = parse_sse(browser.get(run["events_url"]).text)
                assert frames[-1].event == "run_ended"
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 130


def test_serve_takes_its_access_settings_from_the_environment_and_flags(monkeypatch):
    token = "env-token-0123456789abcdef"
    monkeypatch.setenv("TOOLLATCH_RELAY__TOKEN", token)
    monkeypatch.setenv("TOOLLATCH_RELAY__MAX_SESSION_RUNS", "1")
    monkeypatch.setenv("TOOLLATCH_RELAY__ALLOWED_HOSTS", "[relay.example]")
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--allow-model", "other"], stderr=subprocess.PIPE, text=True
    )
    with proc:
        try:
            line = proc.stderr.readline()
            assert f"?token={token} " in line, line
            base = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
            headers = {"authorization": f"Bearer {token}"}
            with httpx.Client(base_url=base, timeout=20, headers=headers) as client:
                assert client.get("/", headers={"host": "relay.example"}).status_code == 200
                assert client.get("/", headers={"host": "evil.example"}).status_code == 400
                nope = client.post("/runs", json={"message": "hi", "model": "gpt-5"})
                assert nope.json()["error"]["code"] == "model_not_allowed"
                first = client.post("/runs", json={"message": "hi"})  # the default model
                assert first.status_code == 201
                second = client.post("/runs", json={"message": "hi", "model": "other"})
                assert second.status_code in (201, 429)  # allowed; the quota of 1 may refuse
                if second.status_code == 429:
                    assert second.json()["error"]["code"] == "too_many_session_runs"
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 130


class _StoppingServer:
    """What ``_Stopping`` reads of a server: its grace and store; ``stop`` is told."""

    shutdown_grace_s = 0.05
    store_url = None

    def stop(self, reason: str) -> None:
        self.reason = reason


def test_a_stop_that_overruns_its_grace_exits_with_the_signals_status_and_the_threads_stacks(
    monkeypatch, capsys
):
    """The bound the first Ctrl-C announces holds: a stop still going on past the grace and
    the overrun leaves with 130, having written where each thread and task was (a durable
    worker once took 40 s to stop after printing 'stopping within 2 s')."""
    import asyncio
    import threading

    from toollatch.cli import _serve_command as command

    left: list[int] = []
    gone = threading.Event()

    def leave(status: int) -> None:
        left.append(status)
        gone.set()

    monkeypatch.setattr(command.os, "_exit", leave)
    stopping = command._Stopping(_StoppingServer(), overrun_s=0.05)  # type: ignore[arg-type]

    async def held() -> None:
        await asyncio.sleep(3600)

    async def stop_held() -> None:
        with stopping.installed():
            holding = asyncio.create_task(held(), name="the-held-stop")
            await asyncio.sleep(0)  # (it waits in its sleep)
            stopping._on_signal(signal.SIGINT)
            fired = await asyncio.to_thread(gone.wait, 10)
            holding.cancel()
        assert fired, "the watchdog never fired"

    asyncio.run(stop_held())
    assert left == [130]
    err = capsys.readouterr().err
    assert "stopping within 0.05 s" in err
    assert "still stopping 0.1 s after SIGINT: exiting now" in err
    assert "thread MainThread:" in err  # (its stack: where the stop was held)
    assert "task the-held-stop:" in err  # (and the loop's tasks: where each waited)
    assert "in held" in err


def test_a_stop_that_ends_in_time_is_not_cut(monkeypatch):
    """``disarm`` (called once the stop returned its status) leaves nothing to fire."""
    import threading

    from toollatch.cli import _serve_command as command

    left: list[int] = []
    monkeypatch.setattr(command.os, "_exit", left.append)
    stopping = command._Stopping(_StoppingServer(), overrun_s=0.05)  # type: ignore[arg-type]
    stopping._on_signal(signal.SIGINT)
    stopping.disarm()
    watchdog = stopping._watchdog
    assert watchdog is not None
    watchdog.join(10)
    assert not watchdog.is_alive() and left == []
    assert [t for t in threading.enumerate() if t is watchdog] == []
