"""Model clients against a real HTTP server on loopback (uvicorn, port 0)."""

from __future__ import annotations

import asyncio
import gzip
import socket
from pathlib import Path

import httpx
import pytest

from loopback_http import (
    dropping_reply,
    json_reply,
    loopback,
    sse,
    stalling_reply,
    stream_reply,
)
from toollatch import (
    ClientLimits,
    ConfigError,
    ModelConnectError,
    ModelHTTPError,
    RetryPolicy,
    StreamInterrupted,
    StreamParser,
    StreamTimeout,
    ToolSpec,
    UsageError,
    load_tools,
    model_client,
)
from toollatch.runtime._clients import error_message, gemini_declaration, retry_after_s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
FAST = RetryPolicy(attempts=3, initial_delay_s=0.5, max_delay_s=8, max_total_wait_s=30, jitter=0)


@pytest.fixture
async def server():
    async with loopback() as state:
        yield state
        for client in state.clients:  # their pooled keep-alive connections
            await client.aclose()


class Sleeps:
    """A recording ``sleep`` for the retry loop: the waits it asked for, none really made."""

    def __init__(self):
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def client_for(server, provider="openai_chat", *, retry=FAST, limits=None, sleeps=None, **kw):
    client = model_client(
        provider,
        model=kw.pop("model", "test-model"),
        base_url=server.url,
        retry=retry,
        limits=limits,
        sleep=sleeps or Sleeps(),
        env=kw.pop("env", {}),
        **kw,
    )
    server.clients.append(client)
    return client


async def drain(stream, into: list[bytes]) -> None:
    async for chunk in stream:
        into.append(chunk)


async def body_of(client, history=(), **kw) -> bytes:
    async with client.stream(list(history), **kw) as s:
        return b"".join([chunk async for chunk in s])


# -- what each provider's request looks like on the wire ------------------------------------

HISTORY = {
    "openai_chat": [{"role": "user", "content": "Weather in Oslo?"}],
    "openai_responses": [{"role": "user", "content": "Weather in Oslo?"}],
    "anthropic": [{"role": "user", "content": "Weather in Oslo?"}],
    "gemini": [{"role": "user", "parts": [{"text": "Weather in Oslo?"}]}],
}
SCHEMA = dict(WEATHER.parameters)
EXPECTED = {
    "openai_chat": (
        "/chat/completions",
        "",
        {"authorization": "Bearer k-1"},
        {
            "model": "m-1",
            "messages": [{"role": "system", "content": "Be brief."}, *HISTORY["openai_chat"]],
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather for a city.",
                        "parameters": SCHEMA,
                    },
                }
            ],
            "max_completion_tokens": 99,
        },
    ),
    "openai_responses": (
        "/responses",
        "",
        {"authorization": "Bearer k-1"},
        {
            "model": "m-1",
            "input": HISTORY["openai_responses"],
            "stream": True,
            "instructions": "Be brief.",
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Weather for a city.",
                    "parameters": SCHEMA,
                }
            ],
            "max_output_tokens": 99,
        },
    ),
    "anthropic": (
        "/v1/messages",
        "",
        {"x-api-key": "k-1", "anthropic-version": "2023-06-01"},
        {
            "model": "m-1",
            "messages": HISTORY["anthropic"],
            "max_tokens": 99,
            "stream": True,
            "system": "Be brief.",
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Weather for a city.",
                    "input_schema": SCHEMA,
                }
            ],
        },
    ),
    "gemini": (
        "/v1beta/models/m-1:streamGenerateContent",
        "alt=sse",
        {"x-goog-api-key": "k-1"},
        {
            "contents": HISTORY["gemini"],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "tools": [
                {
                    "functionDeclarations": [
                        {
                            "name": "get_weather",
                            "description": "Weather for a city.",
                            "parameters": SCHEMA,
                        }
                    ]
                }
            ],
            "generationConfig": {"maxOutputTokens": 99},
        },
    ),
}


