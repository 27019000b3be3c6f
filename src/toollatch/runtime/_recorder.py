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

from ..core._recording import StreamMasker

_SERIAL = itertools.count(1)


class Recorder:
    """One upstream answer saved under ``folder`` as a fixture ``toollatch replay`` reads:
    ``<stamp>-<n>.sse`` (the answer's bytes, credentials masked by
    :class:`~toollatch.core._recording.StreamMasker`: the request's own keys and anything
    shaped like one), ``<stamp>-<n>.json`` (provider, model, status, upstream, the request's
    tools, whether the client asked a stream, how many spans were masked) and, when the
    request had tools, ``<stamp>-<n>.tools.json`` for ``replay --tools``. Headers are never
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
        self.masker = StreamMasker(known)
        self.meta: dict[str, Any] = {
            "provider": provider,
            "model": self.masker.mask_text(str(body.get("model", ""))),
            "stream": body.get("stream") is True,
            "tools": body.get("tools") or [],
        }
        self._file = open(self.stem.with_suffix(".sse"), "wb")  # noqa: SIM115  (closed in close)

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
        self.stem.with_suffix(".json").write_bytes(
            self.masker.feed(meta + b"\n") + self.masker.finish()
        )
        if tools:
            self.stem.with_name(self.stem.name + ".tools.json").write_bytes(orjson.dumps(tools))
