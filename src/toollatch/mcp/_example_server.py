"""An example MCP server for tests and the demo, on the official SDK (``mcp`` extra).

Run it with ``python -m toollatch.mcp.example_server`` (stdio) or ``... --http PORT``
(streamable HTTP on 127.0.0.1, path ``/mcp``; port 0 picks a free one and the chosen URL is
printed on standard error as ``listening on http://127.0.0.1:PORT/mcp``). ``--log PATH`` (or
the ``TOOLLATCH_MCP_LOG`` variable) appends one JSON line per inbound ``tools/call`` and per
``notifications/cancelled`` *as the server receives it*, before any validation: the
server-side proof tests use that a call did or did not reach it. ``--name`` is the name
the server gives itself in the handshake.

Tools (side effects observable in tests): ``echo``, ``write_note`` (a file in ``--notes``),
``slow`` (sleeps; logs ``slow_cancelled`` when a cancellation interrupts it), ``crash``
(exits the process mid-call), ``big`` (a result of N characters), ``secret`` (a result
holding a fake API key), ``image`` (a 1x1 PNG), ``resource`` (an embedded text resource),
``fail`` (an ``isError`` result), ``weather`` (structured content) and ``add_tool`` (adds a
``extra_N`` tool and sends ``notifications/tools/list_changed``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

# A valid 1x1 PNG (70 bytes).
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
FAKE_SECRET = "sk-live-EXAMPLE0123456789abcdef"


class _Log:
    """Appends JSON lines to a file (flushed at once: a crash must not lose a line)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None

    def write(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields})
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def _middleware(log: _Log) -> Any:
    async def record(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params: Mapping[str, Any] = ctx.params or {}
        if ctx.method == "tools/call":
            log.write("call", tool=params.get("name"), arguments=params.get("arguments"))
        elif ctx.method == "notifications/cancelled":
            log.write("cancelled", request_id=params.get("requestId"), reason=params.get("reason"))
        return await call_next(ctx)

    return record


def build_server(log_path: str | None, notes: str | None, name: str = "example") -> MCPServer:
    """The example server (see the module docstring)."""
    log = _Log(log_path)
    server = MCPServer(name, middleware=[_middleware(log)], log_level="WARNING")
    _effect_tools(server, log, Path(notes) if notes else None)
    _content_tools(server)
    _change_tools(server)
    return server


def _effect_tools(server: MCPServer, log: _Log, notes_dir: Path | None) -> None:
    """Tools whose effects tests observe: files written, sleeps, a crash."""

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def write_note(name: str, text: str) -> str:
        """Append a line to the note called name."""
        if notes_dir is None:
            raise ToolError("the server was started without --notes")
        if not name.isidentifier():
            raise ToolError("name must be an identifier")
        with (notes_dir / f"{name}.txt").open("a", encoding="utf-8") as f:
            f.write(text + "\n")
        log.write("wrote", name=name)
        return f"appended {len(text)} characters to {name}"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep for seconds, then answer."""
        log.write("slow_started", seconds=seconds)
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            log.write("slow_cancelled")
            raise
        log.write("slow_done")
        return f"slept {seconds:g} s"

    @server.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        log.write("crashing")
        os._exit(3)


def _content_tools(server: MCPServer) -> None:
    """Tools answering each kind of content."""

    @server.tool()
    def big(size: int) -> str:
        """A text of size characters."""
        return ("0123456789" * (size // 10 + 1))[:size]

    @server.tool()
    def secret() -> str:
        """A result that carries a credential (for redaction tests)."""
        return f"the key is {FAKE_SECRET}"

    @server.tool()
    def image() -> Image:
        """A 1x1 PNG image."""
        return Image(data=PNG_1X1, format="png")

    @server.tool()
    def resource() -> types.EmbeddedResource:
        """An embedded text resource."""
        contents = types.TextResourceContents(
            uri="note://example", mime_type="text/plain", text="resource text"
        )
        return types.EmbeddedResource(type="resource", resource=contents)

    @server.tool()
    def fail(reason: str) -> str:
        """Report failure (an isError result)."""
        raise ToolError(f"failed: {reason}")

    @server.tool()
    def weather(city: str) -> dict[str, Any]:
        """Structured weather for a city."""
        return {"city": city, "temp_c": 4}


def _change_tools(server: MCPServer) -> None:
    """``add_tool``: the tool list changes, and the server says so."""
    added: list[str] = []

    @server.tool()
    async def add_tool(ctx: Context) -> str:
        """Add a tool extra_N and announce notifications/tools/list_changed."""
        tool_name = f"extra_{len(added) + 1}"
        added.append(tool_name)

        def extra(value: str) -> str:
            return f"{tool_name}: {value}"

        server.add_tool(extra, name=tool_name, description="A tool added at run time.")
        await ctx.session.send_tool_list_changed()
        return f"added {tool_name}"


async def _serve_http(server: MCPServer, port: int) -> None:
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    http = uvicorn.Server(config)
    task = asyncio.create_task(http.serve())
    while not http.started:
        if task.done():
            await task  # (raises why it could not start)
            return
        await asyncio.sleep(0.01)
    bound = http.servers[0].sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}/mcp", file=sys.stderr, flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    """Entry point: stdio by default, ``--http PORT`` for streamable HTTP on loopback."""
    parser = argparse.ArgumentParser(prog="python -m toollatch.mcp.example_server")
    parser.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1")
    parser.add_argument("--log", default=os.environ.get("TOOLLATCH_MCP_LOG"), metavar="PATH")
    parser.add_argument("--notes", metavar="DIR", help="where write_note writes")
    parser.add_argument("--name", default="example")
    args = parser.parse_args(argv)
    server = build_server(args.log, args.notes, args.name)
    if args.http is None:
        server.run("stdio")
    else:
        asyncio.run(_serve_http(server, args.http))
