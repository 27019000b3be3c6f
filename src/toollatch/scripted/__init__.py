"""The scripted model server: a real loopback HTTP server that speaks the streaming wire
formats of OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and Gemini, and plays
scripted conversations (the embedded default of ``toollatch run``; needs the ``[run]`` extra).

``with ScriptedServer() as s`` (a thread, for synchronous SDK clients) or ``async with``
(the running loop) serves on ``127.0.0.1``; ``s.base_url(provider)`` is the base URL as that
provider's official SDK takes it. Model ``"scripted"`` plays :func:`demo_script`. Like the real
APIs it answers 400 for a history with an unpaired tool call id. ``python -m
toollatch.scripted`` serves until Ctrl-C.
"""

from ._script import DONE_TURN, Call, Faults, Reasoning, Script, Text, Turn, demo_script
from ._server import PROVIDERS, RecordedRequest, ScriptedServer

__all__ = [
    "DONE_TURN",
    "PROVIDERS",
    "Call",
    "Faults",
    "Reasoning",
    "RecordedRequest",
    "Script",
    "ScriptedServer",
    "Text",
    "Turn",
    "demo_script",
]
