"""Masking a recorded stream so that it holds no credential yet stays replayable (pure).

Theory of operation. ``toollatch proxy --record DIR`` writes each upstream answer's bytes
through one :class:`StreamMasker`. It works line by line (a partial line waits for the next
read), and leaves every line that is not an SSE ``data:`` line as it was (``event:``,
``id:``, blank lines, ``[DONE]``) unless it holds a credential (then it is masked as raw
text, below). A ``data:`` line holding JSON is decoded, and in every
string of it (keys included) each span that holds a credential (the built-in formats,
:data:`._secrets.SECRET_TEXT`) or one of the ``known`` secrets (the request's own API key)
has its letters and digits replaced by ``x``: the string keeps its length and its quotes,
colons and other punctuation, so JSON inside it (a call's argument fragments) stays JSON and
the stream parses as before. A line that changed is re-encoded as compact JSON (``\\u``
escapes where it must, for lone surrogates); an unchanged line keeps its exact bytes. A line
that is not JSON gets the same masking over its raw text, and so does a line longer than
``max_line_bytes``, written out at once, so that memory stays bounded.

What it cannot see: a credential cut across two fragments (two lines) is masked only where
a part is still shaped like one; the known secrets are masked wherever they appear whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ._secrets import SECRET_TEXT

_ALNUM = re.compile(r"[A-Za-z0-9]")
_DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


def _masked_span(match: re.Match[str]) -> str:
    return _ALNUM.sub("x", match.group(0))


class StreamMasker:
    """Masks credentials in a stream's bytes, read by read (see the module's doc).

    ``known``: secrets to mask wherever they appear (at least 8 characters; shorter ones are
    ignored: masking every ``x`` of a stream would help nobody).
    """

    def __init__(
        self, known: Iterable[str] = (), *, max_line_bytes: int = _DEFAULT_MAX_LINE_BYTES
    ) -> None:
        secrets = sorted({k for k in known if isinstance(k, str) and len(k) >= 8}, key=len)
        parts = [re.escape(k) for k in reversed(secrets)]
        pattern = "|".join([*parts, f"(?:{SECRET_TEXT.pattern})"])
        self._pattern = re.compile(pattern, re.IGNORECASE)
        self._carry = b""
        self.max_line_bytes = max_line_bytes
        self.masked = 0
        """Spans masked so far."""

    def feed(self, data: bytes) -> bytes:
        """The masked bytes of every line ``data`` completes."""
        lines = (self._carry + data).split(b"\n")
        self._carry = lines.pop()
        out = b"".join(self._line(line) + b"\n" for line in lines)
        if len(self._carry) > self.max_line_bytes:
            out += self._raw(self._carry)
            self._carry = b""
        return out

    def finish(self) -> bytes:
        """The masked rest (a last line without its newline)."""
        rest, self._carry = self._carry, b""
        return self._line(rest) if rest else b""

    def mask_text(self, text: str) -> str:
        """``text`` with every credential span masked."""
        masked, n = self._pattern.subn(_masked_span, text)
        self.masked += n
        return masked

    def _line(self, line: bytes) -> bytes:
        cr = line.endswith(b"\r")
        body = line[:-1] if cr else line
        if body.startswith(b"{"):  # a JSON Lines recording
            masked = self._json(body)
            return line if masked is None else masked + (b"\r" if cr else b"")
        if not body.startswith(b"data:"):
            return self._raw(line)
        payload = body[5:]
        lead = b" " if payload.startswith(b" ") else b""
        masked = self._json(payload[len(lead) :])
        if masked is None:
            return line
        return b"data:" + lead + masked + (b"\r" if cr else b"")

    def _json(self, payload: bytes) -> bytes | None:
        """The masked payload, or None when nothing in it changed."""
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            masked = self._raw(payload)
            return None if masked == payload else masked
        before = self.masked
        value = self._walk(value)
        if self.masked == before:
            return None
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped, as it came
            return json.dumps(value, separators=(",", ":")).encode("ascii")

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask_text(value)
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, dict):
            return {self.mask_text(k): self._walk(v) for k, v in value.items()}
        return value

    def _raw(self, data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")
        return self.mask_text(text).encode("utf-8", "surrogateescape")
