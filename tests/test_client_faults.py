"""The runtime's failure paths against a hostile model server of our own (raw asyncio on
loopback: every byte of the response is the test's): how a response is classified (a 200
that is not an event stream, a gzip bomb, broken framing, a reset, odd ``Retry-After``) and
when the loop asks again (a stream broken by an error event), per provider, in the client,
in the agent loop and through ``toollatch run --json`` (exit status and ``run_ended``)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
import zlib
from pathlib import Path

import httpx
import pytest

from loopback_http import (
    LAST_CHUNK,
    chunk,
    gzip_bomb,
    http_head,
    http_response,
    raw_loopback,
    raw_reply,
    sse_response,
)
from toollatch import (
    Agent,
    ClientLimits,
    Limits,
    ModelConnectError,
    ModelHTTPError,
    ModelResponseError,
    RetryPolicy,
    RunLimits,
    StreamInterrupted,
    StreamTooLarge,
    model_client,
)
from toollatch.runtime import example_tools
from toollatch.scripted import Call, Text, Turn
from toollatch.scripted._server import _encode

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
EVERY_PROVIDER = pytest.mark.parametrize("provider", PROVIDERS)
ROOT = Path(__file__).resolve().parents[1]
FAST = RetryPolicy(attempts=3, initial_delay_s=0.5, max_delay_s=8, max_total_wait_s=30, jitter=0)

# Each provider's error body (HTTP) and its error event mid-stream, in its own shape.
QUOTA_MESSAGE = "You exceeded your current quota"
QUOTA = {
    "openai_chat": {"error": {"message": QUOTA_MESSAGE, "type": "insufficient_quota"}},
    "openai_responses": {"error": {"message": QUOTA_MESSAGE, "type": "insufficient_quota"}},
    "anthropic": {"type": "error", "error": {"type": "rate_limit_error", "message": QUOTA_MESSAGE}},
    "gemini": [{"error": {"code": 429, "message": QUOTA_MESSAGE, "status": "RESOURCE_EXHAUSTED"}}],
}
OVERLOADED = {
    "openai_chat": {"error": {"message": "Overloaded", "type": "server_error", "code": None}},
    "openai_responses": {"type": "error", "code": "server_error", "message": "Overloaded",
                         "param": None, "sequence_number": 9},
    "anthropic": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    "gemini": {"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}},
}  # fmt: skip
NAMED = {"openai_responses", "anthropic"}  # (their error events carry "event: error")
HTML = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
)


def wire(provider: str, *items) -> list[bytes]:
    events = _encode(
        provider,
        Turn(items=items, delay_ms=0),
        model="m",
        body={"stream_options": {"include_usage": True}},
        response_id="r1",
    )
    return [e.data for e in events]


def answer(provider: str) -> list[bytes]:
    return wire(provider, Text(text="All done."))


def broken(provider: str) -> list[bytes]:
    """Text, a ``write_file`` call opened (its first argument fragment; Gemini's calls come
    whole, so there only the text), then the provider's ``overloaded`` error event."""
    call = Call(
        call_id="call_1",
        name="write_file",
        arguments='{"path": "never.md", "content": "x"}',
        fragment_chars=4,
    )
    events = _encode(
        provider,
        Turn(items=(Text(text="Writing."), call), delay_ms=0),
        model="m",
        body={},
        response_id="r1",
    )
    first = next(n for n, e in enumerate(events) if e.in_arguments)
    cut = first if provider == "gemini" else first + 1
    name = b"event: error\n" if provider in NAMED else b""
    error = name + b"data: " + json.dumps(OVERLOADED[provider]).encode() + b"\n\n"
    return [e.data for e in events[:cut]] + [error]


class Sleeps:
    def __init__(self):
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
async def server():
    async with raw_loopback() as state:
        yield state


def client_for(server, provider="openai_chat", *, retry=FAST, limits=None, sleeps=None, **kw):
    return model_client(
        provider,
        model="m",
        base_url=server.url,
        retry=retry,
        limits=limits,
        sleep=sleeps or Sleeps(),
        env={},
        **kw,
    )


async def body_of(client) -> bytes:
    async with client, client.stream([]) as s:
        return b"".join([c async for c in s])


async def drain(client, into: list[bytes]) -> None:
    async with client, client.stream([]) as s:
        async for piece in s:
            into.append(piece)