@pytest.mark.parametrize("provider", sorted(EXPECTED))
async def test_the_request_is_the_providers_own(server, provider):
    path, query, auth, body = EXPECTED[provider]
    server.replies.append(stream_reply([b"data: {}\n\n"]))
    headers = {"x-trace": "t", "Accept": "text/event-stream"}  # a caller's header replaces ours
    client = client_for(server, provider, model="m-1", api_key="k-1", headers=headers)
    got = await body_of(
        client, HISTORY[provider], tools=[WEATHER], system="Be brief.", max_tokens=99
    )
    assert got == b"data: {}\n\n"
    [seen] = server.seen
    assert (seen.method, seen.path, seen.query) == ("POST", path, query)
    assert seen.json() == body
    for name, value in {**auth, "x-trace": "t", "content-type": "application/json"}.items():
        assert seen.headers[name] == value
    assert seen.headers["accept"] == "text/event-stream"
    assert client.provider == provider


async def test_anthropic_always_sends_max_tokens_and_extra_keys_win(server):
    server.replies.append(stream_reply([b"event: ping\ndata: {}\n\n"]))
    client = client_for(server, "anthropic")
    await body_of(client, HISTORY["anthropic"], extra={"temperature": 0, "stream": True})
    body = server.seen[0].json()
    assert body["max_tokens"] == 4096
    assert body["temperature"] == 0
    assert "tools" not in body
    assert "system" not in body


def test_gemini_gets_parameters_only_inside_its_schema_subset():
    plain = gemini_declaration(WEATHER)
    assert plain["parameters"] == SCHEMA
    assert "parametersJsonSchema" not in plain
    strict = ToolSpec(name="t", parameters={**SCHEMA, "additionalProperties": False})
    union = ToolSpec(
        name="u",
        parameters={"type": "object", "properties": {"x": {"type": ["string", "null"]}}},
    )
    nested = ToolSpec(
        name="n",
        parameters={
            "type": "object",
            "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/x"}}},
            "$defs": {"x": {"type": "string"}},
        },
    )
    for spec in (strict, union, nested):
        declaration = gemini_declaration(spec)
        assert declaration["parametersJsonSchema"] == dict(spec.parameters)
        assert "parameters" not in declaration


def test_gemini_model_names_may_carry_the_models_prefix():
    client = model_client("gemini", model="models/gemini-x", base_url="http://127.0.0.1:9")
    assert client.url == ("http://127.0.0.1:9/v1beta/models/gemini-x:streamGenerateContent?alt=sse")


# -- streaming ------------------------------------------------------------------------------


async def test_chunks_reach_the_caller_before_the_server_finishes(server):
    first_seen = asyncio.Event()
    server.replies.append(stream_reply([b"data: 1\n\n", first_seen.wait, b"data: 2\n\n"]))
    got = []
    async with asyncio.timeout(10):  # without incremental delivery this would deadlock
        async with client_for(server).stream([]) as s:
            async for chunk in s:
                got.append(chunk)
                first_seen.set()  # the server writes its second piece only after this
    assert got == [b"data: 1\n\n", b"data: 2\n\n"]
    assert s.status == 200
    assert s.attempts == 1
    assert s.bytes_received == 18


