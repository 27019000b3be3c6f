"""A cancel of a task that waits for another task it stopped is never lost (tools/_tasks.join).

Six places stop a task and wait for it to end: the agent run's close, the durable round's
cut, ``RelayRun.stop``, the proxy's and the relay server's exits, an MCP connection's close.
When the waiting task was itself cancelled meanwhile, its cancel reached the stopped task and
came back out as that task's own ``CancelledError``, which the wait swallowed (or the stopped
task swallowed it and returned): the waiter went on as if never cancelled. Here the stopped
task always takes a while to end (it catches its cancel and waits for more), the waiter is
cancelled in that while, and it must end cancelled, promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from toollatch import Agent, PreviewPolicy, RelayLimits, model_client, tool
from toollatch.mcp import McpServer, McpToolSource
from toollatch.mcp._connection import Connection
from toollatch.relay import ProxyServer, RelayServer
from toollatch.relay._runs import RelayRun
from toollatch.scripted import Call, Script, ScriptedServer, Turn
from toollatch.tools._tasks import join

PROMPT_S = 5.0
"""The bound on "promptly" (every wait below is released by the cancel itself)."""


async def stubborn(closing: asyncio.Event) -> str:
    """Waits until cancelled; then catches the cancel and waits for another before ending
    (a cleanup that takes a while), as a tool, a driver or a server may."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        closing.set()
        await asyncio.Event().wait()  # ends only with the next cancel
    return "unreachable"


async def ends_cancelled(waiter: asyncio.Task[Any]) -> None:
    """``waiter`` ends within :data:`PROMPT_S`, cancelled (not with a value or an error)."""
    done, _ = await asyncio.wait({waiter}, timeout=PROMPT_S)
    assert done, "the cancelled waiter did not end"
    if not waiter.cancelled():
        pytest.fail(f"the waiter's cancel was lost: it ended with {waiter.result()!r}")


async def cancelled_once_closing(waiter: asyncio.Task[Any], closing: asyncio.Event) -> None:
    """Once the stopped task is closing (``closing``), cancel ``waiter``: it must end
    cancelled (:func:`ends_cancelled`)."""
    await asyncio.wait_for(closing.wait(), PROMPT_S)
    waiter.cancel()
    await ends_cancelled(waiter)


# -- the helper ---------------------------------------------------------------------------------


async def test_join_swallows_only_the_joined_tasks_own_cancel():
    closing = asyncio.Event()
    inner = asyncio.create_task(stubborn(closing))
    await asyncio.sleep(0)
    inner.cancel()
    await asyncio.wait_for(closing.wait(), PROMPT_S)
    inner.cancel()  # its second cancel: it ends cancelled, and that is no error for the waiter
    await join(inner)
    assert inner.cancelled()


@pytest.mark.parametrize("inner_returns", [False, True])
async def test_join_raises_when_the_waiter_is_cancelled(inner_returns):
    closing = asyncio.Event()

    async def swallowing() -> str:  # catches every cancel and returns
        with contextlib.suppress(asyncio.CancelledError):
            await stubborn(closing)
        return "swallowed"

    inner = asyncio.create_task(swallowing() if inner_returns else stubborn(closing))

    async def waiter() -> str:
        inner.cancel()
        await join(inner)
        return "went on"

    task = asyncio.create_task(waiter())
    await cancelled_once_closing(task, closing)
    assert inner.done()  # joined to its end: nothing left running


async def test_join_under_a_timeout_raises_its_timeout():
    closing = asyncio.Event()
    inner = asyncio.create_task(stubborn(closing))
    await asyncio.sleep(0)
    inner.cancel()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await join(inner)
    assert closing.is_set() and inner.cancelled()


async def test_join_passes_the_tasks_other_errors_on():
    async def failing() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    inner = asyncio.create_task(failing())
    await asyncio.sleep(0)
    inner.cancel()
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await join(inner)


# -- the sites ----------------------------------------------------------------------------------


async def test_an_agent_runs_consumer_cancelled_while_the_run_closes_is_cancelled():
    # The consumer leaves the run at tool_started (aclose): the run's close cancels its driver
    # and waits for it; the tool takes a while to end; the consumer is cancelled meanwhile.
    started, closing = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """Takes its time, even to stop."""
        started.set()
        return await stubborn(closing)

    script = Script(turns=(Turn(items=(Call(call_id="c1", name="slow", arguments="{}"),)),))
    async with ScriptedServer({"s": script}, delay_scale=0) as server:
        client = model_client("openai_chat", model="s", base_url=server.base_url("openai_chat"))
        async with client:
            run = Agent(client, [slow]).run("go")

            async def consume() -> str:
                async with contextlib.aclosing(run.__aiter__()) as events:
                    async for event in events:
                        if event.type == "tool_started":
                            await started.wait()
                            break
                return "went on"

            consumer = asyncio.create_task(consume())
            await cancelled_once_closing(consumer, closing)


