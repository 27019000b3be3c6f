"""Test doubles for the adapters' fast path (``Adapter._continuation``)."""

from __future__ import annotations

from typing import Any, TypeVar

from toollatch.stages import Adapter, StreamEvent

A = TypeVar("A", bound=Adapter)


def general_only(cls: type[A]) -> type[A]:
    """``cls`` without the fast path: every decoded event goes through ``_feed``."""

    class GeneralOnly(cls):  # type: ignore[valid-type,misc]
        def _continuation(self, event: dict[str, Any], sse_event: str | None) -> None:
            return None

    return GeneralOnly


def counting(cls: type[A]) -> type[A]:
    """``cls`` counting in ``general`` the events that missed the fast path."""

    class Counting(cls):  # type: ignore[valid-type,misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.general = 0

        def _feed(self, event: Any, sse_event: str | None = None) -> list[StreamEvent]:
            self.general += 1
            return super()._feed(event, sse_event)

    return Counting
