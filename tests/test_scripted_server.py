"""Scripted server over real loopback HTTP: faults (status, drop, stall), delays, errors in each
provider's shape, recorded requests, and clean start and stop in both the sync and async form."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

import toollatch
from scripted_helpers import (
    PROVIDERS,
    assert_error_shape,
    first_history,
    post,
    request,
    stream_round,
)
from toollatch import ConfigError, ErrorCode, RoundEnd, StreamParser, UsageError
from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn
from toollatch.scripted._server import _Playback, schedule
from toollatch.scripted._wire import chat_events

CALL = Call(call_id="call_w1", name="get_weather", arguments='{"city": "Oslo"}', fragment_chars=3)


def script(faults: Faults, delay_ms: float = 0.0) -> Script:
    return Script(
        turns=(
            Turn(items=(Text(text="Checking."), CALL), faults=faults, delay_ms=delay_ms),
            Turn(items=(Text(text="second"),)),
        )
    )


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


def read_into(response: httpx.Response, parser: StreamParser, chunks: list[bytes]) -> None:
    """Feed ``parser`` the body's chunks, kept in ``chunks``, as they arrive."""
    for chunk in response.iter_raw():
        chunks.append(chunk)
        parser.feed(chunk)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [429, 500])
def test_status_fault_for_the_first_attempts_then_the_stream(
    http: httpx.Client, provider: str, status: int
) -> None:
    faults = Faults(status=status, status_attempts=2, retry_after_s=3)
    with ScriptedServer(scripts={"f": script(faults)}, delay_scale=0) as s:
        history = first_history(provider)
        for _ in range(2):
            response = post(http, s, provider, history, model="f")
            assert response.status_code == status
            assert response.headers["retry-after"] == "3"
            assert_error_shape(provider, response.json(), status)
        round_ = stream_round(http, s, provider, history, model="f")  # the same turn, now served
        assert [c.name for c in round_.committed()] == ["get_weather"]
        assert [r.status for r in s.requests] == [status, status, 200]
        assert [r.turn for r in s.requests] == [0, 0, 0]
        s.reset()
        assert post(http, s, provider, history, model="f").status_code == status  # counter reset


@pytest.mark.parametrize("provider", PROVIDERS)
def test_drop_closes_the_connection_without_a_terminal_event(
    http: httpx.Client, provider: str
) -> None:
    keep = 1 if provider == "gemini" else 3  # Gemini sends this turn in two events
    with ScriptedServer(scripts={"f": script(Faults(drop_after_events=keep))}, delay_scale=0) as s:
        path, body = request(provider, first_history(provider), model="f")
        parser = StreamParser(provider)
        chunks: list[bytes] = []
        with http.stream("POST", s.url + path, json=body) as response:
            assert response.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                read_into(response, parser, chunks)
        received = b"".join(chunks)
        round_ = parser.finish()
    assert round_.ended is RoundEnd.INTERRUPTED
    assert round_.committed() == ()
    from toollatch.scripted._wire import anthropic_events, chat_events
    from toollatch.scripted._wire_gemini import gemini_events
    from toollatch.scripted._wire_responses import responses_events

    encoders = {
        "openai_chat": lambda t: chat_events(t, model="f", response_id="x", include_usage=False),
        "openai_responses": lambda t: responses_events(t, model="f", response_id="x"),
        "anthropic": lambda t: anthropic_events(t, model="f", response_id="x"),
        "gemini": lambda t: gemini_events(t, model="f", response_id="x"),
    }
    sent = encoders[provider](script(Faults()).turns[0])
    assert received.count(b"data: ") == keep < len(sent)


