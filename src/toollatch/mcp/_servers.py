"""Which MCP servers to use and their policy (plain data; no ``mcp`` import here).

A server is reached over stdio (``command``: the process toollatch starts and talks to on
its stdin/stdout) or streamable HTTP (``url``). Its policy: which of its tools may start
before their round ends (``eager``; none by default), the run-time limit of one call
(``timeout_s``), how many of its calls run at once (``max_concurrency``), and which of its
tools the gate lets through (``allow``/``deny``: ``fnmatch`` patterns on the server's own
tool names; a denied call fails ``policy_denied`` and never reaches the server).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from urllib.parse import urlsplit

from ..core._errors import ConfigError

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
"""A server name prefixes its tools' names on a collision (``name__tool``), so it obeys the
tool-name rule and stays short."""


@dataclass(frozen=True, slots=True, kw_only=True)
class McpServer:
    """One MCP server and its policy (see the module docstring). Exactly one of ``command``
    and ``url``; raises ``ConfigError`` for anything else or a bad limit."""

    name: str
    """Short name ([A-Za-z0-9_-], at most 32): the prefix of its tool names on a collision."""
    command: tuple[str, ...] | None = None
    """The program and its arguments (stdio)."""
    url: str | None = None
    """``http(s)://HOST:PORT/PATH`` (streamable HTTP)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for a stdio server (over the short list it gets, see ``inherit_env``):
    the way to give one server the key it needs, and only that one."""
    inherit_env: bool = False
    """False (the default): a stdio server starts with a minimal environment, the MCP SDK's
    own default list (``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``; on
    Windows its system variables) plus the locale (``LANG``, ``LANGUAGE``, ``LC_*``), ``TZ``
    and ``TMPDIR``, plus ``env``: never toollatch's API keys or other secrets. True: the
    whole environment of toollatch, as a shell would run the command (then ``env`` over it)."""
    eager: tuple[str, ...] = ()
    """The server's tool names (``fnmatch`` patterns) that may start before the round ends."""
    timeout_s: float | None = 30.0
    """Run-time limit of one call in seconds (None: the dispatcher's default)."""
    max_concurrency: int = 4
    """Calls of this server running at once (more wait, inside their run-time limit)."""
    allow: tuple[str, ...] | None = None
    """Patterns of the tools the gate lets through (None: every tool)."""
    deny: tuple[str, ...] = ()
    """Patterns of the tools the gate refuses (wins over ``allow``)."""
    connect_timeout_s: float = 30.0
    """Longest wait for the connection and the first tool listing."""
    max_schema_bytes: int = 65_536
    """Largest ``inputSchema`` of one tool, in bytes of compact JSON; a tool over it is left
    out with a warning. Every schema goes to the model with every request: real tools' are
    a few KiB, so 64 KiB leaves room while a 5 MB one cannot ride on each round."""
    max_schema_depth: int = 32
    """Deepest nesting of objects and arrays in one ``inputSchema`` (more: left out)."""
    max_description_chars: int = 4096
    """Longest tool description passed to the model; a longer one is cut there (with a
    warning). The text is the server's, read by the model as instructions: see the README's
    security model."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SERVER_NAME.match(self.name):
            raise ConfigError(f"MCP server name {self.name!r} must match {_SERVER_NAME.pattern}")
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"MCP server {self.name!r}: give exactly one of command and url")
        if self.command is not None and (
            not self.command or not all(isinstance(a, str) and a for a in self.command)
        ):
            raise ConfigError(f"MCP server {self.name!r}: command must be non-empty strings")
        if self.url is not None:
            _check_url(self.name, self.url)
        for what in ("timeout_s", "connect_timeout_s"):
            value = getattr(self, what)
            if value is None and what == "timeout_s":
                continue
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"MCP server {self.name!r}: {what} must be positive seconds")
        for what in ("max_concurrency", "max_schema_bytes", "max_schema_depth"):
            limit = getattr(self, what)
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise ConfigError(f"MCP server {self.name!r}: {what} must be an integer >= 1")
        limit = self.max_description_chars
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError(
                f"MCP server {self.name!r}: max_description_chars must be an integer >= 0"
            )

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command is not None else "http"


def _check_url(name: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"MCP server {name!r}: url must be http(s)://HOST[:PORT]/PATH, not {url!r}"
        )


def parse_server_spec(spec: str, *, name: str | None = None) -> McpServer:
    """An :class:`McpServer` from a command-line spec: ``stdio:COMMAND ARGS...`` (split like
    a shell would, ``shlex``) or an ``http(s)://`` URL; the name defaults to the command's
    program name or the URL's host and port. Raises ``ConfigError`` for anything else."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("an MCP server spec must be 'stdio:COMMAND ARGS...' or a URL")
    if spec.startswith("stdio:"):
        try:
            argv = tuple(shlex.split(spec[len("stdio:") :]))
        except ValueError as exc:
            raise ConfigError(f"MCP server spec {spec!r}: {exc}") from None
        if not argv:
            raise ConfigError(f"MCP server spec {spec!r}: no command after 'stdio:'")
        return McpServer(name=name or default_name(argv[0]), command=argv)
    if spec.startswith(("http://", "https://")):
        parts = urlsplit(spec)
        host = f"{parts.hostname or 'http'}_{parts.port}" if parts.port else parts.hostname
        return McpServer(name=name or default_name(host or "http"), url=spec)
    raise ConfigError(f"MCP server spec {spec!r}: expected 'stdio:COMMAND ARGS...' or an http URL")


def default_name(text: str) -> str:
    """A server name from a program path or a host: its base name, other characters as
    ``_``, cut to 32 characters."""
    base = PurePath(text).name or text
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", base)[:32]
    return cleaned or "server"


def unique_names(servers: list[McpServer]) -> list[McpServer]:
    """``servers`` with repeated names made unique (``name_2``, ``name_3``...), for specs
    whose names were derived (two ``stdio:python ...`` servers)."""
    seen: set[str] = set()
    out = []
    for server in servers:
        name, n = server.name, 2
        while name in seen:
            name = f"{server.name[:29]}_{n}"
            n += 1
        seen.add(name)
        out.append(server if name == server.name else replace(server, name=name))
    return out
