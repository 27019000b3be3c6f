"""Tools: :class:`~toollatch.runtime.Tool`, ``@tool``, JSON schemas, outcomes and
their shaping (limits, redaction), the example tools. Pure (pydantic); the runtime, mcp
and the relay build on it. Its modules are private: the public names are re-exported by
``toollatch.runtime``. See docs/ARCHITECTURE.md."""
