"""The relay against hostile pages and clients, over real loopback HTTP (issue 29's relay
rows): Host and Origin checks (DNS rebinding, CSRF), the access token, head size and time
limits, the connection cap, per-session quotas, security headers, the model allow-list."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import pytest

from relay_helpers import cancel, read_events, slow_script, start_run
from toollatch import ConfigError, RelayLimits
from toollatch.relay import RelayServer
from toollatch.relay._guard import RelayAccess, connection_cap

SCRIPTS = {"slow": slow_script()}
TOKEN = "t0ken-for-the-tests-0123456789"


@pytest.fixture(params=["httptools", "h11"])
def implementation(request, monkeypatch):
    """Both of uvicorn's HTTP/1.1 implementations get the protocol guard."""
    if request.param == "h11":
        monkeypatch.setenv("TOOLLATCH_HTTP", "h11")
    else:
        monkeypatch.delenv("TOOLLATCH_HTTP", raising=False)
    return request.param


@pytest.fixture
async def relay():
    async with RelayServer(scripts=SCRIPTS, delay_scale=0.2) as server:
        yield server


@pytest.fixture
async def client(relay):
    async with httpx.AsyncClient(base_url=relay.url, timeout=20) as c:
        yield c


def _port(relay: RelayServer) -> int:
    return int(relay.url.rsplit(":", 1)[1])