def test_dropped_call_fails_as_interrupted(http: httpx.Client) -> None:
    # Drop inside the arguments: the call is open, so it fails stream_interrupted.
    with ScriptedServer(scripts={"f": script(Faults(drop_after_events=7))}, delay_scale=0) as s:
        path, body = request("anthropic", first_history("anthropic"), model="f")
        parser = StreamParser("anthropic")
        with (
            http.stream("POST", s.url + path, json=body) as response,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            read_into(response, parser, [])
        (call,) = parser.finish().calls
    assert call.error is ErrorCode.STREAM_INTERRUPTED


def arrival_times(
    http: httpx.Client, server: ScriptedServer, provider: str, model: str
) -> list[tuple[float, bytes]]:
    path, body = request(provider, first_history(provider), model=model)
    start = time.monotonic()
    times = []
    with http.stream("POST", server.url + path, json=body) as response:
        for chunk in response.iter_raw():
            times.append((time.monotonic() - start, chunk))
    return times


def test_stall_pauses_inside_the_arguments(http: httpx.Client) -> None:
    faults = Faults(stall_ms=400)
    with ScriptedServer(scripts={"f": script(faults)}, delay_scale=1.0) as s:
        times = arrival_times(http, s, "openai_chat", "f")
    gaps = [(b - a, chunk) for (a, _), (b, chunk) in itertools.pairwise(times)]
    longest, after = max(gaps, key=lambda g: g[0])
    assert longest >= 0.35
    assert b"arguments" in after  # the stall is between two argument fragments
    # Scaled away: checked on the playback itself (wall-clock upper bounds flake under load).
    quiet = _Playback([], script(faults).turns[0], 0.0)
    assert (quiet.stall_s, quiet.delay_s) == (0.0, 0.0)


def test_delays_are_scaled(http: httpx.Client) -> None:
    slow = Script(turns=(Turn(items=(Text(text="abcdefgh", chunk_chars=1),), delay_ms=40),))
    with ScriptedServer(scripts={"f": slow}, delay_scale=1.0) as s:
        slow_total = arrival_times(http, s, "anthropic", "f")[-1][0]
    events = 2 + 3 * 1 + 8 + 2  # message_start, ping, block start/stop, 8 deltas, delta+stop
    assert slow_total >= 0.04 * events * 0.9
    half = _Playback([], slow.turns[0], 0.5)
    assert half.delay_s == pytest.approx(0.02)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unknown_model_is_a_404_in_the_providers_shape(http: httpx.Client, provider: str) -> None:
    with ScriptedServer(delay_scale=0) as s:
        response = post(http, s, provider, first_history(provider), model="gpt-nothing")
    assert response.status_code == 404
    assert_error_shape(provider, response.json(), 404)
    assert "gpt-nothing" in response.json()["error"]["message"]


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic"])
def test_a_request_without_stream_is_answered_whole(http: httpx.Client, provider: str) -> None:
    path, body = request(provider, first_history(provider))
    with ScriptedServer(delay_scale=0) as s:
        response = http.post(s.url + path, json={**body, "stream": False})
        bad_json = http.post(s.url + path, content=b"{not json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert bad_json.status_code == 400
    assert_error_shape(provider, bad_json.json(), 400)


def test_gemini_methods(http: httpx.Client) -> None:
    body = {"contents": first_history("gemini")}
    with ScriptedServer(delay_scale=0) as s:
        plain = http.post(s.url + "/v1beta/models/scripted:streamGenerateContent", json=body)
        other = http.post(s.url + "/v1beta/models/scripted:countTokens", json=body)
        whole = http.post(s.url + "/v1beta/models/scripted:generateContent", json=body)
        ok = http.post(s.url + "/v1beta/models/scripted:streamGenerateContent?alt=sse", json=body)
        stable = http.post(s.url + "/v1/models/scripted:streamGenerateContent?alt=sse", json=body)
    assert plain.status_code == other.status_code == 404
    assert_error_shape("gemini", plain.json(), 404)
    assert whole.status_code == 200 and whole.json()["candidates"][0]["finishReason"] == "STOP"
    for streamed in (ok, stable):
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")


def test_requests_are_recorded(http: httpx.Client) -> None:
    with ScriptedServer(delay_scale=0) as s:
        history = first_history("openai_chat")
        stream_round(http, s, "openai_chat", history)
        (record,) = s.requests
        assert record.provider == "openai_chat"
        assert record.path == "/v1/chat/completions"
        assert record.body["messages"] == history
        assert record.status == 200 and record.turn == 0
        assert record.headers["content-type"] == "application/json"


def test_base_urls_and_misuse() -> None:
    server = ScriptedServer()
    with pytest.raises(UsageError):
        _ = server.url
    with server as s:
        assert s.url.startswith("http://127.0.0.1:")
        assert s.base_url("openai_chat") == s.base_url("openai_responses") == s.url + "/v1"
        assert s.base_url("anthropic") == s.base_url("gemini") == s.base_url("bedrock") == s.url
        with pytest.raises(UsageError):
            s.base_url("vertex")
        with pytest.raises(UsageError):
            s.__enter__()
    with pytest.raises(ConfigError):
        ScriptedServer(delay_scale=-1)
    with pytest.raises(ConfigError):
        ScriptedServer(scripts={"x": {"turns": []}})  # type: ignore[dict-item]


def test_sync_form_stops_cleanly_and_quickly() -> None:
    threads = threading.active_count()
    started = time.monotonic()
    with ScriptedServer(delay_scale=0) as s:
        port = int(s.url.rsplit(":", 1)[1])
        with httpx.Client() as client:
            assert client.post(s.url + "/v1/messages", json={}).status_code == 400
    assert time.monotonic() - started < 3.0  # ~0.2 s unloaded
    assert threading.active_count() == threads
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
    with s:  # it can be started again
        assert int(s.url.rsplit(":", 1)[1]) > 0


async def test_async_form_serves_on_the_running_loop() -> None:
    async with ScriptedServer(delay_scale=0) as s, httpx.AsyncClient() as client:
        path, body = request("openai_responses", first_history("openai_responses"))
        parser = StreamParser("openai_responses")
        async with client.stream("POST", s.url + path, json=body) as response:
            async for chunk in response.aiter_raw():
                parser.feed(chunk)
        round_ = parser.finish()
        assert [c.call_id for c in round_.committed()] == [
            "call_demo_weather_oslo",
            "call_demo_weather_zurich",
        ]
    with pytest.raises(UsageError):
        _ = s.url


async def test_async_stop_does_not_wait_for_a_stalled_stream() -> None:
    stalled = script(Faults(stall_ms=30_000))
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        server = ScriptedServer(scripts={"f": stalled})
        await server.__aenter__()
        path, body = request("openai_chat", first_history("openai_chat"), model="f")
        response = await stack.enter_async_context(
            client.stream("POST", server.url + path, json=body)
        )
        reader = response.aiter_raw()
        first = await anext(reader)
        assert json.loads(first.split(b"data: ", 1)[1])["object"] == "chat.completion.chunk"
        started = time.monotonic()
        await server.__aexit__(None, None, None)
        assert time.monotonic() - started < 5.0  # ~1.2 s: the 1 s grace, not the 30 s stall
        with pytest.raises(httpx.RemoteProtocolError):
            async for _ in reader:
                pass
        await asyncio.sleep(0)


async def test_a_client_that_leaves_during_a_stall_ends_its_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stalled stream whose client closed the connection ends then (ASGI http.disconnect):
    stopping the server has no task left to wait for and cancel (no "timeout graceful
    shutdown exceeded" after the 1 s grace, as when the stall ran on to its 30 s)."""
    path, body = request("openai_chat", first_history("openai_chat"), model="f")
    async with ScriptedServer(scripts={"f": script(Faults(stall_ms=30_000))}) as server:
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream("POST", server.url + path, json=body) as response,
        ):
            await anext(response.aiter_raw())  # the first event; then the stall
        await asyncio.sleep(0.05)  # (the server sees the connection close)
    assert "graceful shutdown exceeded" not in caplog.text


async def test_a_client_that_drops_mid_stream_ends_the_stream_at_once() -> None:
    """A stream paced 2 s an event (a minute to its end) whose client closes after the
    first event ends then, as ``client_left`` in the server's counts: it writes no more
    and leaves no task for the server's stop to wait on and cancel."""
    slow = Script(
        turns=(Turn(items=(Text(text="abcdefghijklmnopqrst", chunk_chars=1),), delay_ms=2000),)
    )
    path, body = request("openai_chat", first_history("openai_chat"), model="f")
    async with ScriptedServer(scripts={"f": slow}, delay_scale=1.0) as server:
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream("POST", server.url + path, json=body) as response,
        ):
            await anext(response.aiter_raw())  # the first event; the next is 2 s away
            assert server.streams["open"] == 1
        for _ in range(400):  # (a bound on the test, far under the stream's minute)
            if server.streams["open"] == 0:
                break
            await asyncio.sleep(0.005)
        counts = server.streams
    assert counts == {"open": 0, "complete": 0, "client_left": 1, "dropped": 0, "cancelled": 0}


def test_each_event_is_due_at_its_own_time_from_the_stream_start() -> None:
    """The schedule is absolute: ``delay`` apart from the first byte, the stall in place of
    one gap."""
    assert schedule(4, 0.01, None, 0.0) == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert schedule(4, 0.01, 2, 0.5) == pytest.approx([0.01, 0.02, 0.52, 0.53])
    assert schedule(3, 0.0, 1, 0.0) == [0.0, 0.0, 0.0]


async def test_a_slow_send_does_not_push_the_later_events_back() -> None:
    """On a fake clock where each send costs 4 ms of a 10 ms pace, every event still
    goes out at start + k * 10 ms (sleeping 10 ms after each send would drift 4 ms an event);
    with sends slower than the pace it catches up instead of carrying the lateness."""
    turn = Turn(items=(Text(text="abcdefgh", chunk_chars=1),), delay_ms=10)
    events = chat_events(turn, model="m", response_id="r", include_usage=False)

    class FakeClock(_Playback):
        now = 100.0

        def clock(self) -> float:
            return self.now

        async def wait_until(self, deadline: float, gone: asyncio.Event) -> bool:
            self.now = max(self.now, deadline)  # (sleeping on the fake clock)
            return True

    async def play(cost: float) -> list[float]:
        playback, sent = FakeClock(events, turn, 1.0), []

        async def send(message: dict[str, object]) -> None:
            if message.get("body"):  # (an event; the head and the end cost nothing)
                sent.append(round(playback.now - 100.0, 6))
                playback.now += cost

        async def receive() -> dict[str, object]:
            await asyncio.Event().wait()  # the client stays
            return {}

        await playback({"type": "http"}, receive, send)  # type: ignore[arg-type]
        return sent

    assert await play(0.004) == pytest.approx([0.01 * (k + 1) for k in range(len(events))])
    late = await play(0.025)  # each send takes longer than the pace: back to back
    assert late == pytest.approx([0.01 + 0.025 * k for k in range(len(events))])


def _module_env() -> dict[str, str]:
    src = str(Path(toollatch.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_python_m_serves_until_ctrl_c(http: httpx.Client, tmp_path: Path) -> None:
    custom = tmp_path / "one.json"
    custom.write_text(json.dumps({"turns": [{"items": [{"text": "from a file"}]}]}))
    command = [
        sys.executable,
        "-m",
        "toollatch.scripted",
        "--delay-scale",
        "0",
        "--script",
        f"one={custom}",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_module_env()) as child:
        assert child.stdout is not None
        first = child.stdout.readline()
        url = first.rsplit(" ", 1)[1].strip()
        assert first.startswith("toollatch scripted model server: http://127.0.0.1:")

        round_ = stream_round(http, url, "anthropic", first_history("anthropic"), model="one")
        assert round_.text == "from a file"
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=10) == 0


def test_python_m_refuses_a_bad_script(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [{"items": [{"text": 1}]}]}')
    command = [sys.executable, "-m", "toollatch.scripted", "--script", f"x={bad}"]
    done = subprocess.run(
        command, capture_output=True, text=True, env=_module_env(), timeout=30, check=False
    )
    assert done.returncode == 2
    assert "text must be a string" in done.stderr
