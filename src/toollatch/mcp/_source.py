"""The MCP tool source: the tools of several MCP servers as toollatch :class:`Tool` objects.

Theory of operation. ``async with McpToolSource(servers) as source`` connects to every
server, lists its tools and makes one :class:`Tool` per tool (``schema_tool``): its spec is
the tool's ``inputSchema``, so the gate validates every call against the server's own
schema, and its function sends exactly one ``tools/call`` when the dispatcher runs it. The
source is then given to the :class:`Agent` (``tool_source=``), which asks it for the current
tools (:meth:`refresh`) before each round and applies its policy (:meth:`check`) in the gate.

Names. A tool keeps its MCP name when it is a valid toollatch name ([A-Za-z0-9_-], at most
64) and no other server (nor a ``reserved`` name) has it; otherwise it is
``server__tool`` (characters outside the rule become ``_``; a name still too long or taken
ends with a short hash). A name, once given, stays the tool's for the source's life, so the
history of a run keeps pairing after a server's tool list changes. :meth:`origin` maps a
name back to ``(server, MCP tool name)``.

List changes. A server's ``notifications/tools/list_changed`` marks it stale; the next
:meth:`refresh` (between rounds) lists it again. A tool that stays keeps its :class:`Tool`
object (and so its name); a listing that fails keeps the previous tools, whose calls then
fail without being sent when the server is gone. A tool whose ``inputSchema`` is not a
usable JSON Schema, or is over the server's ``max_schema_bytes`` / ``max_schema_depth``, is
left out, with a warning on the ``toollatch.mcp`` logger naming the server and the tool; a
description over ``max_description_chars`` is cut (what a server writes there reaches the
model as it is, so its length at least is bounded).

One source may serve several agents at once (``toollatch serve``): the connections, and
each server's ``max_concurrency``, are shared.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from ..core._errors import ConfigError, UsageError
from ..core._gate import Allow, Deny
from ..tools._tools import Tool, ToolOutcome, schema_tool
from ._connection import Connection
from ._servers import McpServer

_log = logging.getLogger("toollatch.mcp")

_VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
Key = tuple[str, str]
"""(server name, MCP tool name)."""


class McpToolSource:
    """The tools of ``servers`` (see the module docstring). ``reserved``: names already used
    by other tools (the agent's Python tools), which MCP tools never take. Raises
    ``ConfigError`` for two servers of one name; entering it raises ``ConfigError`` when a
    server cannot be reached (the others are closed again)."""

    def __init__(self, servers: Sequence[McpServer], *, reserved: Iterable[str] = ()) -> None:
        for s in servers:
            if not isinstance(s, McpServer):
                raise ConfigError(f"MCP servers must be McpServer objects, got {s!r:.60}")
        names = [s.name for s in servers]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ConfigError(f"MCP server names must be unique: {dupes}")
        self.servers = tuple(servers)
        self._reserved = frozenset(reserved)
        self._conns = {s.name: Connection(s, self._stale_marker(s.name)) for s in servers}
        self._stale: set[str] = set()
        self._listed: dict[str, list[Any]] = {}  # server -> MCP tools, in listing order
        self._names: dict[Key, str] = {}
        self._tools: dict[Key, Tool[..., Any]] = {}
        self._defs: dict[Key, str] = {}  # what each Tool was made from
        self._origin: dict[str, Key] = {}
        self._entered = False

    def _stale_marker(self, server: str) -> Any:
        def mark() -> None:
            self._stale.add(server)

        return mark

    async def __aenter__(self) -> McpToolSource:
        if self._entered:
            raise UsageError("an McpToolSource is entered once")
        self._entered = True
        try:
            await _open_all(list(self._conns.values()))
            for name, conn in self._conns.items():
                self._listed[name] = await conn.list_tools()
        except BaseException:
            await self.aclose()
            raise
        self._rebuild()  # (a change announced meanwhile is listed again by the first refresh)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection (stdio servers are stopped)."""
        await asyncio.gather(*(c.close() for c in self._conns.values()))

    # -- what the agent asks ---------------------------------------------------------------

    def snapshot(self) -> tuple[Tool[..., Any], ...]:
        """The tools as last listed (no I/O), in server then listing order."""
        return tuple(self._tools.values())

    async def refresh(self) -> tuple[Tool[..., Any], ...]:
        """List again the servers that announced a change, then :meth:`snapshot`."""
        stale, self._stale = self._stale, set()
        for name in sorted(stale):
            try:
                self._listed[name] = await self._conns[name].list_tools()
            except ConfigError as exc:
                _log.warning("%s; keeping its previous tools", exc)
        if stale:
            self._rebuild()
        return self.snapshot()

    def check(self, name: str, arguments: Mapping[str, Any]) -> Allow | Deny | None:
        """The gate's policy hook: a call of an MCP tool its server's ``allow``/``deny``
        refuses is denied; any other call is not this source's to judge (None)."""
        key = self._origin.get(name)
        if key is None:
            return None
        server = self._conns[key[0]].server
        if any(fnmatch.fnmatchcase(key[1], p) for p in server.deny):
            return Deny(f"MCP server {key[0]!r} denies its tool {key[1]!r}")
        allow = server.allow
        if allow is not None and not any(fnmatch.fnmatchcase(key[1], p) for p in allow):
            return Deny(f"MCP server {key[0]!r} does not allow its tool {key[1]!r}")
        return Allow()

    def origin(self, name: str) -> Key | None:
        """``(server, MCP tool name)`` of a tool name this source gave, else None."""
        return self._origin.get(name)

    @property
    def names(self) -> Mapping[str, Key]:
        """Every current tool name -> ``(server, MCP tool name)``."""
        return dict(self._origin)

    # -- building tools ----------------------------------------------------------------------

    def _rebuild(self) -> None:
        keys = [(s, t.name) for s, tools in self._listed.items() for t in tools]
        names = assign_names(keys, self._names, self._reserved)
        defs = {(s, t.name): t for s, tools in self._listed.items() for t in tools}
        tools: dict[Key, Tool[..., Any]] = {}
        for key in keys:
            old = self._tools.get(key)
            if old is not None and self._defs.get(key) == _fingerprint(defs[key]):
                tools[key] = old
                continue
            made = self._make(key, names[key], defs[key])
            if made is not None:
                tools[key] = made
                self._defs[key] = _fingerprint(defs[key])
        self._names.update(names)
        self._tools = tools
        self._origin = {t.name: key for key, t in tools.items()}

    def _make(self, key: Key, name: str, mcp_tool: Any) -> Tool[..., Any] | None:
        conn = self._conns[key[0]]
        server = conn.server

        async def call(arguments: dict[str, Any]) -> ToolOutcome:
            return await conn.call(key[1], arguments)

        try:
            schema, description = bounded(server, key[1], mcp_tool)
            made = schema_tool(
                name,
                schema,
                call,
                description=description,
                eager=any(fnmatch.fnmatchcase(key[1], p) for p in server.eager),
                timeout=server.timeout_s,
            )
        except ConfigError as exc:  # one unusable tool must not take the server's others down
            _log.warning("MCP server %r: tool %r skipped: %s", key[0], key[1], exc)
            return None
        return made


def bounded(server: McpServer, tool: str, mcp_tool: Any) -> tuple[dict[str, Any], str]:
    """The tool's ``inputSchema`` and description within ``server``'s limits: raises
    ``ConfigError`` naming the server, the tool, the size and the limit for a schema too
    deep or too large (the tool is then left out); a description over
    ``max_description_chars`` is cut there, with a warning naming both."""
    schema = dict(mcp_tool.input_schema or {"type": "object"})
    where = f"MCP server {server.name!r}: tool {tool!r}"
    depth = _depth(schema, server.max_schema_depth)
    if depth > server.max_schema_depth:
        raise ConfigError(
            f"its inputSchema nests deeper than max_schema_depth {server.max_schema_depth}"
        )
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > server.max_schema_bytes:
        raise ConfigError(
            f"its inputSchema is {size} bytes, over max_schema_bytes {server.max_schema_bytes}"
        )
    description = str(mcp_tool.description or "")
    limit = server.max_description_chars
    if len(description) > limit:
        _log.warning(
            "%s: description of %d characters cut to max_description_chars %d",
            where, len(description), limit,
        )  # fmt: skip
        description = description[:limit]
    return schema, description


def _depth(value: Any, limit: int) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar: 0), counted without recursion
    and no further than ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if not isinstance(node, dict | list):
            continue
        deepest = max(deepest, level)
        if level > limit:
            break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, level + 1) for child in children)
    return deepest


