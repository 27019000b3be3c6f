"""The MCP tool source of a configuration and of ``--mcp`` specs (for ``run`` and ``serve``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ._servers import McpServer, parse_server_spec, unique_names
from ._source import McpToolSource


class ServersConfig(Protocol):
    """What :func:`source_from_config` reads of a configuration (``toollatch.runtime.Config``
    has it): so that ``mcp`` needs nothing from the application layer that owns the config."""

    def mcp_servers(self) -> Sequence[McpServer]:
        """The configured servers."""
        ...


def source_from_config(
    config: ServersConfig | None, specs: Sequence[str] = (), *, reserved: Iterable[str] = ()
) -> McpToolSource | None:
    """The (not yet entered) source of ``config``'s ``mcp.servers`` followed by the
    command-line ``specs`` (``stdio:COMMAND ARGS...`` or a URL, with the default policy);
    None when there are none. A spec's server name (its program's or URL's) that is taken
    gets ``_2``, ``_3``...; a bad spec raises ``ConfigError``."""
    servers: list[McpServer] = list(config.mcp_servers()) if config is not None else []
    # (the config's names are unique already, so only the specs' derived names change)
    servers = unique_names([*servers, *(parse_server_spec(spec) for spec in specs)])
    if not servers:
        return None
    return McpToolSource(servers, reserved=reserved)
