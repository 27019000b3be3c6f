"""Official SDK clients answered from recorded bytes by an in-memory transport (no network).

Each SDK is driven through the HTTP library it is built on (``httpx``, or ``httpx2`` in newer
releases), so SSE framing, event parsing and its stream helpers' accumulation are the SDK's own.
Without the SDK installed, the calling test is skipped (``pytest.importorskip``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest


def _http_library(sdk: ModuleType) -> ModuleType:
    """The HTTP client library the SDK is built on (``httpx``, or ``httpx2`` in newer ones)."""
    base = sdk.DefaultHttpxClient.__mro__[1]
    return importlib.import_module(base.__module__.split(".")[0])


def client(sdk_name: str, body: bytes) -> Any:
    """An ``openai.OpenAI`` or ``anthropic.Anthropic`` client whose every request is answered
    with ``body`` as an SSE stream."""
    sdk = pytest.importorskip(sdk_name)
    http = _http_library(sdk)

    def answer(request: Any) -> Any:
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client_class = sdk.OpenAI if sdk_name == "openai" else sdk.Anthropic
    return client_class(
        api_key="test-key",
        base_url="http://sdk.invalid",
        http_client=sdk.DefaultHttpxClient(transport=http.MockTransport(answer)),
        max_retries=0,
    )