def json_503(header: str, value: str) -> bytes:
    headers = [("content-type", "application/json"), (header, value)]
    return http_response(503, b'{"error": {"message": "busy"}}', headers)


# -- a 200 that is not an event stream (R2) -------------------------------------------------


@EVERY_PROVIDER
async def test_a_200_json_error_is_an_error_with_the_providers_message_not_retried(
    server, provider
):
    body = json.dumps(QUOTA[provider]).encode()
    server.always = raw_reply(http_response(200, body))
    with pytest.raises(ModelResponseError) as caught:
        await body_of(client_for(server, provider))
    error = caught.value
    assert isinstance(error, ModelHTTPError)
    assert (error.status, error.content_type, error.body) == (200, "application/json", body)
    assert QUOTA_MESSAGE in str(error)
    assert "not an event stream" in str(error)
    assert len(server.seen) == 1  # never asked again


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "text/event-stream", ""])
async def test_an_html_page_is_an_error_with_its_title_whatever_its_label(server, content_type):
    headers = [("content-type", content_type)] if content_type else []
    server.always = raw_reply(http_response(200, HTML, headers))
    with pytest.raises(ModelResponseError, match="502 Bad Gateway"):
        await body_of(client_for(server))
    assert len(server.seen) == 1


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"", "text/event-stream", "(empty body)"),
        (b"\r\n\n", "text/event-stream", "(empty body)"),
        (b"Internal Server Error", "text/plain", "Internal Server Error"),
        (b'{"a": 1}\n{"b": 2}\n', "application/x-ndjson", '{"a": 1}'),
    ],
)
async def test_other_bodies_that_are_no_event_stream_are_errors(
    server, body, content_type, message
):
    server.always = raw_reply(http_response(200, body, [("content-type", content_type)]))
    with pytest.raises(ModelResponseError) as caught:
        await body_of(client_for(server))
    assert message in str(caught.value)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", ""])
async def test_an_event_stream_under_another_label_or_none_is_read(server, content_type):
    # (the first bytes are an SSE line: servers that mislabel their streams still work)
    events = [b": hi\n\n", b"data: {}\n\n"] if content_type == "text/plain" else [b"data: {}\n\n"]
    server.always = sse_response(events, content_type=content_type)
    assert await body_of(client_for(server)) == b"".join(events)


async def test_a_first_line_cut_into_one_byte_reads_is_judged_on_enough_bytes(server):
    body = b"\n\ndata: {}\n\n"
    server.always = raw_reply(
        http_head(200, [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]),
        *(chunk(body[i : i + 1]) for i in range(len(body))),
        LAST_CHUNK,
    )
    assert await body_of(client_for(server)) == body


# -- gzip: decoded bytes are bounded, and so is each chunk ---------------------------------


@pytest.mark.parametrize(
    "block", [bytes(1 << 20), b": ping\n\n" * (1 << 17)], ids=["zeros", "sse-pings"]
)
async def test_a_gzip_bomb_stops_at_max_body_bytes_in_bounded_chunks(server, block):
    bomb = gzip_bomb(64, block)  # 64 MiB from about 1 KiB per MiB
    head = http_head(
        200,
        [("content-type", "text/event-stream"), ("content-encoding", "gzip"),
         ("content-length", str(len(bomb)))],
    )  # fmt: skip
    server.always = raw_reply(head, bomb[:10], bomb[10:])
    limits = ClientLimits(max_body_bytes=4 << 20)
    pieces: list[bytes] = []
    with pytest.raises(StreamTooLarge) as caught:
        await drain(client_for(server, limits=limits), pieces)
    sizes = [len(p) for p in pieces]
    assert max(sizes) <= 256 * 1024  # one compressed read never becomes a huge chunk
    assert sum(sizes) <= 4 << 20 < caught.value.bytes_received <= (4 << 20) + 256 * 1024
    assert caught.value.wire_bytes <= len(bomb)
    assert isinstance(caught.value, StreamInterrupted)  # the round's calls: stream_interrupted
    assert len(server.seen) == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate-zlib", "deflate-raw"])
async def test_compressed_bodies_are_inflated(server, encoding):
    data = b"".join(f'data: {{"n": {i}}}\n\n'.encode() for i in range(3000))
    wbits = {"gzip": 31, "deflate-zlib": 15, "deflate-raw": -15}[encoding]
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(data) + packer.flush()
    name = encoding.split("-")[0]
    head = http_head(200, [("content-type", "text/event-stream"), ("content-encoding", name),
                           ("content-length", str(len(packed)))])  # fmt: skip
    server.always = raw_reply(head, *(packed[i : i + 300] for i in range(0, len(packed), 300)))
    assert await body_of(client_for(server)) == data