async def test_a_compressed_body_arrives_decoded(server):
    data = sse([{"n": i} for i in range(200)])
    packed = gzip.compress(data)

    async def gzipped(scope, receive, send):
        headers = [(b"content-type", b"text/event-stream"), (b"content-encoding", b"gzip")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(0, len(packed), 100):
            await send(
                {"type": "http.response.body", "body": packed[i : i + 100], "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    server.replies.append(gzipped)
    assert await body_of(client_for(server)) == data


async def test_the_recorded_stream_served_and_parsed_gives_the_calls(server):
    data = (EXAMPLES / "openai_parallel_calls.sse").read_bytes()
    pieces = [data[i : i + 37] for i in range(0, len(data), 37)]  # reads cut anywhere
    server.replies.append(stream_reply(pieces))
    parser = StreamParser("openai_chat", tools=load_tools(EXAMPLES / "tools.json"))
    async with client_for(server).stream([{"role": "user", "content": "hi"}]) as s:
        async for chunk in s:
            parser.feed(chunk)
    round_ = parser.finish()
    assert [(c.name, dict(c.arguments)) for c in round_.committed()] == [
        ("get_weather", {"city": "Zürich", "unit": "c"}),
        ("write_file", {"path": "notes/today.md", "content": "# Today\n- buy milk ☕\n- call Ana"}),
    ]
    assert round_.text == "Checking the weather and saving your note."


async def test_a_recorded_anthropic_stream_cut_at_max_tokens_stays_truncated(server):
    data = (EXAMPLES / "anthropic_truncated_at_max_tokens.sse").read_bytes()
    server.replies.append(stream_reply([data[i : i + 50] for i in range(0, len(data), 50)]))
    parser = StreamParser("anthropic")
    async with client_for(server, "anthropic").stream([]) as s:
        async for chunk in s:
            parser.feed(chunk)
    round_ = parser.finish()
    assert (round_.ended, round_.stop_reason) == ("truncated", "max_tokens")
    assert [c.error for c in round_.calls] == ["truncated"]
    assert s.bytes_received == len(data)


async def test_leaving_mid_stream_closes_the_connection(server):
    ended = asyncio.Event()
    server.replies.append(stream_reply([b"data: 1\n\n", server.release.wait], ended=ended))
    async with client_for(server).stream([]) as s:
        async for _ in s:
            break  # the caller stops reading: the server must see the client go
    async with asyncio.timeout(5):
        await ended.wait()  # set by the server before its release event: we disconnected
    assert not server.release.is_set()


async def test_a_dropped_connection_mid_stream_is_interrupted(server):
    server.replies.append(dropping_reply(b"data: {}\n\n"))
    got = []
    async with client_for(server).stream([]) as s:
        with pytest.raises(StreamInterrupted) as caught:
            await drain(s, got)
    assert got == [b"data: {}\n\n"]  # what arrived before the break was handed over
    assert caught.value.bytes_received == 10
    assert isinstance(caught.value.cause, httpx.RemoteProtocolError)
    assert len(server.seen) == 1  # bytes were handed over: never retried


async def test_a_stall_between_chunks_is_an_idle_timeout(server):
    server.replies.append(stream_reply([b"data: 1\n\n", server.release.wait]))
    limits = ClientLimits(idle_s=0.2, first_byte_s=5)
    got = []
    async with client_for(server, limits=limits).stream([]) as s:
        with pytest.raises(StreamTimeout) as caught:
            await drain(s, got)
        assert [c async for c in s] == []  # a failed stream stays ended
    assert got == [b"data: 1\n\n"]
    assert (caught.value.kind, caught.value.seconds) == ("idle", 0.2)


@pytest.mark.parametrize("headers_first", [False, True])
async def test_no_first_byte_in_time_is_a_first_byte_timeout(server, headers_first):
    server.replies.append(stalling_reply(server.release, headers_first=headers_first))
    client = client_for(server, limits=ClientLimits(first_byte_s=0.2))
    with pytest.raises(StreamTimeout) as caught:
        await body_of(client)
    assert caught.value.kind == "first_byte"
    # (under load the server may record the request after the client gave up on it)
    for _ in range(500):
        if server.seen:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # a retry would have been sent before the error was raised
    assert len(server.seen) == 1  # not retried: the deadline is the caller's


# -- errors and retries ---------------------------------------------------------------------


async def test_429_with_retry_after_is_retried_after_that_wait(server):
    error = {"error": {"message": "Rate limit reached", "type": "requests"}}
    server.replies += [
        json_reply(429, error, {"retry-after": "2"}),
        stream_reply([b"data: ok\n\n"]),
    ]
    sleeps = Sleeps()
    client = client_for(server, sleeps=sleeps)
    async with client.stream([]) as s:
        assert [c async for c in s] == [b"data: ok\n\n"]
    assert sleeps.waits == [2.0]
    assert s.attempts == 2
    assert len(server.seen) == 2
    assert server.seen[0].body == server.seen[1].body


async def test_500_then_success_backs_off_exponentially(server):
    server.replies += [
        json_reply(500, {"error": {"message": "boom"}}),
        json_reply(503, {"error": {"message": "busy"}}),
        stream_reply([b"data: ok\n\n"]),
    ]
    sleeps = Sleeps()
    assert await body_of(client_for(server, sleeps=sleeps)) == b"data: ok\n\n"
    assert sleeps.waits == [0.5, 1.0]


async def test_jitter_shortens_a_backoff_by_at_most_its_fraction(server):
    server.replies += [json_reply(502, {}), stream_reply([b"x"])]
    sleeps = Sleeps()
    retry = RetryPolicy(initial_delay_s=1.0, jitter=0.5)
    client = client_for(server, retry=retry, sleeps=sleeps, random_unit=lambda: 0.5)
    await body_of(client)
    assert sleeps.waits == [0.75]


async def test_retries_stop_at_the_attempt_limit_with_the_last_error(server):
    server.replies += [json_reply(503, {"error": {"message": f"busy {i}"}}) for i in range(3)]
    sleeps = Sleeps()
    with pytest.raises(ModelHTTPError) as caught:
        await body_of(client_for(server, sleeps=sleeps))
    assert (caught.value.status, caught.value.attempts) == (503, 3)
    assert caught.value.message == "busy 2"
    assert sleeps.waits == [0.5, 1.0]
    assert len(server.seen) == 3


async def test_the_servers_own_retry_hint_wins(server):
    server.replies += [
        json_reply(409, {}, {"x-should-retry": "false"}),
        json_reply(400, {}, {"x-should-retry": "true"}),
        stream_reply([b"x"]),
    ]
    with pytest.raises(ModelHTTPError) as caught:
        await body_of(client_for(server))
    assert caught.value.status == 409
    assert await body_of(client_for(server)) == b"x"  # the 400 said: retry
    assert len(server.seen) == 3


async def test_a_response_broken_before_its_first_byte_is_retried(server):
    server.replies += [dropping_reply(b""), stream_reply([b"data: ok\n\n"])]
    sleeps = Sleeps()
    async with client_for(server, sleeps=sleeps).stream([]) as s:
        assert [c async for c in s] == [b"data: ok\n\n"]
    assert s.attempts == 2
    assert sleeps.waits == [0.5]


async def test_a_wait_past_the_total_budget_is_not_made(server):
    server.replies += [json_reply(429, {}, {"retry-after": "31"}), stream_reply([b"x"])]
    sleeps = Sleeps()
    with pytest.raises(ModelHTTPError) as caught:
        await body_of(client_for(server, sleeps=sleeps))
    assert caught.value.retry_after_s == 31.0
    assert sleeps.waits == []
    assert len(server.seen) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"error": {"message": "Unknown parameter: 'foo'.", "type": "invalid_request_error"}},
            "Unknown parameter: 'foo'. (invalid_request_error)",
        ),
        (
            {"type": "error", "error": {"type": "invalid_request_error", "message": "bad\nx"}},
            "bad x (invalid_request_error)",
        ),
        (
            [
                {
                    "error": {
                        "code": 400,
                        "message": "API key not valid.",
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ],
            "API key not valid. (INVALID_ARGUMENT)",
        ),
    ],
)
async def test_400_is_not_retried_and_its_message_is_parsed(server, body, message):
    server.replies += [json_reply(400, body), stream_reply([b"x"])]
    sleeps = Sleeps()
    with pytest.raises(ModelHTTPError) as caught:
        await body_of(client_for(server, sleeps=sleeps))
    assert caught.value.status == 400
    assert caught.value.message == message
    assert caught.value.url is not None
    assert caught.value.url.endswith("/chat/completions")  # (issue 35: the URL tried)
    assert str(caught.value) == f"openai_chat: HTTP 400: {message} (from {caught.value.url})"
    assert sleeps.waits == []
    assert len(server.seen) == 1


async def test_only_so_much_of_an_error_body_is_read(server):
    server.replies.append(json_reply(400, {"error": {"message": "x" * 100_000}}))
    client = client_for(server, limits=ClientLimits(error_body_bytes=1000))
    with pytest.raises(ModelHTTPError) as caught:
        await body_of(client)
    assert len(caught.value.body) == 1000
    assert len(caught.value.message) <= 300


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: connecting is refused


async def test_connect_errors_are_retried_then_raised():
    sleeps = Sleeps()
    client = model_client(
        "anthropic",
        model="m",
        base_url=f"http://127.0.0.1:{closed_port()}",
        retry=RetryPolicy(attempts=2, jitter=0),
        sleep=sleeps,
    )
    with pytest.raises(ModelConnectError) as caught:
        await body_of(client)
    assert caught.value.attempts == 2
    assert sleeps.waits == [0.5]
    assert isinstance(caught.value.cause, httpx.ConnectError)
    await client.aclose()


def test_error_messages_read_any_body():
    assert error_message(b"") == "(empty body)"
    assert error_message(b"<html>\n  Bad Gateway\n</html>") == "<html> Bad Gateway </html>"
    assert error_message(b'{"error": "quota"}') == "quota"
    assert error_message(b'{"error": {"code": 429}}') == "429"
    assert error_message(b"\xff" * 400).endswith("…")


def test_retry_after_reads_seconds_dates_and_milliseconds():
    now = 1_700_000_000.0
    assert retry_after_s({"Retry-After": "3"}, now) == 3.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    date = "Tue, 14 Nov 2023 22:13:30 GMT"  # now + 10 s
    assert retry_after_s({"retry-after": date}, now) == pytest.approx(10.0)
    assert retry_after_s({"retry-after": date}, now + 60) == 0.0
    assert retry_after_s({"retry-after": "soon"}, now) is None
    assert retry_after_s({"retry-after": "inf"}, now) is None
    assert retry_after_s({}, now) is None


# -- configuration --------------------------------------------------------------------------


async def test_key_and_base_url_come_from_the_environment(server):
    server.replies.append(stream_reply([b"x"]))
    env = {"OPENAI_API_KEY": "sk-env", "OPENAI_BASE_URL": server.url + "/"}
    client = model_client("openai_responses", model="m", env=env, sleep=Sleeps())
    assert client.base_url == server.url
    await body_of(client)
    assert server.seen[0].headers["authorization"] == "Bearer sk-env"
    assert server.seen[0].path == "/responses"
    await client.aclose()


async def test_an_explicit_key_wins_and_loopback_needs_none(server):
    server.replies += [stream_reply([b"x"]), stream_reply([b"x"])]
    env = {"ANTHROPIC_API_KEY": "from-env"}
    await body_of(client_for(server, "anthropic", api_key="given", env=env))
    await body_of(client_for(server, "anthropic"))
    assert server.seen[0].headers["x-api-key"] == "given"
    assert "x-api-key" not in server.seen[1].headers


@pytest.mark.parametrize(
    ("provider", "variable"),
    [
        ("openai_chat", "OPENAI_API_KEY"),
        ("openai_responses", "OPENAI_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
        ("gemini", "GEMINI_API_KEY"),
    ],
)
def test_the_real_host_without_a_key_is_a_config_error(provider, variable):
    with pytest.raises(ConfigError, match=variable):
        model_client(provider, model="m", env={})
    explicit = {"openai_chat": "https://api.openai.com/v1"}.get(provider)
    if explicit:  # the provider's host given explicitly still needs its key
        with pytest.raises(ConfigError, match=variable):
            model_client(provider, model="m", base_url=explicit, env={})
    client = model_client(provider, model="m", env={variable: "k"})
    assert client.url.startswith("https://")


def test_gemini_also_reads_google_api_key():
    client = model_client("gemini", model="m", env={"GOOGLE_API_KEY": "g"})
    assert client.base_url == "https://generativelanguage.googleapis.com"


def test_an_unknown_provider_is_usage_error():
    with pytest.raises(
        UsageError, match="openai_chat, openai_responses, anthropic, gemini, bedrock"
    ):
        model_client("nope", model="m", env={})


@pytest.mark.parametrize(
    "make",
    [
        lambda: model_client("openai_chat", model="", base_url="http://127.0.0.1:1"),
        lambda: model_client("openai_chat", model="m", base_url="ftp://x"),
        lambda: model_client("openai_chat", model="m", base_url="http://h/v1?x=1"),
        lambda: model_client("openai_chat", model="m", env={"OPENAI_BASE_URL": "nonsense"}),
        lambda: ClientLimits(idle_s=0),
        lambda: ClientLimits(first_byte_s=float("nan")),
        lambda: ClientLimits(error_body_bytes=-1),
        lambda: RetryPolicy(attempts=0),
        lambda: RetryPolicy(jitter=2),
        lambda: RetryPolicy(max_total_wait_s=-1),
    ],
)
def test_bad_configuration_is_a_config_error(make):
    with pytest.raises(ConfigError):
        make()


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens": 0}, {"max_tokens": 1.5}, {"tools": [{"name": ""}]}],
)
def test_bad_request_arguments_raise_before_sending(kwargs):
    client = model_client("openai_chat", model="m", base_url="http://127.0.0.1:1")
    with pytest.raises((UsageError, ConfigError)):
        client.stream([], **kwargs)
    with pytest.raises(UsageError):
        client.stream("hello")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not JSON"):
        client.stream([{"role": "user", "content": object()}])


async def test_a_stream_is_entered_once_and_used_only_when_entered(server):
    server.replies.append(stream_reply([b"x"]))
    s = client_for(server).stream([])
    with pytest.raises(UsageError):
        s.__aiter__()
    async with s:
        assert [c async for c in s] == [b"x"]
    with pytest.raises(UsageError):
        await s.__aenter__()


async def test_a_shared_http_client_is_left_open(server):
    server.replies += [stream_reply([b"x"]), stream_reply([b"y"])]
    async with httpx.AsyncClient() as http:
        async with client_for(server, http=http) as client:
            assert await body_of(client) == b"x"
        assert not http.is_closed
        async with client_for(server, http=http) as again:
            assert await body_of(again) == b"y"


# -- what a conversation costs the client --------------------------------------------------


async def test_clients_made_per_conversation_share_one_tls_context(server, monkeypatch):
    # loading the CA bundle is ~25-50 ms of CPU: once per process, not per model_client()
    made: list[object] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> object:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    monkeypatch.setattr("toollatch.runtime._clients._pool._TLS", [])
    for _ in range(3):
        server.replies.append(stream_reply([b"data: {}\n\n"]))
        async with client_for(server) as client:
            assert await body_of(client) == b"data: {}\n\n"
    assert len(made) == 1


def ports_seen(reply, ports: list[int]):
    """``reply``, recording the client port of the connection each request came on."""

    async def app(scope, receive, send):
        ports.append(scope["client"][1])
        await reply(scope, receive, send)

    return app


async def test_conversations_in_one_loop_share_kept_alive_connections(server):
    # each `async with model_client(...)` is a new client; the loop's pool is shared, so the
    # second and third conversations reuse the first one's connection
    ports: list[int] = []
    for _ in range(3):
        server.replies.append(ports_seen(stream_reply([b"data: {}\n\n"]), ports))
        async with client_for(server) as client:
            assert await body_of(client) == b"data: {}\n\n"
    assert len(ports) == 3
    assert len(set(ports)) == 1


class KeepAliveServer:
    """One connection at a time on a thread: answers every request with a small event
    stream and keeps the connection open; ``closed`` is set when the client closes it."""

    BODY = b"data: {}\n\n"

    def __init__(self) -> None:
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            pending = b""
            while True:
                read = connection.recv(65536)
                if not read:
                    self.closed.set()
                    return
                pending += read
                while b"\r\n\r\n" in pending:
                    head, _, rest = pending.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(line.split(b":", 1)[1])
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
                    if len(rest) < length:
                        break
                    pending = rest[length:]
                    connection.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        + b"content-length: %d\r\n\r\n" % len(self.BODY)
                        + self.BODY
                    )

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def keep_alive():
    server = KeepAliveServer()
    yield server
    server.close()


