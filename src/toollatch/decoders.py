"""Frame decoders: transport bytes -> :class:`Frame` values (public namespace: re-exports only).

Each has the stage shape ``feed(bytes) -> [Frame]`` then ``finish() -> [Frame]``, is linear in
the bytes whatever the read sizes, and raises ``toollatch.errors.StreamDecodeError`` for bytes
it cannot frame (:class:`~toollatch.StreamParser` turns that into a failed stream).
"""

from .core._events import Frame
from .core._eventstream import EventStreamDecoder
from .core._lines import JSONLinesDecoder
from .core._sse import SSEDecoder

__all__ = ["EventStreamDecoder", "Frame", "JSONLinesDecoder", "SSEDecoder"]
