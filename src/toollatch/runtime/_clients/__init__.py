"""Model clients over httpx, one per provider (internal; public names in
:mod:`toollatch.runtime`)."""

from ._client import ModelClient, ModelStream, model_client
from ._errors import (
    ModelConnectError,
    ModelError,
    ModelHTTPError,
    ModelResponseError,
    StreamInterrupted,
    StreamTimeout,
    StreamTooLarge,
    error_message,
)
from ._policy import RETRY_STATUSES, ClientLimits, RetryPolicy, retry_after_s
from ._wire import gemini_declaration

__all__ = [
    "RETRY_STATUSES",
    "ClientLimits",
    "ModelClient",
    "ModelConnectError",
    "ModelError",
    "ModelHTTPError",
    "ModelResponseError",
    "ModelStream",
    "RetryPolicy",
    "StreamInterrupted",
    "StreamTimeout",
    "StreamTooLarge",
    "error_message",
    "gemini_declaration",
    "model_client",
    "retry_after_s",
]
