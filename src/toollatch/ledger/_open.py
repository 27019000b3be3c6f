"""``open_ledger(url)``: a ledger from a ``--ledger`` URL (internal)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from .._errors import ConfigError
from ._base import Ledger, MemoryLedger


def open_ledger(url: str) -> Ledger:
    """The ledger a URL names: ``memory:``, ``sqlite:///ABSOLUTE/PATH`` (``sqlite:relative``
    also works) or ``redis://[:PASSWORD@]HOST:PORT/DB`` (``rediss://`` for TLS; needs the
    ``redis`` extra). ``ConfigError`` for any other URL or a missing package."""
    if not isinstance(url, str):
        raise ConfigError(f"a ledger URL must be a str, got {url!r:.60}")
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return MemoryLedger()
    if parts.scheme == "sqlite":
        path = unquote(parts.path if parts.netloc in ("", "localhost") else "")
        if not path or path == "/":
            raise ConfigError(f"a sqlite ledger URL names a file: sqlite:///PATH, got {url!r}")
        from ._sqlite import SQLiteLedger  # noqa: PLC0415 (keeps the package import light)

        return SQLiteLedger(path)
    if parts.scheme in ("redis", "rediss"):
        return _open_redis(url)
    raise ConfigError(f"unknown ledger URL {url!r}: use sqlite:///PATH or redis://HOST:PORT/DB")


def _open_redis(url: str) -> Ledger:
    try:
        import redis.asyncio as aioredis  # noqa: PLC0415 (the [redis] extra, lazily)

        from ._redis import RedisLedger  # noqa: PLC0415 (it imports redis)
    except ImportError as exc:  # pragma: no cover - the test environment has the extra
        hint = "pip install 'toollatch[redis]'"
        raise ConfigError(f"a redis:// ledger needs the redis package: {hint}") from exc
    try:
        # Timeouts so that a Redis down is an error within seconds, never a hang.
        client = aioredis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    except ValueError as exc:
        raise ConfigError(f"bad redis URL {url!r}: {exc}") from exc
    return RedisLedger(client)
