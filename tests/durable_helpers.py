"""A real PostgreSQL for the durable-run tests, started in a temporary folder on a free
loopback port and stopped after.

Where the binaries are: ``initdb`` on the PATH (this machine: /usr/local/bin), else
Debian's ``postgresql`` package (/usr/lib/postgresql/<version>/bin, not on the PATH; .ci/run
installs it). PostgreSQL refuses to run as root, so as root the cluster is made and run as
the unprivileged user ``nobody`` (``runuser -u nobody --``), in a folder it owns (made with
mode 0755 outside pytest's 0700 folders, so that user can reach it); any other user runs
it as itself. Auth is ``trust`` on loopback only: the server is the test's, for one test.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from ledger_helpers import free_port


def postgres_bin() -> str:
    """The folder holding initdb and pg_ctl; skip without one (fail under CI=true)."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if debian:
        return os.path.dirname(debian[-1])
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but PostgreSQL is not installed (apt-get install -y postgresql)")
    pytest.skip("PostgreSQL (initdb) is not installed")


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1 (``url``: its ``postgres`` database)."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.port = free_port()
        self.folder = tempfile.mkdtemp(prefix="toollatch-pg-")
        self.data = os.path.join(self.folder, "data")
        self._as: list[str] = []
        if os.geteuid() == 0:
            os.chmod(self.folder, 0o755)
            shutil.chown(self.folder, "nobody")
            self._as = ["runuser", "-u", "nobody", "--"]

    def url(self, database: str = "toollatch") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr or done.stdout}")

    def start(self) -> None:
        if not os.path.exists(self.data):
            self._run(
                os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-sync",
            )  # fmt: skip
        options = f"-p {self.port} -h 127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-o", options,
            "-l", os.path.join(self.folder, "log"), "-w", "-t", "60", "start",
        )  # fmt: skip
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):
            pass

    def stop(self) -> None:
        pg_ctl = os.path.join(self.bin, "pg_ctl")
        subprocess.run(
            [*self._as, pg_ctl, "-D", self.data, "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(0.02)