async def _raw(port: int, data: bytes, *, timeout: float = 10) -> bytes:
    """Send ``data`` on a new connection and read until the relay closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            return await reader.read()
    finally:
        writer.close()


# -- SEC1: Host and Origin -------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:8000",
        "127.0.0.1.nip.io",
        "localhost.attacker.example",
        "[::1",
        "",
        "a b",
    ],
)
async def test_a_host_that_does_not_name_the_relay_is_refused(client, host):
    for method, url, body in (("GET", "/", None), ("POST", "/runs", {"message": "hi"})):
        response = await client.request(method, url, json=body, headers={"host": host})
        assert response.status_code == 400, (host, method, response.text)
        assert response.json()["error"]["code"] == "host_not_allowed"
        assert "set-cookie" not in response.headers  # no session for a rebinding page


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST:1234", "[::1]:80", "127.0.0.2"]
)
async def test_loopback_hosts_are_served(client, host):
    response = await client.get("/", headers={"host": host})
    assert response.status_code == 200, response.text


async def test_an_allowed_host_is_served():
    async with (
        RelayServer(scripts=SCRIPTS, allowed_hosts=["relay.example", "*.corp.example"]) as relay,
        httpx.AsyncClient(base_url=relay.url, timeout=20) as client,
    ):
        for host, status in (
            ("relay.example", 200),
            ("a.corp.example:443", 200),
            ("corp.example", 400),
            ("relay.example.evil", 400),
        ):
            response = await client.get("/", headers={"host": host})
            assert response.status_code == status, host


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "http://attacker.example"},
        {"origin": "http://localhost:3000"},  # another port of localhost: same-site, not us
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ],
)
async def test_a_post_from_another_origin_is_403(client, headers):
    response = await client.post("/runs", json={"message": "hi"}, headers=headers)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "origin_not_allowed"
    run = await start_run(client, model="slow")
    refused = await client.post(run["cancel_url"], json={}, headers=headers)
    assert refused.status_code == 403  # SEC12: cancel has the same checks
    assert (await cancel(client, run["cancel_url"])).status_code == 202


async def test_a_post_from_the_relays_own_origin_is_served(relay, client):
    host = relay.url.removeprefix("http://")
    headers = {"origin": relay.url, "sec-fetch-site": "same-origin"}
    response = await client.post("/runs", json={"message": "hi"}, headers=headers)
    assert response.status_code == 201
    other = {
        "origin": "http://localhost:" + host.rsplit(":", 1)[1],
        "host": "localhost:" + host.rsplit(":", 1)[1],
    }
    assert (await client.post("/runs", json={"message": "hi"}, headers=other)).status_code == 201


def test_host_rules_beyond_loopback():
    wide = RelayAccess(any_ip_host=True, token=TOKEN)
    assert wide.host_allowed("192.168.1.5:8000")
    assert wide.host_allowed("[fe80::1]:8000")
    assert not wide.host_allowed("attacker.example:8000")  # rebinding needs a name
    assert not RelayAccess().host_allowed("192.168.1.5")
    assert RelayAccess(allowed_hosts=("*",)).host_allowed("anything.example")
    assert RelayAccess(allowed_origins=("https://relay.example",)).origin_allowed(
        "https://relay.example", "internal:8000"
    )
    for bad in (
        {"allowed_hosts": ("a/b",)},
        {"allowed_origins": ("relay.example",)},
        {"token": "short"},
        {"token": "x" * 20 + " y"},
    ):
        with pytest.raises(ConfigError):
            RelayAccess(**bad)


# -- SEC2: the access token ------------------------------------------------------------------


def test_a_bind_beyond_loopback_needs_a_token():
    with pytest.raises(ConfigError, match=r"relay\.token"):
        RelayServer(host="0.0.0.0")  # (refused before anything is bound)
    with pytest.raises(ConfigError, match=r"relay\.token"):
        RelayServer(host="my-laptop.local")
    server = RelayServer(host="0.0.0.0", token="auto")  # (never started)
    assert server.token is not None
    assert len(server.token) >= 40
    assert RelayServer(host="127.0.0.1").token is None


async def test_with_a_token_every_request_needs_it():
    async with (
        RelayServer(scripts=SCRIPTS, token=TOKEN) as relay,
        httpx.AsyncClient(base_url=relay.url, timeout=20) as anonymous,
    ):
        for url in ("/", "/static/app.js", "/metrics", "/?token=wrong-token-0123456789"):
            response = await anonymous.get(url)
            assert response.status_code == 401, url
            assert response.headers["www-authenticate"] == "Bearer"
        assert (await anonymous.post("/runs", json={"message": "hi"})).status_code == 401
        wrong = {"authorization": "Bearer " + TOKEN[:-1] + "x"}
        assert (await anonymous.get("/", headers=wrong)).status_code == 401
        bearer = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=bearer) as client:
            assert (await client.get("/")).status_code == 200
            run = await start_run(client)
            frames = await read_events(client, run["events_url"])
            assert frames[-1].event == "run_ended"
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as browser:
            opened = await browser.get(f"/?token={TOKEN}&x=1")
            assert opened.status_code == 303
            assert opened.headers["location"] == "/?x=1"
            assert "httponly" in opened.headers["set-cookie"].lower()
            assert "samesite=strict" in opened.headers["set-cookie"].lower()
            assert (await browser.get("/")).status_code == 200  # the cookie carries it now
            assert (await browser.post("/runs", json={"message": "hi"})).status_code == 201


def test_the_url_with_the_token_is_the_served_one():
    server = RelayServer(token=TOKEN)
    server._bound = ("127.0.0.1", 1234)
    assert server.token_url == f"http://127.0.0.1:1234/?token={TOKEN}"


# -- SEC4 / SEC5: heads, connections, readers ------------------------------------------------


async def test_a_request_head_over_the_limit_is_431(implementation):
    limits = RelayLimits(max_header_bytes=4096)
    async with RelayServer(scripts=SCRIPTS, limits=limits) as relay:
        port = _port(relay)
        big = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
        answer = await _raw(port, big)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
        assert b"x-content-type-options: nosniff" in answer
        endless = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000  # never ends
        assert (await _raw(port, endless)).startswith(b"HTTP/1.1 431 ")
        fits = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 3000 + b"\r\n"
        answer = await _raw(port, fits + b"Connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]


async def test_the_default_head_limit_refuses_a_64_mib_header(relay):
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(relay))
    sent = 0

    async def flood() -> None:
        nonlocal sent
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        with contextlib.suppress(ConnectionError):
            while sent < 64 << 20:
                writer.write(b"a" * (1 << 16))
                await writer.drain()
                sent += 1 << 16

    sending = asyncio.create_task(flood())
    try:
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        at = sent
    finally:
        sending.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert at < 16 << 20  # answered long before the 64 MiB (at 64 KiB, and a socket buffer)


async def test_a_slow_head_is_408_and_closed(implementation):
    limits = RelayLimits(header_timeout_s=0.3)
    async with RelayServer(scripts=SCRIPTS, limits=limits) as relay:
        port = _port(relay)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(20):  # one byte of header now and then (slowloris)
            if reader.at_eof():
                break
            with contextlib.suppress(ConnectionError):
                writer.write(b"X")
            await asyncio.sleep(0.05)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert time.monotonic() - started < 5
        silent = await _raw(port, b"")  # a connection that never sends a byte: closed too
        assert silent.startswith(b"HTTP/1.1 408 ")


async def test_a_slow_body_is_408():
    limits = RelayLimits(body_timeout_s=0.3)
    async with RelayServer(scripts=SCRIPTS, limits=limits) as relay:
        head = (
            b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\nConnection: close\r\n\r\n{"mess'
        )
        answer = await _raw(_port(relay), head)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"body_timeout" in answer


async def test_a_flood_of_idle_connections_does_not_lock_a_new_client_out(implementation):
    limits = RelayLimits(max_connections=30)
    async with RelayServer(scripts=SCRIPTS, limits=limits) as relay:
        port = _port(relay)
        flood = []
        try:
            for _ in range(60):  # twice the cap, each holding a half-sent head
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                flood.append(sock)
            await asyncio.sleep(0.2)
            assert relay.cap is not None
            assert len(relay.cap) <= 30
            assert relay.cap.evicted >= 30
            async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
                run = await start_run(client)  # a new client is served during the flood
                frames = await read_events(client, run["events_url"])
                assert frames[-1].event == "run_ended"
        finally:
            for sock in flood:
                sock.close()


def test_the_connection_cap_stays_under_the_open_file_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _what: (1024, 1024))
    assert connection_cap(RelayLimits()) == 1024 - 64 - 128 - 4 * 16
    assert connection_cap(RelayLimits(max_connections=100)) == 100
    monkeypatch.setattr(resource, "getrlimit", lambda _what: (200, 200))
    with pytest.raises(ConfigError, match="ulimit"):
        connection_cap(RelayLimits())


async def test_event_streams_per_session_are_capped_with_429():
    limits = RelayLimits(max_session_readers=2)
    async with (
        RelayServer(scripts=SCRIPTS, delay_scale=1, limits=limits) as relay,
        httpx.AsyncClient(base_url=relay.url, timeout=20) as client,
    ):
        run = await start_run(client, model="slow")
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                opened = await stack.enter_async_context(client.stream("GET", run["events_url"]))
                assert opened.status_code == 200
            third = await client.get(run["events_url"])
            assert third.status_code == 429
            assert third.json()["error"]["code"] == "too_many_readers"
            other = {"x-toollatch-session": "o" * 43}  # another session's run is its own
            assert (await client.get(run["events_url"], headers=other)).status_code == 404
        for _ in range(100):  # the streams closed: their places are free again
            if not relay.relay._readers:
                break
            await asyncio.sleep(0.02)
        async with client.stream("GET", run["events_url"]) as again:
            assert again.status_code == 200
        await cancel(client, run["cancel_url"])


# -- SEC6, SEC9, SEC10, SEC11, SEC12, SEC13 --------------------------------------------------


async def test_one_session_cannot_take_every_run_slot():
    limits = RelayLimits(max_active_runs=4, max_session_runs=2)
    async with (
        RelayServer(scripts=SCRIPTS, delay_scale=1, limits=limits) as relay,
        httpx.AsyncClient(base_url=relay.url, timeout=20) as greedy,
    ):
        runs = [await start_run(greedy, model="slow") for _ in range(2)]
        refused = await greedy.post("/runs", json={"message": "more", "model": "slow"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_session_runs"
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as other:
            mine = await start_run(other, model="slow")  # everyone else still gets a slot
            await cancel(other, mine["cancel_url"])
        for run in runs:
            await cancel(greedy, run["cancel_url"])
            await read_events(greedy, run["events_url"])
        again = await start_run(greedy)  # the session's finished runs free its quota
        await read_events(greedy, again["events_url"])


@pytest.mark.parametrize("bad", ["²", "①", "٣", "1²"])
async def test_a_non_ascii_digit_resume_point_is_400(client, bad):
    run = await start_run(client)
    response = await client.get(run["events_url"], params={"after": bad})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_last_event_id"


async def test_every_response_has_the_security_headers(relay, client):
    run = await start_run(client)
    responses = [
        await client.get("/"),
        await client.get("/static/app.js"),
        await client.get("/static/nope"),
        await client.get("/nope"),
        await client.get(run["events_url"] + "?after=x"),
        await client.post("/runs", content=b"x", headers={"content-type": "text/plain"}),
        await client.get("/", headers={"host": "attacker.example"}),
        await client.post("/runs", json={"message": "hi"}, headers={"origin": "http://a.example"}),
    ]
    for response in responses:
        assert response.headers["x-content-type-options"] == "nosniff", response.url
        assert response.headers["referrer-policy"] == "no-referrer", response.url
    await read_events(client, run["events_url"])


async def test_the_session_token_stays_in_the_cookie(relay):
    async with httpx.AsyncClient(base_url=relay.url, timeout=20) as browser:
        page = await browser.get("/")
        cookie = page.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        token = browser.cookies["toollatch_session"]
        response = await browser.post("/runs", json={"message": "hi"})
        assert response.status_code == 201
        assert token not in response.text
        assert "session" not in response.json()


async def test_cancel_needs_json_like_post_runs(client):
    run = await start_run(client, model="slow")
    for headers in (
        {},
        {"content-type": "text/plain"},
        {"content-type": "application/x-www-form-urlencoded"},
    ):
        response = await client.post(run["cancel_url"], content=b"", headers=headers)
        assert response.status_code == 415, headers
    bad = await client.post(run["cancel_url"], json={"x": 1})
    assert bad.status_code == 422
    assert (await cancel(client, run["cancel_url"])).status_code == 202


async def test_the_browser_may_only_name_allowed_models():
    async with (
        RelayServer(scripts=SCRIPTS, delay_scale=0) as scripted,  # its scripts' names
        httpx.AsyncClient(base_url=scripted.url, timeout=20) as client,
    ):
        refused = await client.post("/runs", json={"message": "hi", "model": "gpt-5"})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "model_not_allowed"
        await start_run(client, model="slow")
    async with RelayServer(delay_scale=0) as model_server:  # only to have a model to call
        base = model_server._scripted.base_url("openai_chat")
        async with (
            RelayServer(base_url=base, model="scripted") as relay,
            httpx.AsyncClient(base_url=relay.url, timeout=20) as client,
        ):
            refused = await client.post("/runs", json={"message": "hi", "model": "slow"})
            assert refused.json()["error"]["code"] == "model_not_allowed"  # the one only
            run = await start_run(client)
            assert (await read_events(client, run["events_url"]))[-1].event == "run_ended"
        async with (
            RelayServer(base_url=base, model="scripted", models=["scripted", "slow"]) as relay,
            httpx.AsyncClient(base_url=relay.url, timeout=20) as client,
        ):
            await start_run(client, model="slow")


def test_the_relay_section_configures_access_and_limits(monkeypatch):
    from toollatch.cli._app_config import validate
    from toollatch.runtime import load_config

    with pytest.raises(ConfigError, match=r"relay\.token"):
        validate({"relay": {"token": "short"}})
    with pytest.raises(ConfigError, match=r"relay\.max_header_bytes"):
        validate({"relay": {"max_header_bytes": 10}})
    monkeypatch.setenv("TOOLLATCH_RELAY__TOKEN", TOKEN)
    monkeypatch.setenv("TOOLLATCH_RELAY__ALLOWED_HOSTS", "[relay.example]")
    config = load_config()
    assert config.relay.token == TOKEN
    assert config.relay.allowed_hosts == ("relay.example",)
    assert TOKEN not in config.effective()  # `toollatch config check` does not print it
