"""Tools: :class:`~toollatch.Tool`, ``@tool``, JSON schemas, outcomes and their
shaping (limits, redaction), the example tools. Pure (pydantic); the runtime, mcp and the
relay build on it. Its modules are private: the public names are re-exported by
``toollatch`` (``Tool``, ``tool``, ``ToolOutcome``, ``schema_tool``, ``ResultLimits``) and
``toollatch.runtime`` (result shaping, the example tools). See docs/ARCHITECTURE.md."""
