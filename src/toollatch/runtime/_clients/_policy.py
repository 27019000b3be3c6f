"""Deadlines, sizes and the retry policy of a model client (plain data, checked once)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from ...core._errors import ConfigError


def _positive(owner: str, name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{owner}.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLimits:
    """Deadlines and sizes of one request; every value is positive."""

    connect_s: float = 10.0
    """Connecting (and getting a pooled connection), per attempt: a slow network, not a
    slow model, so it is short and retried."""
    first_byte_s: float = 120.0
    """From sending to the first body chunk, per attempt (connect and headers included):
    reasoning models may think a long while before their first byte. Not retried."""
    idle_s: float = 120.0
    """Longest silence between two body chunks once streaming (reasoning pauses)."""
    error_body_bytes: int = 64 * 1024
    """At most this much of an error response (or of a 200 that is not an event stream) is
    read, for its message."""
    max_body_bytes: int = 64 * 1024 * 1024
    """At most this many body bytes per response, counted after ``Content-Encoding`` is
    undone (a gzip bomb's 1 GiB counts as 1 GiB, and stops here): past it the stream fails
    (:class:`StreamTooLarge`, the round's calls ``stream_interrupted``). A long answer stays
    under it: 128k output tokens, one delta event of ~350 bytes each (the Responses API's
    are the largest), make about 43 MiB. (A stream of tiny SSE lines without end costs its
    parsing up to here: about 0.2 s of CPU per MiB of 8-byte comment lines, measured.)"""

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "idle_s", "error_body_bytes", "max_body_bytes"):
            _positive("ClientLimits", name, getattr(self, name))


RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses worth another try: timeout, conflict, rate limit, server errors (529 is
Anthropic's "overloaded"); the set the official SDKs retry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retries before the first byte. The n-th retry waits ``Retry-After`` when the provider
    sent one, else ``min(max_delay_s, initial_delay_s * 2**(n-1))`` less up to ``jitter`` of
    it at random; a wait that would take the total past ``max_total_wait_s`` is not made and
    the last error is raised instead.

    After the first byte nothing is retried by the client; the agent loop asks again after
    a round whose stream broke (an error event, a dropped connection, a stall), at most
    ``stream_retries`` times in a row, each after the same backoff (no ``Retry-After``
    exists mid-stream)."""

    attempts: int = 3
    """Requests at most, the first included (1 = never retry)."""
    initial_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_total_wait_s: float = 30.0
    jitter: float = 0.25
    """Fraction of a backoff delay removed at random (0 = exact delays; at most 1)."""
    statuses: frozenset[int] = field(default=RETRY_STATUSES)
    """HTTP statuses that are retried."""
    stream_retries: int = 2
    """Rounds whose stream broke that the agent loop asks again for, in a row (0 = never):
    one more broken stream ends the run with its error."""

    def __post_init__(self) -> None:
        if not (isinstance(self.attempts, int) and self.attempts >= 1):
            raise ConfigError(
                f"RetryPolicy.attempts must be an integer >= 1, got {self.attempts!r}"
            )
        retries = self.stream_retries
        if not (isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0):
            raise ConfigError(
                f"RetryPolicy.stream_retries must be an integer >= 0, got {retries!r}"
            )
        for name in ("initial_delay_s", "max_delay_s", "max_total_wait_s"):
            _positive("RetryPolicy", name, getattr(self, name))
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1):
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter!r}")

    def backoff_s(self, retry: int, random_unit: float) -> float:
        """The wait before retry number ``retry`` (1-based) without ``Retry-After``."""
        delay: float = min(self.max_delay_s, self.initial_delay_s * 2.0 ** (retry - 1))
        return delay * (1 - self.jitter * random_unit)


def retry_after_s(headers: Mapping[str, str], now: float) -> float | None:
    """The wait a response asks for, in seconds: ``retry-after-ms`` (OpenAI, Anthropic) or
    ``Retry-After`` as delay-seconds or an HTTP-date (RFC 9110 section 10.2.3), relative to
    ``now`` (a Unix time). None when absent or unreadable; never negative."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = lowered.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if scale != 1.0:
                continue
            try:
                seconds = parsedate_to_datetime(value).timestamp() - now
            except (TypeError, ValueError, IndexError):
                continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None
