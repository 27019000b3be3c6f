"""The scripted model server: a real loopback HTTP server that speaks the streaming wire
formats of OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and Gemini, and plays
scripted conversations (the embedded default of ``toollatch run``; needs the ``[run]`` extra).
"""

__all__: list[str] = []
