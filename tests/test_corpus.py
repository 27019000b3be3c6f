"""Conformance: every recorded provider stream in ../shared/fixtures assembles to expected.json.

Read in place (never copied into the repo). Absent corpus: skipped on a user's clone, a failure
under CI=true (see conftest.corpus_dir). Each file is replayed whole, in 1-byte and in 7-byte
pieces; all three must give the expected calls and identical rounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import CORPUS, corpus_dir
from toollatch import CallState, Round
from toollatch.cli import replay_bytes
from toollatch.stages import AnomalyKind, ServerToolBlock
from toollatch.testing import summary


def _expected() -> dict[str, Any]:
    path = CORPUS / "expected.json"
    return json.loads(path.read_text()) if path.is_file() else {}


EXPECTED = _expected()
FILES = sorted(EXPECTED) or ["<corpus absent>"]


def provider_of(entry: dict[str, Any]) -> str:
    fmt = entry["format"]
    return "bedrock" if fmt == "bedrock_eventstream" else fmt


def client_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if "kind" not in c]


def check_calls(round_: Round, choice: int, expected: list[dict[str, Any]]) -> None:
    got = round_.choices[choice].calls if choice < len(round_.choices) else ()
    assert len(got) == len(expected), [(c.name, c.state, c.error, c.detail) for c in got]
    synthesized = {a.key for a in round_.anomalies if a.kind is AnomalyKind.SYNTHESIZED_ID}
    for call, want in zip(got, expected, strict=True):
        assert call.name == want["name"]
        if want["id"]:
            assert call.call_id == want["id"]
        else:  # the provider sent no id: a stable one is made up, and said so
            assert call.call_id and call.key in synthesized
        if want["arguments"] is None:
            assert call.state is not CallState.COMMITTED and call.arguments is None
        else:
            assert call.state is CallState.COMMITTED, (call.error, call.detail)
            assert call.arguments == want["arguments"]


def server_calls(round_: Round) -> list[dict[str, Any]]:
    """Server-executed tool uses recorded as blocks, as ``{id, name, arguments}``."""
    found = []
    for block in round_.blocks:
        if not isinstance(block, ServerToolBlock):
            continue
        data = dict(block.data)
        use = data.get("toolUse", data)
        if not isinstance(use, dict):
            continue
        call_id = use.get("id") or use.get("toolUseId")
        if call_id and "name" in use and ("input" in use or "arguments" in use):
            found.append(
                {
                    "id": call_id,
                    "name": use["name"],
                    "arguments": use.get("input", use.get("arguments")),
                }
            )
    return found


@pytest.mark.corpus
@pytest.mark.parametrize("rel", FILES)
def test_recorded_stream_assembles_to_expected(rel: str) -> None:
    root = corpus_dir()
    entry = EXPECTED[rel]
    data = (root / rel).read_bytes()
    provider = provider_of(entry)
    rounds = [
        replay_bytes(data, name=Path(rel).name, provider=provider, chunk_bytes=size)
        for size in (None, 1, 7)
    ]
    assert summary(rounds[1]) == summary(rounds[0])
    assert summary(rounds[2]) == summary(rounds[0])
    round_ = rounds[0]
    if "calls_by_choice" in entry:
        for choice, calls in entry["calls_by_choice"].items():
            check_calls(round_, int(choice), client_calls(calls))
    else:
        check_calls(round_, 0, client_calls(entry["calls"]))
    servers = [c for c in entry["calls"] if "kind" in c]
    if servers:
        assert server_calls(round_) == [
            {k: c[k] for k in ("id", "name", "arguments")} for c in servers
        ]
    if not entry["calls"]:
        assert round_.calls == ()


@pytest.mark.corpus
def test_auto_detection_finds_the_recorded_provider() -> None:
    root = corpus_dir()
    for rel, entry in EXPECTED.items():
        round_ = replay_bytes((root / rel).read_bytes(), name=Path(rel).name)
        assert round_.provider == provider_of(entry), rel


@pytest.mark.corpus
def test_corpus_has_the_documented_size() -> None:
    root = corpus_dir()
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and p.suffix != ".md" and p.name != "expected.json"
    ]
    assert len(files) == len(EXPECTED) == 57
