"""What the relay's two servers (:mod:`._server`, :mod:`._proxy`) share to start uvicorn:
the listening socket and the wait until it accepts (internal)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

from ..core._errors import ConfigError, UsageError


def listening_socket(
    host: str, port: int, stack: contextlib.ExitStack | contextlib.AsyncExitStack
) -> socket.socket:
    """A TCP socket bound to ``host:port`` (closed with ``stack``); ConfigError when it cannot
    be bound. ``proto=IPPROTO_TCP``: asyncio sets TCP_NODELAY only on such sockets; without
    it every response after the first on a kept-alive connection waited for a delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    stack.callback(sock.close)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from None
    return sock


async def started(server: uvicorn.Server, sock: socket.socket, name: str) -> asyncio.Task[None]:
    """``server`` serving on ``sock`` in a task, once it accepts connections; UsageError
    (after the task's own error, if any) when it stopped instead."""
    task = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    while not server.started and not task.done():
        await asyncio.sleep(0.002)
    if not server.started:
        await task
        raise UsageError(f"{name} did not start")
    return task
