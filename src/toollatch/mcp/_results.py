"""MCP ``CallToolResult`` -> :class:`toollatch.runtime.ToolOutcome` (text for the model).

Every provider's tool-result format takes text, so the content blocks become one text, in
order, one block per line: a text block as is; an embedded text resource as a header line
``[resource URI (MIME)]`` and its text; everything the model cannot read as text (an image,
audio, a binary resource, a resource link) as a one-line placeholder naming its type, MIME
type and size, never its bytes. Images and binary blobs go to ``ToolOutcome.ui``
(``{"images": [{"mime_type", "data"}], ...}``, base64 as received) for a user interface.
``structuredContent`` is the text when no content block is (the spec asks servers to
duplicate it as a text block, which is then what the model reads); it is in ``ui`` too.
``isError`` makes an error outcome (``tool_error``). Works on the SDK's pydantic models by
attribute, so this module needs no ``mcp`` import.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ..core._errors import ErrorCode
from ..tools._tools import ToolOutcome


def outcome_of(result: Any) -> ToolOutcome:
    """The outcome of one ``CallToolResult`` (see the module docstring)."""
    lines: list[str] = []
    images: list[dict[str, str]] = []
    for block in getattr(result, "content", None) or ():
        lines.append(_block_text(block, images))
    structured = getattr(result, "structured_content", None)
    if not lines and structured is not None:
        lines.append(json.dumps(structured, ensure_ascii=False, separators=(",", ":")))
    ui: dict[str, Any] = {}
    if images:
        ui["images"] = images
    if structured is not None:
        ui["structured_content"] = structured
    is_error = bool(getattr(result, "is_error", False))
    return ToolOutcome(
        content="\n".join(lines),
        ui=ui or None,
        is_error=is_error,
        code=ErrorCode.TOOL_ERROR if is_error else None,
    )


def _block_text(block: Any, images: list[dict[str, str]]) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        data = str(getattr(block, "data", ""))
        mime = str(getattr(block, "mime_type", "") or "application/octet-stream")
        if kind == "image":
            images.append({"mime_type": mime, "data": data})
        return f"[{kind} {mime}, {_decoded_size(data)} bytes, not shown]"
    if kind == "resource":
        return _resource_text(getattr(block, "resource", None), images)
    if kind == "resource_link":
        uri, name = getattr(block, "uri", ""), getattr(block, "name", "")
        return f"[resource link {uri} ({name})]"
    return f"[{kind or 'unknown'} content, not shown]"


def _resource_text(resource: Any, images: list[dict[str, str]]) -> str:
    uri = str(getattr(resource, "uri", ""))
    mime = getattr(resource, "mime_type", None) or "unknown type"
    text = getattr(resource, "text", None)
    if isinstance(text, str):
        return f"[resource {uri} ({mime})]\n{text}"
    blob = str(getattr(resource, "blob", "") or "")
    if str(mime).startswith("image/"):
        images.append({"mime_type": str(mime), "data": blob})
    return f"[resource {uri} ({mime}), {_decoded_size(blob)} bytes, not shown]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)
