"""toollatch: commit-gated assembly of streamed LLM tool calls."""
