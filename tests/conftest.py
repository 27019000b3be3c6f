"""Shared test configuration: Hypothesis profiles, the recorded-stream corpus locator and a
redis-server per test module (``redis_server``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ledger_helpers import RedisServer
from toollatch import StreamDecodeError, UsageError

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


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
