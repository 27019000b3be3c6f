"""Opening a run store by its URL (internal; see :mod:`toollatch.relay.store`)."""

from __future__ import annotations

from ...core._errors import ConfigError
from ...ledger import Ledger
from ._base import MemoryRunStore, RunStore

DEFAULT_TTL_S = 3600.0
"""How long a shared store keeps a run's log and metadata after its last event
(``relay.store_ttl_s``): long enough for a page to come back and read the end."""

DEFAULT_LEASE_S = 10.0
"""How long a worker's lease on its runs lasts without a renewal (``relay.lease_s``): a
surviving worker ends a dead worker's runs about that long after its death."""

DEFAULT_OUTAGE_S = 5.0
"""How long a worker retries a write to an unreachable shared store before it cancels its
runs (``relay.store_outage_s``)."""


def check_store_url(url: str | None) -> None:
    """Raise ``ConfigError`` unless ``url`` names a store: ``memory:`` (or None),
    ``redis://``, ``rediss://`` or ``unix://``."""
    if url is None or url == "memory:" or url.startswith(_REDIS_SCHEMES):
        return
    raise ConfigError(f"run store must be memory: or redis://HOST:PORT/DB, got {url[:80]!r}")


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_run_store(
    url: str | None,
    *,
    keep: int,
    ttl_s: float = DEFAULT_TTL_S,
    outage_s: float = DEFAULT_OUTAGE_S,
    lease_s: float = DEFAULT_LEASE_S,
    ledger: Ledger | None = None,
    connections: int = 1000,
) -> RunStore:
    """The store of ``url`` (:func:`check_store_url`; Redis needs the ``redis`` extra).
    ``keep``: the in-memory store's pointers of each kind; ``ttl_s``: how long a shared
    store keeps an ended run; ``outage_s``: how long its writes are retried; ``lease_s``:
    how long a worker's lease lasts without a renewal (its runs are then ended by another);
    ``ledger``: the one the workers share (which of a dead worker's calls started);
    ``connections``: the relay's ``max_connections`` (a shared store's connections to Redis
    follow its readers of other workers' runs, one each). Raises
    ``ConfigError`` for another scheme or a missing ``redis`` package (not connected yet:
    :meth:`RunStore.open`)."""
    check_store_url(url)
    if url is None or url == "memory:":
        return MemoryRunStore(keep)
    try:
        from ._redis import RedisRunStore  # noqa: PLC0415 (the redis extra, only when asked)
    except ImportError:
        shown = url.rsplit("@", maxsplit=1)[-1]
        raise ConfigError(
            f"run store {shown}: needs the redis package (pip install 'toollatch[redis]')"
        ) from None
    return RedisRunStore(
        url, ttl_s=ttl_s, outage_s=outage_s, lease_s=lease_s, ledger=ledger, connections=connections
    )
