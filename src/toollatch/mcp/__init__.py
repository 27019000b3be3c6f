"""Tools from MCP servers behind the same gate (the ``mcp`` extra: ``pip install
"toollatch[mcp]"``).

:class:`McpToolSource` connects to MCP servers (stdio or streamable HTTP) and makes each of
their tools a toollatch tool whose spec is its ``inputSchema``; give it to
``Agent(tool_source=...)``. A committed call becomes exactly one ``tools/call``, run by the
dispatcher like any tool (never on a preview, never before the gate, once per call id).
:class:`McpServer` is one server and its policy; :func:`parse_server_spec` reads the
``--mcp`` command-line form; :func:`source_from_config` builds the source of a
configuration's ``mcp:`` section. Importing this package does not import the SDK; connecting
without it raises ``ConfigError`` naming the extra.
"""

from ._build import source_from_config
from ._servers import McpServer, parse_server_spec
from ._source import McpToolSource

__all__ = ["McpServer", "McpToolSource", "parse_server_spec", "source_from_config"]
