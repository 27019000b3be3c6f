"""Helpers for the scripted-server tests: requests per provider, streaming them over HTTP."""

from __future__ import annotations

from typing import Any

import httpx

from toollatch import Round, StreamParser, ToolResult
from toollatch.scripted import ScriptedServer
from toollatch.stages import assistant_messages, error_results, tool_results_messages

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")


def first_history(provider: str, prompt: str = "Weather in Oslo and Zürich?") -> list[Any]:
    if provider == "gemini":
        return [{"role": "user", "parts": [{"text": prompt}]}]
    return [{"role": "user", "content": prompt}]


def request(provider: str, history: list[Any], model: str = "scripted") -> tuple[str, Any]:
    """(path, body) of a streaming request with ``history``."""
    if provider == "openai_chat":
        return "/v1/chat/completions", {"model": model, "stream": True, "messages": history}
    if provider == "openai_responses":
        return "/v1/responses", {"model": model, "stream": True, "input": history}
    if provider == "anthropic":
        body = {"model": model, "max_tokens": 1024, "stream": True, "messages": history}
        return "/v1/messages", body
    return f"/v1beta/models/{model}:streamGenerateContent?alt=sse", {"contents": history}


def post(
    client: httpx.Client,
    server: ScriptedServer | str,
    provider: str,
    history: list[Any],
    model: str = "scripted",
) -> httpx.Response:
    path, body = request(provider, history, model)
    return client.post(_url(server) + path, json=body)


def stream_round(
    client: httpx.Client,
    server: ScriptedServer | str,
    provider: str,
    history: list[Any],
    model: str = "scripted",
) -> Round:
    """Stream one request through ``StreamParser``; asserts a 200."""
    path, body = request(provider, history, model)
    parser = StreamParser(provider)
    with client.stream("POST", _url(server) + path, json=body) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_raw():
            parser.feed(chunk)
    return parser.finish()


def _url(server: ScriptedServer | str) -> str:
    """A running server's URL (or a URL given as text, e.g. of a child process)."""
    return server if isinstance(server, str) else server.url


def next_history(history: list[Any], round_: Round, output: str = '{"ok": true}') -> list[Any]:
    """``history`` + the round's assistant turn + one result per call (errors for failed)."""
    outputs = [
        ToolResult(tool_call_id=c.call_id, name=c.name, content=output) for c in round_.committed()
    ]
    results = [*outputs, *error_results(round_)]
    return [*history, *assistant_messages(round_), *tool_results_messages(round_, results)]


def assert_error_shape(provider: str, body: Any, status: int) -> None:
    if provider == "anthropic":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        if status == 400:
            assert body["error"]["type"] == "invalid_request_error"
    elif provider == "gemini":
        assert set(body["error"]) == {"code", "message", "status"}
        assert body["error"]["code"] == status
        if status == 400:
            assert body["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        if status == 400:
            assert body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert isinstance(message, str) and message