async def _open_all(conns: list[Connection]) -> None:
    """Open every connection at once; the first failure cancels the others' waits and is
    raised as itself (not in an ``ExceptionGroup``)."""
    try:
        async with asyncio.TaskGroup() as group:
            for conn in conns:
                group.create_task(conn.open())
    except BaseExceptionGroup as failed:
        first = failed.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _fingerprint(mcp_tool: Any) -> str:
    return repr((mcp_tool.input_schema, mcp_tool.description))


def assign_names(
    keys: Sequence[Key], given: Mapping[Key, str], reserved: Iterable[str]
) -> dict[Key, str]:
    """A toollatch name for every key (see the module docstring): ``given`` names are kept,
    a new key gets its MCP name when it is valid and unique, else ``server__tool``."""
    taken = set(reserved)
    out: dict[Key, str] = {}
    for key in keys:
        if key in given and given[key] not in taken:
            out[key] = given[key]
            taken.add(given[key])
    fresh = [k for k in keys if k not in out]
    wanted = Counter(k[1] for k in keys)  # a name two servers have is nobody's bare name
    for key in fresh:
        server, tool = key
        name = tool if _VALID.match(tool) else ""
        if not name or wanted[tool] > 1 or name in taken:
            name = _fit(f"{_safe(server)}__{_safe(tool)}", key)
        n = 2
        base = name
        while name in taken:
            name = f"{base[: 63 - len(str(n))]}_{n}"
            n += 1
        out[key] = name
        taken.add(name)
    return out


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "tool"


def _fit(name: str, key: Key) -> str:
    if len(name) <= 64:
        return name
    digest = hashlib.sha256("\x00".join(key).encode()).hexdigest()[:8]
    return f"{name[:55]}_{digest}"
