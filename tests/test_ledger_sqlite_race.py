"""Processes racing to open one brand-new SQLite ledger file (the set-up's WAL switch).

On a file not yet in WAL mode, ``PRAGMA journal_mode = WAL`` upgrades a read transaction to
a write, for which SQLite never calls the busy handler, so all but one of the processes
opening a new file together get "database is locked" at once (measured: 6 of 40 races of 4
processes without the retry). Four processes here open 30 fresh files, each at the same
instant, and make a claim in each: every open and claim must succeed, the file must end in
WAL mode, and each call must be won by exactly one process.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ledger_helpers import json_outputs
from toollatch.ledger import LedgerKey, Won
from toollatch.ledger._sqlite import SQLiteLedger

FILES = 30
WORKERS = 4
GAP_S = 0.2  # between two files' races: long enough for one race on a loaded machine

RACER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from toollatch.ledger import LedgerKey, Won
    from toollatch.ledger._sqlite import SQLiteLedger

    async def main(folder, start_at, files, gap, worker):
        out = []
        for k in range(files):
            time.sleep(max(0.0, start_at + k * gap - time.time()))  # (exact: no loop hop)
            ledger = SQLiteLedger(f"{folder}/ledger-{k}.db")
            try:
                claim = await ledger.claim(
                    LedgerKey(scope="s", call_id="c"), digest="d", worker=worker,
                    now=time.time(), lease_s=60,
                )
                out.append("won" if isinstance(claim, Won) else "found")
            except Exception as exc:
                out.append(f"error: {exc}")
            finally:
                await ledger.aclose()
        print(json.dumps(out))

    folder, start_at, files, gap, worker = sys.argv[1:]
    asyncio.run(main(folder, float(start_at), int(files), float(gap), worker))
    """
)


def test_processes_racing_on_brand_new_files_all_succeed(tmp_path: Path) -> None:
    start_at = time.time() + 2.0  # after every interpreter has started
    args = [str(tmp_path), str(start_at), str(FILES), str(GAP_S)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, *args, f"w{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(WORKERS)
    ]
    outcomes = json_outputs(procs, timeout=120)
    for k in range(FILES):
        per_file = [o[k] for o in outcomes]
        assert not [x for x in per_file if x.startswith("error")], (k, per_file)
        assert sorted(per_file) == ["found"] * (WORKERS - 1) + ["won"], (k, per_file)
        with sqlite3.connect(tmp_path / f"ledger-{k}.db") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def _writer_holding(path: Path) -> sqlite3.Connection:
    """A connection of 'another process' in a write transaction on a brand-new file."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # RESERVED: new readers may come, no other writer
    return other


def test_sqlite_answers_the_wal_switch_busy_at_once_whatever_the_busy_timeout(
    tmp_path: Path,
) -> None:
    # The cause, pinned on plain sqlite3: the switch upgrades a read transaction, and SQLite
    # does not wait on an upgrade, so the 10 s busy timeout is not used.
    other = _writer_holding(tmp_path / "l.db")
    conn = sqlite3.connect(tmp_path / "l.db", timeout=10, isolation_level=None)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        conn.execute("PRAGMA journal_mode = WAL")
    assert time.monotonic() - started < 1.0  # at once, not after the busy timeout
    other.execute("ROLLBACK")
    conn.close()
    other.close()


async def test_the_ledger_waits_out_a_wal_switch_answered_busy(tmp_path: Path) -> None:
    other = _writer_holding(tmp_path / "l.db")
    threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
    ledger = SQLiteLedger(tmp_path / "l.db")
    started = time.monotonic()
    claim = await ledger.claim(
        LedgerKey(scope="s", call_id="c"), digest="d", worker="w", now=time.time(), lease_s=60
    )
    await ledger.aclose()
    other.close()
    assert isinstance(claim, Won)
    assert time.monotonic() - started >= 0.25  # it retried until the other writer was done
    with sqlite3.connect(tmp_path / "l.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