def test_the_shared_connections_close_when_the_loop_shuts_down(keep_alive):
    import gc
    import warnings

    async def conversation() -> bytes:
        async with model_client(
            "openai_chat", model="m", base_url=keep_alive.url, env={}, retry=FAST
        ) as client:
            return await body_of(client)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(conversation()) == KeepAliveServer.BODY
        # the client is gone, its connection kept alive for the next one until the loop
        # shut down: asyncio.run cancels the pool's keeper, which closes it
        assert keep_alive.closed.wait(10)
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_idle_shared_connections_close_after_the_keep_alive_expiry(keep_alive, monkeypatch):
    monkeypatch.setattr("toollatch.runtime._clients._pool.KEEP_IDLE_S", 0.05)
    client = model_client("openai_chat", model="m", base_url=keep_alive.url, env={}, retry=FAST)
    async with client:
        assert await body_of(client) == KeepAliveServer.BODY
        # held: open however long it is idle
        assert not await asyncio.to_thread(keep_alive.closed.wait, 0.3)
    # given back, with the loop still running: closed once idle for KEEP_IDLE_S
    assert await asyncio.to_thread(keep_alive.closed.wait, 10)


def test_a_model_client_works_in_one_loop_after_another():
    server = KeepAliveServer()
    try:
        client = model_client("openai_chat", model="m", base_url=server.url, env={}, retry=FAST)
        # the first loop's pool is closed with it; the second request takes the next loop's
        assert asyncio.run(body_of(client)) == KeepAliveServer.BODY
        assert server.closed.wait(10)
    finally:
        server.close()
    again = KeepAliveServer()
    try:
        client.base_url = again.url

        async def twice() -> bytes:
            async with client:
                return await body_of(client)

        assert asyncio.run(twice()) == KeepAliveServer.BODY
    finally:
        again.close()