async def test_a_corrupt_gzip_body_mid_stream_is_interrupted(server):
    good = gzip.compress(b"data: {}\n\n" * 1000)
    head = http_head(200, [("content-type", "text/event-stream"), ("content-encoding", "gzip")])
    server.always = raw_reply(head, good[:40], b"\xff" * 64)
    with pytest.raises(StreamInterrupted) as caught:
        await drain(client_for(server), [])
    assert isinstance(caught.value.cause, httpx.DecodingError)


# -- broken framing, resets, odd Retry-After ------------------------------------------------

SSE_HEAD = http_head(200, [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")])


@pytest.mark.parametrize(
    "tail",
    [b"zz\r\nnot a size\r\n", b"5\r\ntoo long for five\r\n", b"ffffffffffffffff\r\nx"],
    ids=["bad-size", "overlong-chunk", "huge-size-then-eof"],
)
async def test_broken_chunked_framing_mid_stream_is_interrupted(server, tail):
    server.always = raw_reply(SSE_HEAD, chunk(b"data: {}\n\n"), tail)
    got: list[bytes] = []
    with pytest.raises(StreamInterrupted):
        await drain(client_for(server), got)
    assert got[0] == b"data: {}\n\n"
    assert len(server.seen) == 1  # never retried once bytes were handed over


async def test_broken_framing_before_the_first_byte_is_retried_then_raised(server):
    server.always = raw_reply(SSE_HEAD, b"zz\r\n")
    sleeps = Sleeps()
    with pytest.raises(ModelConnectError):
        await body_of(client_for(server, sleeps=sleeps))
    assert len(server.seen) == 3
    assert sleeps.waits == [0.5, 1.0]


async def test_a_reset_mid_stream_is_interrupted_and_before_it_retried(server):
    server.replies.append(raw_reply(SSE_HEAD, chunk(b"data: {}\n\n"), reset=True))
    with pytest.raises(StreamInterrupted):
        await drain(client_for(server), [])
    server.always = raw_reply(b"HTTP/1.1 200", reset=True)
    with pytest.raises(ModelConnectError):
        await body_of(client_for(server))
    assert len(server.seen) == 1 + 3


@pytest.mark.parametrize(
    ("header", "value", "waits", "requests"),
    [
        ("retry-after", "-5", [0.0, 0.0], 3),  # negative: at once (never a negative sleep)
        ("retry-after", "1e12", [], 1),  # huge: past the total budget, not waited
        ("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT", [0.0, 0.0], 3),  # a past date
        ("retry-after", "soon!", [0.5, 1.0], 3),  # garbage: the backoff
        ("retry-after", "nan", [0.5, 1.0], 3),
        ("retry-after-ms", "-1", [0.0, 0.0], 3),
        ("retry-after-ms", "99999999999", [], 1),
    ],
)
async def test_odd_retry_after_values(server, header, value, waits, requests):
    server.always = raw_reply(json_503(header, value))
    sleeps = Sleeps()
    with pytest.raises(ModelHTTPError, match="HTTP 503: busy"):
        await body_of(client_for(server, sleeps=sleeps))
    assert sleeps.waits == waits
    assert len(server.seen) == requests


# -- the agent loop: when it asks again (R7) ------------------------------------------------


async def play(
    server, provider, tmp_path, *, retry=FAST, limits=None, sleeps=None, unit=0.5, line_bytes=None
):
    client = client_for(
        server, provider, retry=retry, limits=limits, sleeps=sleeps, random_unit=lambda: unit
    )
    core = Limits(max_line_bytes=line_bytes) if line_bytes else None
    async with client:
        run = Agent(client, example_tools(tmp_path), limits=core).run("go")
        events = [e.to_json() async for e in run]
    return events, run


def result_ids(history: list[dict]) -> list[str]:
    """The call ids the history's tool results answer (Gemini's: the calls' positions)."""
    found = []
    for entry in history:
        if entry.get("role") == "tool":  # chat
            found.append(entry["tool_call_id"])
        if entry.get("type") == "function_call_output":  # Responses
            found.append(entry["call_id"])
        content = entry.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":  # Anthropic
                found.append(block["tool_use_id"])
        found += ["gemini" for part in entry.get("parts", ()) if "functionResponse" in part]
    return found


def assert_paired(events: list[dict]) -> None:
    """Every call of the run has one result in the history; no tool ran."""
    history = events[-1]["history"]
    opened = [e["id"] for e in events if e["type"] == "call_opened"]
    results = result_ids(history)
    if "gemini" in results or any("functionCall" in json.dumps(e) for e in history):
        calls = sum("functionCall" in part for e in history for part in e.get("parts", ()))
        assert results == ["gemini"] * calls, history
    else:
        assert sorted(results) == sorted(opened), history
    assert not [e for e in events if e["type"] == "tool_started"]


@EVERY_PROVIDER
async def test_a_stream_broken_by_an_error_event_is_asked_again_twice_with_backoff_then_ends(
    server, provider, tmp_path
):
    server.always = sse_response(broken(provider))
    sleeps = Sleeps()
    retry = RetryPolicy(initial_delay_s=1.0, jitter=0.5)
    events, run = await play(server, provider, tmp_path, retry=retry, sleeps=sleeps, unit=0.5)
    assert len(server.seen) == 3  # the first request and two retries, not max_rounds
    assert sleeps.waits == [0.75, 1.5]  # backoff 1 s, 2 s, less half the jitter fraction
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["interrupted"] * 3
    assert events[-1]["error"] == run.error
    assert "Overloaded" in run.error
    assert "3 times in a row" in run.error
    assert_paired(events)
    assert not (tmp_path / "never.md").exists()


@EVERY_PROVIDER
async def test_a_stream_broken_once_then_answered_ends_well(server, provider, tmp_path):
    server.replies.append(sse_response(broken(provider)))
    server.always = sse_response(answer(provider))
    sleeps = Sleeps()
    events, run = await play(server, provider, tmp_path, sleeps=sleeps)
    assert len(server.seen) == 2
    assert sleeps.waits == [0.5]
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["interrupted", "normal"]
    assert run.error is None
    assert_paired(events)


async def test_stream_retries_zero_never_asks_again(server, tmp_path):
    server.always = sse_response(broken("anthropic"))
    retry = RetryPolicy(stream_retries=0)
    _, run = await play(server, "anthropic", tmp_path, retry=retry)
    assert len(server.seen) == 1
    assert "broke once" in run.error
    assert "overloaded_error: Overloaded" in run.error


async def test_the_last_round_broken_is_an_error_too(server, tmp_path):
    server.always = sse_response(broken("openai_chat"))
    client = client_for(server, sleeps=Sleeps())
    async with client:
        run = Agent(client, example_tools(tmp_path), run_limits=RunLimits(max_rounds=1)).run("go")
        events = [e.to_json() async for e in run]
    assert len(server.seen) == 1
    assert "Overloaded" in events[-1]["error"]


@EVERY_PROVIDER
async def test_a_200_json_error_ends_the_run_with_its_message_in_one_request(
    server, provider, tmp_path
):
    server.always = raw_reply(http_response(200, json.dumps(QUOTA[provider]).encode()))
    events, run = await play(server, provider, tmp_path)
    assert len(server.seen) == 1
    assert events[-1]["rounds"] == 0
    assert QUOTA_MESSAGE in run.error


def opening(provider: str) -> list[bytes]:
    """The events of :func:`broken` before its error event: text and a call opened."""
    return broken(provider)[:-1]


@EVERY_PROVIDER
async def test_a_gzip_bomb_fails_the_round_and_is_asked_again_at_most_twice(
    server, provider, tmp_path
):
    bomb = gzip_bomb(32, b": ping\n\n" * (1 << 17), prefix=b"".join(opening(provider)))
    head = http_head(200, [("content-type", "text/event-stream"), ("content-encoding", "gzip"),
                           ("content-length", str(len(bomb)))])  # fmt: skip
    server.always = raw_reply(head, bomb)  # valid SSE comments: only the body bound stops it
    limits = ClientLimits(max_body_bytes=2 << 20)
    events, run = await play(server, provider, tmp_path, limits=limits)
    assert len(server.seen) == 3
    assert "max_body_bytes" in run.error
    assert_paired(events)
    if provider != "gemini":  # (Gemini's call comes whole: not in the opening)
        assert ("call_1", "stream_interrupted") in [
            (e["id"], e["error"]) for e in events if e["type"] == "call_failed"
        ]


@EVERY_PROVIDER
@pytest.mark.parametrize(
    "ending",
    [b"", b"zz\r\n", b"ffff\r\ndata: {"],  # a reset, a bad chunk size, EOF inside a chunk
    ids=["reset", "bad-chunk-size", "eof-in-chunk"],
)
async def test_a_connection_broken_mid_stream_is_asked_again_at_most_twice(
    server, provider, tmp_path, ending
):
    parts = [SSE_HEAD, *(chunk(e) for e in opening(provider))]
    server.always = raw_reply(*parts, *([ending] if ending else []), reset=not ending)
    events, run = await play(server, provider, tmp_path)
    assert len(server.seen) == 3
    assert "stream interrupted" in run.error
    assert_paired(events)


@EVERY_PROVIDER
async def test_a_huge_line_fails_the_round_at_the_line_limit(server, provider, tmp_path):
    huge = b"data: " + b"x" * (256 * 1024)  # never a newline
    server.always = raw_reply(SSE_HEAD, *(chunk(e) for e in opening(provider)), chunk(huge))
    events, run = await play(server, provider, tmp_path, limits=None, line_bytes=64 * 1024)
    assert len(server.seen) == 3
    assert "max_line_bytes" in run.error
    assert_paired(events)


@EVERY_PROVIDER
async def test_deep_json_arguments_fail_the_call_and_the_run_goes_on(server, provider, tmp_path):
    deep = '{"path": "never.md", "content": ' + "[" * 200 + "]" * 200 + "}"
    call = Call(call_id="call_1", name="write_file", arguments=deep, fragment_chars=64)
    server.replies.append(sse_response(wire(provider, call)))
    server.always = sse_response(answer(provider))
    events, run = await play(server, provider, tmp_path)
    assert run.error is None
    assert len(server.seen) == 2
    assert [e["error"] for e in events if e["type"] == "call_failed"] == ["depth_exceeded"]
    assert_paired(events)
    assert not (tmp_path / "never.md").exists()


# -- toollatch run --json: what a user sees --------------------------------------------------


async def toollatch_run(
    server,
    provider: str,
    tmp_path: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    view: str = "--json",
) -> tuple[int, list[dict], str]:
    """``toollatch run`` (``view="--json"``; ``""``: the terminal view, no events parsed)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toollatch.cli", "run", *([view] if view else []),
        "--provider", provider, "--base-url", server.url, "--model", "m",
        "--workspace", str(tmp_path), *flags,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    events = [json.loads(line) for line in out.decode().splitlines()] if view else []
    return process.returncode, events, err.decode()


def assert_failed_run(code: int, events: list[dict], err: str, message: str) -> None:
    assert code == 1, err
    assert events[-1]["type"] == "run_ended"
    assert message in events[-1]["error"]
    assert err.count("\n") == 1, err  # one line, no traceback
    assert err.startswith("toollatch: error: model:")
    assert message in err
    assert_paired(events)


@EVERY_PROVIDER
async def test_run_json_a_200_json_error_exits_1_with_the_message(server, provider, tmp_path):
    server.always = raw_reply(http_response(200, json.dumps(QUOTA[provider]).encode()))
    code, events, err = await toollatch_run(server, provider, tmp_path)
    assert_failed_run(code, events, err, QUOTA_MESSAGE)
    assert len(server.seen) == 1
    assert events[-1]["rounds"] == 0


async def test_run_json_an_html_page_exits_1_with_its_title(server, tmp_path):
    server.always = raw_reply(http_response(200, HTML, [("content-type", "text/html")]))
    code, events, err = await toollatch_run(server, "openai_chat", tmp_path)
    assert_failed_run(code, events, err, "502 Bad Gateway")
    assert len(server.seen) == 1


@EVERY_PROVIDER
async def test_run_json_an_error_event_every_time_exits_1_after_two_retries(
    server, provider, tmp_path
):
    server.always = sse_response(broken(provider))
    code, events, err = await toollatch_run(server, provider, tmp_path)
    assert_failed_run(code, events, err, "Overloaded")
    assert len(server.seen) == 3
    assert events[-1]["rounds"] == 3
    assert not (tmp_path / "never.md").exists()


async def test_run_json_a_reset_every_time_exits_1(server, tmp_path):
    server.always = raw_reply(SSE_HEAD, *(chunk(e) for e in broken("anthropic")[:-1]), reset=True)
    code, events, err = await toollatch_run(server, "anthropic", tmp_path)
    assert_failed_run(code, events, err, "stream interrupted")
    assert len(server.seen) == 3


@pytest.mark.parametrize("value", ["-5", "1e12", "garbage", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_run_json_a_503_with_an_odd_retry_after_exits_1_promptly(server, tmp_path, value):
    server.always = raw_reply(json_503("retry-after", value))
    code, events, err = await toollatch_run(server, "openai_chat", tmp_path)
    assert_failed_run(code, events, err, "HTTP 503: busy")
    assert len(server.seen) == (1 if value == "1e12" else 3)


async def test_run_json_a_gzip_bomb_exits_1_at_a_bound(server, tmp_path):
    # 1 GiB of zeros from 1 MiB: the line limit (8 MiB) fails the round, the body bound
    # (64 MiB) ends the reading; a bomb of valid SSE lines, which only the body bound stops,
    # is test_a_gzip_bomb_fails_the_round_and_is_asked_again_at_most_twice (a smaller bound)
    bomb = gzip_bomb(1024)
    head = http_head(200, [("content-type", "text/event-stream"), ("content-encoding", "gzip"),
                           ("content-length", str(len(bomb)))])  # fmt: skip
    server.always = raw_reply(head, bomb)
    code, events, err = await toollatch_run(server, "openai_chat", tmp_path)
    assert_failed_run(code, events, err, "no answer")
    assert "framing error" in events[-1]["error"]
    assert len(server.seen) == 3


async def test_run_json_takes_stream_retries_and_max_body_bytes_from_the_environment(
    server, tmp_path
):
    # a 200 KiB answer: under the default body bound (64 MiB), over a bound of 64 KiB
    long_text = wire("openai_chat", Text(text="x" * (200 * 1024), chunk_chars=8192))
    server.replies.append(sse_response(long_text))
    code, events, err = await toollatch_run(server, "openai_chat", tmp_path)
    assert code == 0, err
    server.always = sse_response(long_text)
    env = {"TOOLLATCH_MODEL__MAX_BODY_BYTES": "65536", "TOOLLATCH_MODEL__STREAM_RETRIES": "0"}
    code, events, err = await toollatch_run(server, "openai_chat", tmp_path, env=env)
    assert_failed_run(code, events, err, "max_body_bytes=65536")
    assert len(server.seen) == 2  # the first run's request, then this run's only one


def _with_lone_surrogates(events: list[bytes]) -> list[bytes]:
    return [e.replace(b"QQQQ", b"\\ud800") for e in events]


@EVERY_PROVIDER
async def test_run_json_with_lone_surrogates_in_text_ids_and_names_goes_on(
    server, provider, tmp_path
):
    # text, a call id and a tool name holding an escaped lone surrogate ("\ud800" in JSON)
    call = Call(call_id="call_QQQQ", name="write_QQQQ", arguments='{"path": "a.md"}')
    weather = Call(call_id="call_w", name="get_weather", arguments='{"city": "OsQQQQlo"}')
    first = _with_lone_surrogates(wire(provider, Text(text="hi QQQQ there"), call, weather))
    server.replies.append(sse_response(first))
    server.always = sse_response(_with_lone_surrogates(wire(provider, Text(text="done QQQQ"))))
    for view in ("", "--json"):  # the terminal view, then --json
        server.replies[:] = [sse_response(first)]
        code, events, err = await toollatch_run(server, provider, tmp_path, view=view)
        assert code == 0, err
        assert "Traceback" not in err
    texts = "".join(e["text"] for e in events if e["type"] == "text")
    assert "hi \ufffd there" in texts
    assert "done \ufffd" in texts
    failed = [e for e in events if e["type"] == "call_failed"]
    assert [e["error"] for e in failed] == ["unknown_tool"]
    assert "\ufffd" in failed[0]["name"]
    committed = [e for e in events if e["type"] == "call_committed"]
    assert [e["arguments"] for e in committed] == [{"city": "Os\ufffdlo"}]
    finished = [e["id"] for e in events if e["type"] == "tool_finished"]
    assert finished == [committed[0]["id"]]  # the tool ran, and said so
    assert len(events[-1]["calls"]) == 2  # every call paired
