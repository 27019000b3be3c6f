"""Error responses of the scripted model server, in each provider's own JSON shape.

* OpenAI (chat and Responses): ``{"error": {"message", "type", "param", "code"}}``
  (https://platform.openai.com/docs/guides/error-codes);
* Anthropic: ``{"type": "error", "error": {"type", "message"}}`` with the ``type`` per status
  (https://docs.anthropic.com/en/api/errors);
* Gemini: ``{"error": {"code", "message", "status"}}`` with the canonical status name
  (https://ai.google.dev/gemini-api/docs/troubleshooting);
* Bedrock: ``{"message"}`` with the exception's name in the ``x-amzn-ErrorType`` header
  (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html,
  "Errors"; AWS's restJson1 protocol).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

_OPENAI = {
    400: ("invalid_request_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_GEMINI = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_BEDROCK = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}


def error_body(provider: str, status: int, message: str, param: str | None = None) -> Any:
    """The JSON body ``provider`` sends with HTTP ``status`` and ``message``."""
    if provider == "anthropic":
        kind = _ANTHROPIC.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if provider == "bedrock":
        return {"message": message}
    if provider == "gemini":
        name = _GEMINI.get(status, "INTERNAL")
        return {"error": {"code": status, "message": message, "status": name}}
    kind, code = _OPENAI.get(status, ("server_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    provider: str,
    status: int,
    message: str,
    *,
    param: str | None = None,
    retry_after_s: int | None = None,
) -> JSONResponse:
    """An error response in ``provider``'s shape (with ``Retry-After`` when given)."""
    headers = {} if retry_after_s is None else {"retry-after": str(int(retry_after_s))}
    if provider == "bedrock":
        headers["x-amzn-errortype"] = _BEDROCK.get(status, "InternalServerException")
    return JSONResponse(error_body(provider, status, message, param), status, headers=headers)


def status_response(provider: str, status: int, retry_after_s: int | None) -> JSONResponse:
    """The answer of a scripted status fault (429, 500...)."""
    message = {
        429: "Rate limit reached (scripted fault); retry after the Retry-After delay.",
        500: "The server had an error while processing your request (scripted fault).",
        529: "Overloaded (scripted fault).",
    }.get(status, f"Scripted fault: HTTP {status}.")
    return error_response(provider, status, message, retry_after_s=retry_after_s)
