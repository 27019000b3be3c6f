"""``open_ledger(url)``, ``open_history(url)``: a ledger and its run-history store from a
``--ledger`` URL (internal)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..core._errors import ConfigError
from ..core._preview import Redactor
from ._audit import AuditStore, MemoryAudit
from ._base import Ledger, MemoryLedger
from ._history import History, MemoryHistory, SQLiteHistory
from ._redacted import RedactedHistory, RedactedLedger


def open_ledger(
    url: str, *, create_folder: bool = False, redactor: Redactor | None = None
) -> Ledger:
    """The ledger a URL names: ``memory:``, ``sqlite:///PATH`` (SQLAlchemy's convention:
    ``sqlite:///ledger.db`` is relative to the working folder, ``sqlite:////var/x.db``
    absolute; https://docs.sqlalchemy.org/en/20/core/engines.html#sqlite) or
    ``redis://[:PASSWORD@]HOST:PORT/DB`` (``rediss://`` for TLS; needs the ``redis`` extra).
    A SQLite file toollatch creates is private (mode 0600, and so are its ``-wal`` and
    ``-shm`` files; see :func:`~toollatch.ledger._sqlite.create_private`).
    ``create_folder``: make a SQLite file's missing folders (for :func:`default_ledger_url`;
    off by default so that a mistyped path is an error). ``ConfigError`` for any other URL
    or a missing package. ``redactor``: every result passes it before it is stored
    (:class:`~toollatch.ledger._redacted.RedactedLedger`)."""
    ledger = _ledger(url, create_folder)
    return ledger if redactor is None else RedactedLedger(ledger, redactor)


def _ledger(url: str, create_folder: bool) -> Ledger:
    scheme = _scheme(url)
    if scheme == "memory":
        return MemoryLedger()
    if scheme == "sqlite":
        path = _sqlite_path(url, create_folder=create_folder)
        from ._sqlite import SQLiteLedger  # noqa: PLC0415 (keeps the package import light)

        return SQLiteLedger(path, create_folder=create_folder)
    if scheme in ("redis", "rediss"):
        client = _redis_client(url)  # (first: it says when the package is missing)
        from ._redis import RedisLedger  # noqa: PLC0415 (the [redis] extra, lazily)

        return RedisLedger(client)
    raise _unknown(url)


def open_history(url: str, *, redactor: Redactor | None = None) -> History:
    """The run-history store beside the ledger a URL names (see :func:`open_ledger`):
    ``memory:``, the same SQLite file (its own table), or the same Redis server. ``ConfigError``
    for any other URL. ``redactor``: every message passes it before it is stored
    (:class:`~toollatch.ledger._redacted.RedactedHistory`)."""
    history = _history(url)
    return history if redactor is None else RedactedHistory(history, redactor)


def _history(url: str) -> History:
    scheme = _scheme(url)
    if scheme == "memory":
        return MemoryHistory()
    if scheme == "sqlite":
        return SQLiteHistory(_sqlite_path(url))
    if scheme in ("redis", "rediss"):
        client = _redis_client(url)  # (first: it says when the package is missing)
        from ._redis import RedisHistory  # noqa: PLC0415 (the [redis] extra, lazily)

        return RedisHistory(client)
    raise _unknown(url)


def open_audit(url: str, *, create_folder: bool = False) -> AuditStore:
    """The audit store beside the ledger a URL names (see :func:`open_ledger`): ``memory:``,
    the same SQLite file (its own table) or the same Redis server (its own keys); for
    ``ArgumentAudit``. ``ConfigError`` for any other URL."""
    scheme = _scheme(url)
    if scheme == "memory":
        return MemoryAudit()
    if scheme == "sqlite":
        path = _sqlite_path(url, create_folder=create_folder)
        from ._audit_sqlite import SQLiteAudit  # noqa: PLC0415 (keeps the package import light)

        return SQLiteAudit(path, create_folder=create_folder)
    if scheme in ("redis", "rediss"):
        client = _redis_client(url)  # (first: it says when the package is missing)
        from ._audit_redis import RedisAudit  # noqa: PLC0415 (the [redis] extra, lazily)

        return RedisAudit(client)
    raise _unknown(url)


def _scheme(url: str) -> str:
    if not isinstance(url, str):
        raise ConfigError(f"a ledger URL must be a str, got {url!r:.60}")
    return urlsplit(url).scheme


def sqlite_file(url: str) -> str:
    """The absolute file a ``sqlite:///PATH`` ledger URL names (its folder made if missing),
    by the rule :func:`open_ledger` follows; ``ConfigError`` when the URL names no file."""
    return _sqlite_path(url, create_folder=True)


def _sqlite_path(url: str, *, create_folder: bool = False) -> str:
    """The file a ``sqlite:///PATH`` URL names, by SQLAlchemy's rule (the part after
    ``sqlite:///`` is the path: ``sqlite:///ledger.db`` relative to the working folder,
    ``sqlite:////var/x.db`` absolute; https://docs.sqlalchemy.org/en/20/core/engines.html#sqlite),
    made absolute now: a relative file is the working folder's at the time of the open,
    not of the first write. ``ConfigError`` when it names no file, has a query or fragment
    (driver options toollatch does not take), or is relative with a folder that does not
    exist when the absolute reading's does (``sqlite:///dev/null``, written for
    ``sqlite:////dev/null``): the error says which to write."""
    parts = urlsplit(url)
    path = unquote(parts.path[1:] if parts.netloc == "" else "")
    if not path or path.endswith("/"):
        raise ConfigError(f"a sqlite ledger URL names a file: sqlite:///PATH, got {url!r}")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(f"a sqlite ledger URL takes no ?options or #fragment, got {url!r}")
    if Path(path).is_absolute() or path == ":memory:":  # (SQLite's own name for no file)
        return path
    folder = Path(path).parent
    if not create_folder and not folder.is_dir() and Path("/", path).parent.is_dir():
        raise ConfigError(
            f"{url!r} names the relative path {path!r} (three slashes: relative to the working "
            f"folder, whose {str(folder)!r} does not exist); for the absolute path write "
            f"'sqlite:////{path}' (four slashes, SQLAlchemy's rule)"
        )
    return str(Path.cwd() / path)


def _unknown(url: str) -> ConfigError:
    return ConfigError(f"unknown ledger URL {url!r}: use sqlite:///PATH or redis://HOST:PORT/DB")


def _redis_client(url: str) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (``ConfigError`` without the package or for a
    bad URL)."""
    try:
        import redis.asyncio as aioredis  # noqa: PLC0415 (the [redis] extra, lazily)
    except ImportError as exc:  # pragma: no cover - the test environment has the extra
        hint = "pip install 'toollatch[redis]'"
        raise ConfigError(f"a redis:// ledger needs the redis package: {hint}") from exc
    try:
        # Timeouts so that a Redis down is an error within seconds, never a hang.
        return aioredis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    except ValueError as exc:
        raise ConfigError(f"bad redis URL {url!r}: {exc}") from exc


def default_ledger_url(environ: Mapping[str, str] | None = None) -> str:
    """``sqlite:///`` + ``$XDG_DATA_HOME/toollatch/ledger.db`` (default
    ``~/.local/share``; https://specifications.freedesktop.org/basedir-spec/latest/): the
    ledger ``serve`` uses without ``--ledger``; open it with ``create_folder=True``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/share")
    return "sqlite:///" + str(Path(base) / "toollatch" / "ledger.db")
