"""One live connection to one MCP server, on the official SDK (the only module importing it).

Theory of operation. The SDK's ``Client`` is an anyio context manager whose task group must
be entered and left by one task, and which cancels its host task when its transport fails.
So each connection has an *owner task* of its own that enters the client, reports ready,
and waits to be told to stop: a dying server ends that task, never the agent's. Calls are
made from the dispatcher's tasks through the entered client (the SDK allows requests from
any task).

The handshake is the 2025-era ``initialize`` (``mode="legacy"``): it is the protocol in
which a server announces ``notifications/tools/list_changed`` on the connection and a
cancelled request is answered with ``notifications/cancelled``, both of which this package
relies on (https://modelcontextprotocol.io/specification/2025-06-18/basic/utilities/cancellation).
The SDK's response cache is off: a listing must be the server's current one.

One ``tools/call`` per :meth:`call`: the SDK sends the request once and never retries it.
Cancelling the calling task (a round cancelled, the dispatcher's deadline) makes the SDK
send ``notifications/cancelled`` for the request before the cancellation propagates.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import pydantic

from ..core._errors import ConfigError, ErrorCode
from ..tools._tasks import join
from ..tools._tools import ToolOutcome
from ._results import outcome_of
from ._servers import McpServer

_log = logging.getLogger("toollatch.mcp")

INSTALL_HINT = 'the MCP tool source needs the mcp extra: pip install "toollatch[mcp]"'


def require_sdk() -> None:
    """Raise ``ConfigError`` naming the extra to install when the ``mcp`` SDK is missing."""
    try:
        import mcp  # noqa: F401, PLC0415 (the optional extra, imported when used)
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None


class Connection:
    """A connection to one server: :meth:`open`, :meth:`list_tools`, :meth:`call`,
    :meth:`close`. ``on_list_changed`` is called (in the connection's task) when the server
    announces that its tool list changed."""

    def __init__(self, server: McpServer, on_list_changed: Callable[[], None]) -> None:
        self.server = server
        self._on_list_changed = on_list_changed
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._failure: str | None = None
        self.alive = False
        """True from a successful handshake until the connection is known to be gone."""
        self._limit = asyncio.Semaphore(server.max_concurrency)

    async def open(self) -> None:
        """Start the owner task and wait for the handshake; raises ``ConfigError`` when the
        server cannot be reached within ``connect_timeout_s``."""
        require_sdk()
        self._task = asyncio.get_running_loop().create_task(
            self._own(), name=f"toollatch-mcp:{self.server.name}"
        )
        try:
            async with asyncio.timeout(self.server.connect_timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.close(wait_s=0)
            raise ConfigError(
                f"MCP server {self.server.name!r}: no answer within "
                f"{self.server.connect_timeout_s:g} s"
            ) from None
        if not self.alive:
            await self.close()
            raise ConfigError(f"MCP server {self.server.name!r}: {self._failure}")

    async def _own(self) -> None:
        from mcp import Client  # noqa: PLC0415 (the optional extra)

        try:
            client = Client(
                self._target(), mode="legacy", cache=None, message_handler=self._on_message
            )
            async with client:
                self._client, self.alive = client, True
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # a transport or handshake failure: this server is gone
            self._failure = _describe(exc)
            _log.warning("MCP server %r: connection ended: %s", self.server.name, self._failure)
        finally:
            self.alive = False
            self._ready.set()

    def _target(self) -> Any:
        from mcp import StdioServerParameters  # noqa: PLC0415 (the optional extra)

        server = self.server
        if server.command is None:
            return server.url
        env = dict(os.environ) if server.inherit_env else minimal_environment()
        env.update(server.env)
        return StdioServerParameters(
            command=server.command[0], args=list(server.command[1:]), env=env
        )

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            _log.warning("MCP server %r: transport error: %s", self.server.name, message)
            return
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self._on_list_changed()

    async def list_tools(self) -> list[Any]:
        """Every tool the server lists now (all pages). Raises ``ConfigError`` when the
        connection is gone or the listing fails."""
        if not self.alive or self._client is None:
            raise ConfigError(f"MCP server {self.server.name!r} is not connected")
        tools: list[Any] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.server.connect_timeout_s):
                for _ in range(1000):  # a paginator that never ends cannot hang a round
                    page = await self._client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools += page.tools
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except Exception as exc:
            raise ConfigError(
                f"MCP server {self.server.name!r}: tools/list failed: {_describe(exc)}"
            ) from None
        return tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Send one ``tools/call`` and map its answer; never raises for the server's faults
        (see :func:`failure_outcome`). Cancellation propagates (after the SDK's
        ``notifications/cancelled``)."""
        async with self._limit:
            if not self.alive or self._client is None:
                return _failed(ErrorCode.TOOL_ERROR, f"{self._gone()}; it was not run")
            try:
                result = await self._client.session.call_tool(tool, arguments)
            except Exception as exc:
                return self.failure_outcome(exc)
        return outcome_of(result)

    def failure_outcome(self, exc: Exception) -> ToolOutcome:
        """A failed ``tools/call``: a JSON-RPC error the server answered is ``tool_error``;
        a closed connection, or anything else after the request may have been sent, is
        ``outcome_unknown`` (it may have had its effect)."""
        from mcp import MCPError  # noqa: PLC0415 (the optional extra)
        from mcp_types import CONNECTION_CLOSED  # noqa: PLC0415

        if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
            return _failed(ErrorCode.TOOL_ERROR, f"the server answered an error: {exc}")
        if _answered_badly(exc):  # the server ran it and answered; the answer is unusable
            return _failed(ErrorCode.TOOL_ERROR, f"the server's answer is unusable: {exc}"[:600])
        if isinstance(exc, MCPError):
            self.alive = False  # later calls are refused as never sent
        detail = (
            f"MCP server {self.server.name!r} went away during the call ({_describe(exc)}); "
            "its outcome is unknown (it may have had its effect)"
        )
        return _failed(ErrorCode.OUTCOME_UNKNOWN, detail)

    def _gone(self) -> str:
        why = f": {self._failure}" if self._failure else ""
        return f"MCP server {self.server.name!r} is not connected{why}"

    async def close(self, wait_s: float = 10.0) -> None:
        """Stop the owner task (the SDK closes the transport and ends a stdio process);
        after ``wait_s`` (a server that does not let go) the task is cancelled."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await join(task)


_LOCALE = ("LANG", "LANGUAGE", "TZ", "TMPDIR")


def minimal_environment() -> dict[str, str]:
    """What a stdio server gets without ``inherit_env``: the SDK's default environment
    (``mcp.client.stdio.get_default_environment``: ``HOME``, ``LOGNAME``, ``PATH``,
    ``SHELL``, ``TERM``, ``USER``, or Windows' system variables; the SDK merges the ``env`` it
    is given over the same list, which we build here too so that the rule does not depend on
    the SDK's version) plus the locale, ``TZ`` and ``TMPDIR``. A value that starts with
    ``()`` (an exported shell function) is left out, as the SDK does."""
    from mcp.client.stdio import get_default_environment  # noqa: PLC0415 (the optional extra)

    env = get_default_environment()
    for name, value in os.environ.items():
        if (name in _LOCALE or name.startswith("LC_")) and not value.startswith("()"):
            env[name] = value
    return env


def _failed(code: ErrorCode, detail: str) -> ToolOutcome:
    return ToolOutcome(content=f"{code}: {detail}", is_error=True, code=code)


def _answered_badly(exc: Exception) -> bool:
    """A result that failed the tool's output schema (the SDK's ``RuntimeError`` or a
    jsonschema ``ValidationError``) or the protocol's result model (pydantic's)."""
    name = type(exc).__name__
    return isinstance(exc, RuntimeError | pydantic.ValidationError) or name == "ValidationError"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
