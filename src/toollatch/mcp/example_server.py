"""``python -m toollatch.mcp.example_server``: the example MCP server (see ``_example_server``)."""

from ._example_server import main

if __name__ == "__main__":
    main()
