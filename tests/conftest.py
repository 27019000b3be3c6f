"""Shared test configuration: Hypothesis profiles, the recorded-stream corpus locator, a
redis-server per test module (``redis_server``), each built-in ledger (``store``), one mypy
run at a time on a shared cache (``mypy_lock``) and the number of pytest-xdist workers
(``-n auto``, the default in pyproject's addopts)."""

from __future__ import annotations

import compileall
import fcntl
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from durable_helpers import PostgresServer
from ledger_helpers import RedisServer
from toollatch import StreamDecodeError, UsageError
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._sqlite import SQLiteLedger

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "fixtures"

# Workers per CPU for ``-n auto``, and at most MAX_WORKERS in all. Each worker collects every
# file it is given (~9 s of CPU for the whole suite), and much of the suite waits: on servers,
# subprocesses, browsers and the paces of scripted models (a run with two workers on 2 cores
# used 666 s of CPU in 634 s of wall time, so the cores were idle about half of it). So one
# worker and a half per CPU: three on 2 cores ran 3,917 tests in 435 s and 447 s (the second
# with the load rising to 4 from other work), against 547-634 s with two. Two per CPU on a
# loaded 2-core machine once took 30 % more CPU and failed timing-bound tests (a 30 ms
# median, a 0.15 s lease) that pass alone: not more.
WORKERS_PER_CPU = 1.5
MAX_WORKERS = 3


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one in-process run (no workers) for a single test file, else
    ``WORKERS_PER_CPU`` per CPU, at most MAX_WORKERS and one per selected file (``--dist
    loadfile`` runs a file's tests on one worker). PYTEST_XDIST_AUTO_NUM_WORKERS, when set,
    wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    files = _selected_test_files(config)
    if files <= 1:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(files, MAX_WORKERS, max(1, int(WORKERS_PER_CPU * (cpus or 1))))


# Each test file's seconds in the last runs (pytest's cache, ``.pytest_cache``), so that the
# workers start on the longest files and no long file is left for the end (a file runs on one
# worker). Without the cache (a fresh clone, as CI runs) the seconds of tests/file_seconds.json
# (one whole run's, summed from its --junitxml) order them: in collection order, one run put
# test_relay_durable.py (180 s) and test_relay_store.py (82 s) near the end, 797 s in all.
FILE_SECONDS = "toollatch/file_seconds"
SEED_SECONDS = Path(__file__).with_name("file_seconds.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the files longest first (unknown ones, e.g. new files, first of all);
    every worker reads the same cache and seed, so all collect the same order, as xdist
    requires."""
    if not hasattr(config, "workerinput"):
        return
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    seed = json.loads(SEED_SECONDS.read_text()) if SEED_SECONDS.is_file() else {}
    seconds = {**seed, **(cache.get(FILE_SECONDS, {}) if cache is not None else {})}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], float("inf")))


_SECONDS: dict[str, float] = {}  # written by the controlling process (or a run without workers)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file = report.nodeid.split("::")[0]
    _SECONDS[file] = _SECONDS.get(file, 0.0) + report.duration


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile src/ once, before any worker starts: the suite starts a few hundred Python
    subprocesses (the CLI, MCP servers, ledger workers), and with PYTHONDONTWRITEBYTECODE set
    (or a fresh clone) each would compile toollatch's modules again (~0.15 s of CPU apiece).
    Stale or missing files only are written, into the gitignored __pycache__ folders."""
    src = ROOT / "src"
    if not hasattr(session.config, "workerinput") and src.is_dir():
        compileall.compile_dir(src, quiet=2)  # no output, not even for a read-only tree


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if _SECONDS and cache is not None and not hasattr(session.config, "workerinput"):
        cache.set(FILE_SECONDS, {**cache.get(FILE_SECONDS, {}), **_SECONDS})


def _selected_test_files(config: pytest.Config) -> int:
    """How many test files the command line selects (a directory counts its test files)."""
    found: set[Path] = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.is_dir():
            found.update(path.rglob("test_*.py"))
            found.update(path.rglob("*_test.py"))
        else:
            found.add(path)
    return len(found)


def corpus_dir() -> Path:
    """The shared corpus; skip when absent on a user's clone, fail when absent under CI."""
    if (CORPUS / "expected.json").is_file():
        return CORPUS
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the shared corpus is missing at {CORPUS}")
    pytest.skip("shared corpus (../shared/fixtures) not present in this checkout")


def decoded_until_error(decoder, chunks):
    """Every frame ``decoder`` gives for ``chunks`` until it raises, and the error's message
    (None if none); a raised error must close the decoder (a second finish is misuse)."""
    frames = []
    try:
        for chunk in chunks:
            frames += decoder.feed(chunk)
        frames += decoder.finish()
    except StreamDecodeError as exc:
        with pytest.raises(UsageError):
            decoder.finish()
        return frames, str(exc)
    return frames, None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on loopback for one test module (skips without it; see ledger_helpers)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """Each built-in ledger in turn (a fresh one; Redis flushed): the question and
    always-allow stores' tests (test_approvals.py, test_sticky_approvals.py)."""
    if request.param == "memory":
        yield MemoryLedger()
    elif request.param == "sqlite":
        made = SQLiteLedger(tmp_path / "ledger.db")
        yield made
        await made.aclose()
    else:
        import redis.asyncio as aioredis

        from toollatch.ledger._redis import RedisLedger

        server: RedisServer = request.getfixturevalue("redis_server")
        client = aioredis.Redis.from_url(server.url, socket_timeout=2)
        await client.flushdb()
        redis_ledger = RedisLedger(client)
        yield redis_ledger
        await redis_ledger.aclose()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster on loopback for one test module (skips without it; see
    durable_helpers)."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def mypy_lock() -> Callable[[], AbstractContextManager[None]]:
    """A context manager to hold around a mypy run from ROOT (cache: ROOT/.mypy_cache): the
    runs take turns, across pytest-xdist workers too, so that the second one reuses the cache
    the first one wrote instead of checking src/toollatch and its dependencies cold again."""
    cache = ROOT / ".mypy_cache"

    @contextmanager
    def hold() -> Iterator[None]:
        cache.mkdir(exist_ok=True)
        with open(cache / "toollatch-tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    return hold
