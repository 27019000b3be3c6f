"""Recording model answers as fixtures ``toollatch replay`` reads (``proxy --record``,
``probe --record``): the bytes as they arrive, credentials masked (:class:`Recorder`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from ..core._recording import EventStreamMasker, StreamMasker

_SERIAL = itertools.count(1)


class Recorder:
    """One upstream answer saved under ``folder`` as a fixture ``toollatch replay`` reads:
    ``<stamp>-<n>.sse`` (the answer's bytes, credentials masked by
    :class:`~toollatch.core._recording.StreamMasker`: the request's own keys and anything
    shaped like one), ``<stamp>-<n>.json`` (provider, model, status, upstream, the request's
    tools, whether the client asked a stream, how many spans were masked) and, when the
    request had tools, ``<stamp>-<n>.tools.json`` for ``replay --tools``. A Bedrock answer
    (``provider="bedrock"``, a binary event stream) is ``<stamp>-<n>.eventstream``, masked
    message by message by :class:`~toollatch.core._recording.EventStreamMasker` (each
    message framed again with its CRCs). Headers are never
    stored. Written as the bytes arrive, so an answer cut by a crash is still on disk."""

    def __init__(
        self,
        folder: Path,
        body: Mapping[str, Any],
        *,
        known: Iterable[str],
        provider: str = "openai_chat",
        label: str = "",
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.stem = folder / f"{stamp}-{next(_SERIAL):04d}{'-' + label if label else ''}"
        known = list(known)
        self._meta_masker = StreamMasker(known)
        self.masker = EventStreamMasker(known) if provider == "bedrock" else self._meta_masker
        suffix = ".eventstream" if provider == "bedrock" else ".sse"
        self.path = self.stem.with_name(self.stem.name + suffix)
        """The answer's file."""
        self.meta: dict[str, Any] = {
            "provider": provider,
            "model": self.masker.mask_text(str(body.get("model", ""))),
            "stream": body.get("stream") is True,
            "tools": _tools_of(body),
        }
        self._file = open(self.path, "wb")  # noqa: SIM115  (closed in close)

    def begin(self, status: int, upstream: str) -> None:
        """The answer's status and where it came from (the URL without credentials)."""
        parts = httpx.URL(upstream)
        self.meta.update(status=status, upstream=str(parts.copy_with(userinfo=b"", query=None)))

    def write(self, data: bytes) -> None:
        """Some of the answer's bytes."""
        self._file.write(self.masker.feed(data))

    def close(self) -> None:
        """The rest, and the metadata (idempotent)."""
        if self._file.closed:
            return
        self._file.write(self.masker.finish())
        self._file.close()
        tools = self.meta["tools"]
        self.meta["masked"] = self.masker.masked
        meta = orjson.dumps(self.meta, option=orjson.OPT_INDENT_2)
        masker = self._meta_masker
        self.stem.with_name(self.stem.name + ".json").write_bytes(
            masker.feed(meta + b"\n") + masker.finish()
        )
        if tools:
            self.stem.with_name(self.stem.name + ".tools.json").write_bytes(orjson.dumps(tools))


def _tools_of(body: Mapping[str, Any]) -> list[Any]:
    """The request's tool definitions, as ``replay --tools`` reads them: a Bedrock body's
    ``toolConfig.tools[].toolSpec`` (``inputSchema.json``) and a Gemini body's
    ``tools[].functionDeclarations`` become bare definitions."""
    tools = body.get("tools")
    declared = [_declarations(tool) for tool in tools] if isinstance(tools, list) else []
    if any(found is not None for found in declared):  # (a Gemini body)
        return [bare for found in declared for bare in found or ()]
    if tools:
        return list(tools)
    config = body.get("toolConfig")
    listed = config.get("tools") if isinstance(config, Mapping) else None
    bare: list[Any] = []
    for tool in listed if isinstance(listed, list) else []:
        spec = tool.get("toolSpec") if isinstance(tool, Mapping) else None
        if isinstance(spec, Mapping):
            schema = spec.get("inputSchema")
            parameters = schema.get("json") if isinstance(schema, Mapping) else None
            definition = {"name": spec.get("name"), "description": spec.get("description", "")}
            bare.append(definition | ({"parameters": parameters} if parameters else {}))
    return bare


def _declarations(tool: object) -> list[dict[str, Any]] | None:
    """A Gemini tool's function declarations as bare definitions (None: not Gemini's shape;
    ``[]`` for its other tools, e.g. ``googleSearch``). ``parametersJsonSchema`` is JSON
    Schema as is; ``parameters`` is Gemini's OpenAPI subset, whose type names may be upper
    case (https://ai.google.dev/api/caching#Type): JSON Schema's are lower case."""
    if not isinstance(tool, Mapping):
        return None
    listed = tool.get("functionDeclarations", tool.get("function_declarations"))
    if not isinstance(listed, list):
        return [] if set(tool) & _GEMINI_OTHER_TOOLS else None
    bare: list[dict[str, Any]] = []
    for declaration in listed:
        if not isinstance(declaration, Mapping):
            continue
        schema = declaration.get("parametersJsonSchema")
        if schema is None and isinstance(declaration.get("parameters"), Mapping):
            schema = _lower_types(declaration["parameters"])
        definition = {
            "name": declaration.get("name"),
            "description": declaration.get("description") or "",
        }
        bare.append(definition | ({"parameters": schema} if schema is not None else {}))
    return bare


_GEMINI_OTHER_TOOLS = frozenset(
    {"googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "google_search"}
)


def _lower_types(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``type`` name in lower case (Gemini's ``OBJECT`` is ``object``),
    in it and its subschemas (``properties``, ``items``, ``anyOf``), never in values."""
    lowered = dict(schema)
    if isinstance(lowered.get("type"), str):
        lowered["type"] = lowered["type"].lower()
    if isinstance(lowered.get("properties"), Mapping):
        lowered["properties"] = {
            name: _lower_types(sub) if isinstance(sub, Mapping) else sub
            for name, sub in lowered["properties"].items()
        }
    if isinstance(lowered.get("items"), Mapping):
        lowered["items"] = _lower_types(lowered["items"])
    if isinstance(lowered.get("anyOf"), list):
        lowered["anyOf"] = [
            _lower_types(s) if isinstance(s, Mapping) else s for s in lowered["anyOf"]
        ]
    return lowered
