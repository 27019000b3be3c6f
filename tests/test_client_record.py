"""`model_client(record=DIR)` (and `toollatch run --record`): each response saved as a fixture
`toollatch replay` reads unchanged, the API key never in the files; on all four wires."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripted_helpers import PROVIDERS, first_history
from toollatch import StreamParser, model_client
from toollatch.scripted import ScriptedServer

KEY = "sk-record-0123456789abcdefghijkl"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_response_is_a_replayable_fixture_without_the_key(provider, tmp_path):
    async with ScriptedServer(delay_scale=0) as server:
        client = model_client(
            provider, model="scripted", base_url=server.base_url(provider), api_key=KEY,
            record=tmp_path,
        )  # fmt: skip
        async with client:
            parser = StreamParser(provider)
            async with client.stream(first_history(provider)) as stream:
                async for chunk in stream:
                    parser.feed(chunk)
    round_ = parser.finish()
    [sse] = list(tmp_path.glob("*.sse"))
    meta = json.loads(sse.with_suffix(".json").read_text())
    assert meta["provider"] == provider
    assert meta["status"] == 200
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes()
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", "--provider",
         provider, str(sse)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    calls = json.loads(replayed.stdout)["calls"]
    expected = [(r.call_id, r.name) for c in round_.choices for r in c.calls]
    assert [(c["id"], c["name"]) for c in calls] == expected
    assert expected


def test_toollatch_run_record_keeps_each_round_of_the_demo(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--workspace",
         str(tmp_path / "ws"), "--record", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rounds = [json.loads(line) for line in done.stdout.splitlines()]
    ended = rounds[-1]
    assert ended["type"] == "run_ended"
    recorded = sorted((tmp_path / "rec").glob("*.sse"))
    assert len(recorded) == ended["rounds"]  # one fixture per model request
    first = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", str(recorded[0])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(first.stdout)["calls"]  # the demo's first round has its calls
