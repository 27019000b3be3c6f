"""The SQLite files of the ledger, the run history and the audit are private: created 0600
(and so their -wal and -shm files, which SQLite gives the database's mode) whatever the
umask; a file that is there already is never re-created nor changed."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from toollatch import open_audit, open_history, open_ledger
from toollatch.ledger import LedgerKey, digest_of

KEY = LedgerKey(scope="run-1", call_id="call_1")


@pytest.fixture(params=[0o022, 0o002, 0o277], ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def modes(path: Path) -> dict[str, int]:
    """The permission bits of the database file and its -wal and -shm files."""
    return {
        p.name: stat.S_IMODE(p.stat().st_mode)
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        if p.exists()
    }


async def test_the_ledger_file_and_its_wal_and_shm_are_0600(tmp_path, umask):
    path = tmp_path / "ledger.db"
    ledger = open_ledger(f"sqlite:///{path}")
    try:
        await ledger.claim(KEY, digest=digest_of("t", {}), worker="w", now=0.0, lease_s=30)
        found = modes(path)
    finally:
        await ledger.aclose()
    assert set(found) == {"ledger.db", "ledger.db-wal", "ledger.db-shm"}
    assert found == dict.fromkeys(found, 0o600), (oct(umask), found)


async def test_the_history_file_is_0600(tmp_path, umask):
    path = tmp_path / "history.db"
    history = open_history(f"sqlite:///{path}")
    try:
        await history.append("run-1", [{"role": "user", "content": "hi"}], at=0)
        found = modes(path)
    finally:
        await history.aclose()
    assert set(found) == {"history.db", "history.db-wal", "history.db-shm"}
    assert found == dict.fromkeys(found, 0o600)


async def test_the_audit_file_is_0600(tmp_path, umask):
    path = tmp_path / "audit.db"
    audit = open_audit(f"sqlite:///{path}")
    try:
        assert await audit.records("run-1", now=0.0) == []
        found = modes(path)
    finally:
        await audit.aclose()
    assert set(found) == {"audit.db", "audit.db-wal", "audit.db-shm"}
    assert found == dict.fromkeys(found, 0o600)


async def test_the_default_folder_is_made_private(tmp_path):
    path = tmp_path / "data" / "toollatch" / "ledger.db"
    ledger = open_ledger(f"sqlite:///{path}", create_folder=True)
    try:
        assert await ledger.get(KEY) is None
    finally:
        await ledger.aclose()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_an_existing_file_keeps_its_mode_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="toollatch.ledger")
    path = tmp_path / "shared.db"
    path.touch()
    path.chmod(0o640)  # (the user's choice: a group that reads it)
    ledger = open_ledger(f"sqlite:///{path}")
    try:
        assert await ledger.get(KEY) is None
    finally:
        await ledger.aclose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert any("readable by others" in r.getMessage() for r in caplog.records)


def test_what_is_there_is_left_alone(tmp_path):
    from toollatch.ledger._sqlite import create_private

    target = tmp_path / "target"
    target.write_text("x")
    target.chmod(0o644)
    link = tmp_path / "link.db"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "nowhere")
    create_private(link)
    create_private(dangling)  # O_EXCL: a link, even to nothing, is not followed
    create_private(tmp_path / "missing" / "x.db")  # (SQLite reports a missing folder)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert not (tmp_path / "nowhere").exists()
    assert not (tmp_path / "missing").exists()
