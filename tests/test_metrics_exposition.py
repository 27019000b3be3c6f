"""Metrics keeps its series in plain Python and exports them through its own collector: the
text it serves must be, byte for byte, what prometheus-client's own Counter and Histogram
would serve. The reference below is the previous implementation's definitions (names, HELP
texts, labels, buckets, in registration order) on prometheus-client's metrics, fed the very
same calls as the plain one in one scripted run; only ``_created`` values (wall-clock time
at a series' first use) may differ, and they are compared exactly with created series off."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)

from test_metrics import PROVIDERS, get_weather, script, write_file
from toollatch import Agent, Limits, RetryPolicy, RunLimits, model_client
from toollatch.runtime import Metrics
from toollatch.runtime._metrics import _Family
from toollatch.scripted import ScriptedServer

_BYTES = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAITS = (1, 5, 15, 30, 60, 120, 300, 900, 3600)


def reference_metrics(r: CollectorRegistry, tool: tuple[str, ...]) -> dict[str, Any]:
    """The families exactly as the prometheus-client implementation defined them."""
    metrics = (
        Histogram("tool_assemble_args_bytes",
                  "Argument bytes of each decided call (not overflowed).", ("provider",),
                  buckets=_BYTES, registry=r),
        Counter("tool_assemble_invalid_json", "Calls failed invalid_json.", ("provider",),
                registry=r),
        Counter("tool_assemble_overflow", "Calls past the argument size limit.", ("provider",),
                registry=r),
        Histogram("tool_assemble_to_commit_seconds", "From a call's close to its commit.",
                  ("provider", "early"), buckets=_SECONDS, registry=r),
        Counter("tool_execute_rejected_not_committed",
                "Attempts to run a call that was not committed (must stay 0).", ("provider",),
                registry=r),
        Counter("tool_gate_rejections", "Calls that did not commit, by error code.",
                ("provider", "code", *tool), registry=r),
        Counter("tool_stream_anomalies", "Provider misbehaviour recorded, by kind.",
                ("provider", "kind"), registry=r),
        Histogram("tool_execute_seconds", "Tool run time, by outcome (ok or the error code).",
                  ("provider", "outcome", *tool), buckets=_SECONDS, registry=r),
        Histogram("tool_close_to_start_seconds", "From a call's close to its tool start.",
                  ("provider", "early"), buckets=_SECONDS, registry=r),
        Histogram("tool_preview_bytes", "Argument bytes a call's last preview covered.",
                  ("provider",), buckets=_BYTES, registry=r),
        Counter("tool_rounds", "Model rounds, by how they ended.", ("provider", "ended"),
                registry=r),
        Histogram("tool_approval_wait_seconds",
                  "How long a call waited for a person (or a client's result), by answer.",
                  ("provider", "decision", *tool), buckets=_WAITS, registry=r),
    )  # fmt: skip
    return {m._name: m for m in metrics}


class Reference(Metrics):
    """The same observer, its series prometheus-client's own labelled children."""

    def __init__(self, **kwargs: Any) -> None:
        self.native_registry = CollectorRegistry(auto_describe=True)
        tool = ("tool",) if kwargs.get("tool_names") is not None else ()
        self.native = reference_metrics(self.native_registry, tool)
        super().__init__(**kwargs)

    def _new_child(self, family: _Family, labels: tuple[str, ...]) -> Any:
        return self.native[family.name].labels(*labels)

    def exposition(self) -> bytes:
        return generate_latest(self.native_registry)


class Ticks:
    """A deterministic clock whose steps grow (0.4 ms, 1.2 ms, 2 ms, ...): the durations
    land in many buckets, and two instances called alike read alike."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> float:
        self.n += 1
        return 0.0004 * self.n**2


CREATED = re.compile(rb"^(\w+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def masked(text: bytes) -> bytes:
    return CREATED.sub(rb"\1 <time>", text)


async def play_both(provider: str, observers: list[Metrics]) -> None:
    async with ScriptedServer({"m": script()}, delay_scale=0) as server:
        client = model_client(
            provider, model="m", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(
                client,
                [get_weather, write_file],
                observers=observers,
                limits=Limits(max_argument_bytes=200),
                run_limits=RunLimits(max_rounds=3),
            )
            run = agent.run("go")
            [e async for e in run]
        assert run.error is None


def assert_same_text(plain: Metrics, reference: Metrics) -> None:
    text, expected = plain.exposition(), reference.exposition()
    assert masked(text) == masked(expected)
    assert CREATED.findall(text) == CREATED.findall(expected)  # the same series have one
    disable_created_metrics()
    try:
        assert plain.exposition() == reference.exposition()
    finally:
        enable_created_metrics()


@pytest.mark.parametrize("tool_names", [None, ["get_weather"]])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_scripted_run_exports_the_same_text_as_prometheus_clients_metrics(
    provider, tool_names
):
    plain = Metrics(tool_names=tool_names, clock=Ticks())
    reference = Reference(tool_names=tool_names, clock=Ticks())
    await play_both(provider, [plain, reference])
    text = plain.exposition().decode()
    # the run reached the series that matter (a comparison of empty texts proves nothing)
    for series in (
        "tool_assemble_args_bytes_bucket",
        "tool_execute_seconds_sum",
        "tool_gate_rejections_total",
        "tool_assemble_to_commit_seconds_count",
        "tool_close_to_start_seconds_bucket",
        "tool_rounds_total",
    ):
        assert series + "{" in text
    assert_same_text(plain, reference)


def test_bucket_edges_and_every_family_match():
    """Every family, values on each bound, just past it, zero and below zero."""
    plain, reference = Metrics(), Reference()
    for family in plain._collector.families:
        labels = tuple(f"{name}-value" for name in family.labels)
        for m in (plain, reference):
            child = m._child(family.name, *labels)
            if family.kind == "counter":
                child.inc()
                child.inc()
                continue
            for bound in family.bounds[:-1]:
                child.observe(bound)
                child.observe(bound * 1.000001)
            for amount in (0, -1.5, 1e9, 0.0005):
                child.observe(amount)
    assert_same_text(plain, reference)


def test_created_is_the_wall_clock_time_of_a_series_first_use():
    before = time.time()
    metrics = Metrics()
    middle = time.time()
    metrics._child("tool_rounds", "anthropic", "normal").inc()
    after = time.time()
    created = {
        name: float(value)
        for name, value in re.findall(rb"^(\w+_created\{[^}]*\}) (\S+)$",
                                      metrics.exposition(), re.MULTILINE)
    }  # fmt: skip
    first = created[b'tool_execute_rejected_not_committed_created{provider="gemini"}']
    assert before <= first <= middle
    later = created[b'tool_rounds_created{ended="normal",provider="anthropic"}']
    assert middle <= later <= after


def test_a_registry_refuses_the_same_names_twice_as_before():
    registry = CollectorRegistry(auto_describe=True)
    Metrics(registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry=registry)
    native = CollectorRegistry(auto_describe=True)
    reference_metrics(native, ())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry=native)