async def test_a_durable_round_cut_while_its_caller_is_cancelled_is_cancelled():
    # _until_stopped cuts the round's work at the run's deadline and waits for it to end.
    durable = pytest.importorskip("toollatch.runtime._durable")  # (the [durable] extra)
    closing = asyncio.Event()
    conversation = "cancel-propagation"
    try:
        cut = asyncio.create_task(
            durable._until_stopped(stubborn(closing), conversation, time.time() + 0.01)
        )
        await cancelled_once_closing(cut, closing)
    finally:
        durable._CANCELS.pop(conversation, None)


async def test_a_durable_round_whose_caller_is_cancelled_is_cancelled_too():
    # cancelled while it waits for the work (before any stop): the work must not go on alone
    durable = pytest.importorskip("toollatch.runtime._durable")  # (the [durable] extra)
    started = asyncio.Event()
    conversation = "cancel-propagation-caller"

    async def work() -> str:
        started.set()
        await asyncio.sleep(30)
        return "done"

    try:
        job = asyncio.ensure_future(work())
        cut = asyncio.create_task(durable._until_stopped(job, conversation, None))
        await asyncio.wait_for(started.wait(), PROMPT_S)
        cut.cancel()
        await ends_cancelled(cut)
        assert job.cancelled()  # not left running, unawaited
    finally:
        durable._CANCELS.pop(conversation, None)


async def test_a_relay_runs_stop_cancelled_while_its_driver_ends_is_cancelled():
    closing, told = asyncio.Event(), asyncio.Event()
    run = RelayRun("session", PreviewPolicy(), RelayLimits())

    async def body() -> None:  # a run whose stop takes a while (until cancelled)
        await told.wait()
        closing.set()
        await asyncio.Event().wait()

    async def ended() -> None:
        pass

    run.drive(body, lambda _reason: told.set(), ended)
    stopper = asyncio.create_task(run.stop())
    await cancelled_once_closing(stopper, closing)
    assert run.driver is not None and run.driver.done()


async def held_request(url: str, path: str) -> asyncio.StreamWriter:
    """A POST to ``url`` + ``path`` whose body never comes: the server's graceful shutdown
    waits for it (up to a second); the connection, to close."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    _reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n{".encode()
    )
    await writer.drain()
    return writer


@pytest.mark.parametrize("which", ["proxy", "relay"])
async def test_a_server_exit_cancelled_while_uvicorn_stops_is_cancelled(which):
    go = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def serve() -> str:
        if which == "proxy":
            server: Any = ProxyServer("http://127.0.0.1:9/v1")  # (never asked)
            path = "/v1/chat/completions"
        else:
            server, path = RelayServer(delay_scale=0), "/runs"
        async with server:
            writers.append(await held_request(server.url, path))
            await asyncio.sleep(0.05)  # the request reached its handler, which reads the body
            go.set()
        return "went on"  # (the exit waits for uvicorn, which waits for that request)

    serving = asyncio.create_task(serve())
    try:
        going = asyncio.ensure_future(go.wait())
        await asyncio.wait({serving, going}, timeout=PROMPT_S, return_when=asyncio.FIRST_COMPLETED)
        going.cancel()
        assert go.is_set(), serving
        await asyncio.sleep(0.05)  # the exit waits for uvicorn's task (a second at most)
        assert not serving.done()
        serving.cancel()
        await ends_cancelled(serving)
    finally:
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def test_an_mcp_open_cancelled_while_the_connection_closes_is_cancelled(monkeypatch):
    # The server does not answer within connect_timeout_s: the connection is closed (its
    # owner task cancelled) and waited for; the owner takes a while to end (as the SDK's
    # shutdown of a stdio process does); the caller is cancelled meanwhile. The owner is a
    # stand-in: the SDK's shielded shutdown is defeated by a second native cancel and leaks
    # the process (a ResourceWarning at random), with or without this fix.
    closing = asyncio.Event()

    async def owner(_self: Connection) -> None:
        await stubborn(closing)

    monkeypatch.setattr(Connection, "_own", owner)
    server = McpServer(name="mute", command=[sys.executable, "-V"], connect_timeout_s=0.01)

    async def open_source() -> str:
        async with McpToolSource([server]):
            pass
        return "went on"

    opening = asyncio.create_task(open_source())
    await cancelled_once_closing(opening, closing)
