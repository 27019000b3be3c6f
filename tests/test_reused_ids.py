"""Servers that number call ids per response (vLLM, Ollama, llama.cpp: ``call_0``, ``call_1``...
in every response; /work/shared/QUIRKS.md) reuse ``call_0`` in every round of one conversation.

Each such call is a new call: it runs, and it gets a derived id (``call_0_r2``...) that the
dispatcher, the ledger, the events and the history all use, so the history never holds one id
twice (Anthropic: "`tool_use` ids must be unique", trycua/cua#524; the Responses API refuses a
repeated function call ``call_id``; OpenAI chat pairs results by id). An id the ledger knows
but the history does not hold yet (a round cut off by a crash, asked again by ``--resume``) is
the same call: its stored outcome answers it, exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from toollatch import Agent, RetryPolicy, StreamParser, ToolResult, model_client, tool
from toollatch.core._messages._ids import history_call_ids
from toollatch.ledger import LedgerKey
from toollatch.ledger._base import MemoryLedger
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.stages import AnomalyKind, assistant_messages, error_results, tool_results_messages

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
CITIES = ("Oslo", "Rome", "Lima")


def per_response_ids() -> Script:
    """Three rounds, each calling ``call_0`` (a server numbering ids per response), then text."""
    calls = tuple(
        Turn(
            items=(Call(call_id="call_0", name="get_weather", arguments=json.dumps({"city": c})),),
            delay_ms=0,
        )
        for c in CITIES
    )
    return Script(turns=(*calls, Turn(items=(Text(text="done"),), delay_ms=0)), reuse_ids=True)


def weather_tool(ran: list[str], *, eager: bool = False):
    @tool(eager=eager)
    def get_weather(city: str) -> str:
        """Weather."""
        ran.append(city)
        return f"sunny in {city}"

    return get_weather


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("backend", ["none", "memory"])
async def test_call_0_in_every_round_runs_each_time_with_its_own_result(provider, eager, backend):
    ran: list[str] = []
    ledger = MemoryLedger() if backend == "memory" else None
    async with ScriptedServer({"m": per_response_ids()}, delay_scale=0) as server:
        url = server.base_url(provider)
        client = model_client(provider, model="m", base_url=url, retry=RetryPolicy(attempts=1))
        async with client:
            agent = Agent(client, [weather_tool(ran, eager=eager)], ledger=ledger)
            run = agent.run("weather?")
            events = [e.to_json() async for e in run]
        statuses = [r.status for r in server.requests]
    last = events[-1]
    assert statuses == [200, 200, 200, 200]  # every history valid (ids unique, each answered)
    assert last["error"] is None
    assert last["rounds"] == 4
    assert ran == list(CITIES)  # the tool ran in each round, not answered from round 1
    ids = ["call_0", "call_0_r2", "call_0_r3"]
    if provider == "gemini":  # no ids on the wire: the made-up ones, unique per request
        ids = [c["id"] for c in last["calls"]]
        assert len(set(ids)) == 3
    finished = [(e["id"], e["is_error"]) for e in of(events, "tool_finished")]
    assert finished == [(i, False) for i in ids]
    assert [e["id"] for e in of(events, "tool_started")] == ids
    assert [e["id"] for e in of(events, "call_committed")] == ids
    assert [(c["id"], c["error"]) for c in last["calls"]] == [(i, None) for i in ids]
    history = json.dumps(last["history"])
    for city in CITIES:  # each call's own result, once
        assert history.count(f"sunny in {city}") == 1
    reused = [a for r in run.rounds for a in r.anomalies if a.kind is AnomalyKind.CALL_ID_REUSED]
    if provider == "gemini":
        assert not reused
    else:
        assert [a.detail.rsplit(" ", 1)[-1] for a in reused] == ["'call_0_r2'", "'call_0_r3'"]
        assert history_call_ids(provider, last["history"]) == set(ids)
    if ledger is not None:
        for i, city in zip(ids, CITIES, strict=True):
            record = await ledger.get(LedgerKey(scope=run.conversation, call_id=i))
            assert record is not None
            assert record.result is not None
            assert record.result.content == f"sunny in {city}"


def test_a_reused_id_is_renamed_in_the_round_and_a_repeat_inside_it_stays_a_duplicate():
    parser = StreamParser("openai_chat", reserved_ids={"call_0", "call_0_r2"})
    chunk = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": i, "id": "call_0", "function": {"name": "f", "arguments": "{}"}}
                        for i in (0, 1)
                    ]
                    + [{"index": 2, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}]
                },
            }
        ]
    }
    data = f"data: {json.dumps(chunk)}\n\n"
    data += 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    parser.feed(data.encode())
    round_ = parser.finish()
    assert [(c.call_id, c.error) for c in round_.calls] == [
        ("call_0_r3", None),  # call_0_r2 is taken by the history too
        ("call_0_r3", "duplicate_call_id"),
        ("call_1", None),
    ]
    committed = round_.committed()
    assert [c.call_id for c in committed] == ["call_0_r3", "call_1"]
    kinds = [a.kind for a in round_.anomalies]
    assert kinds.count(AnomalyKind.CALL_ID_REUSED) == 2
    assert AnomalyKind.DUPLICATE_CALL_ID in kinds
    history = assistant_messages(round_)

    results = [ToolResult(tool_call_id=c.call_id, name=c.name, content="ok") for c in committed]
    history += tool_results_messages(round_, [*results, *error_results(round_)])
    assert [c["id"] for c in history[0]["tool_calls"]] == ["call_0_r3", "call_0_r3_dup2", "call_1"]
    assert history_call_ids("openai_chat", history) == {"call_0_r3", "call_0_r3_dup2", "call_1"}


def test_history_call_ids_reads_each_providers_calls_and_results():
    assert history_call_ids(
        "anthropic",
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b"}]},
        ],
    ) == {"a", "b"}
    assert history_call_ids(
        "bedrock",
        [
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "a"}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "b"}}, "junk"]},
        ],
    ) == {"a", "b"}
    assert history_call_ids(
        "gemini",
        [
            {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},  # no id: none
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "id": "g"}}]},
        ],
    ) == {"g"}
    assert history_call_ids(
        "openai_responses",
        [
            {"type": "function_call", "call_id": "a", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "b"},
            {"role": "user", "content": "x"},
        ],
    ) == {"a", "b"}
    assert history_call_ids("openai_chat", [None, {"role": "tool", "tool_call_id": 3}]) == set()


# -- a crash in round 2, then --resume -----------------------------------------------------------


def killed_in_round_2_script() -> Script:
    """Three rounds of ``call_0``: round 2's tool is slow (the test kills the process in it)."""
    turns = (
        Turn(
            items=(
                Call(call_id="call_0", name="get_weather", arguments=json.dumps({"city": "Oslo"})),
            ),
            delay_ms=0,
        ),
        Turn(
            items=(
                Call(call_id="call_0", name="write_file", arguments=json.dumps({"path": "a.md"})),
            ),
            delay_ms=0,
        ),
        Turn(
            items=(
                Call(call_id="call_0", name="get_weather", arguments=json.dumps({"city": "Lima"})),
            ),
            delay_ms=0,
        ),
        Turn(items=(Text(text="done"),), delay_ms=0),
    )
    return Script(turns=turns, reuse_ids=True)


# (gemini sends no ids: the made-up ones, gemini:<attempt>:<n>, continue after the history's)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_run_killed_in_round_2_resumes_with_round_2s_call_0_run_once(provider, tmp_path):
    log = tmp_path / "ran.log"
    tools = tmp_path / "tools.py"
    tools.write_text(
        textwrap.dedent(f'''
        import time
        import toollatch

        def note(what):
            with open({str(log)!r}, "a") as f:
                f.write(what + "\\n")

        @toollatch.tool
        def get_weather(city: str) -> str:
            """Weather."""
            note("weather " + city)
            return "sunny in " + city

        @toollatch.tool(timeout=60)
        def write_file(path: str) -> str:
            """Write, slowly: the test kills the process while this runs."""
            note("write started")
            time.sleep(30)
            note("write finished")
            return "ok"
    ''')
    )
    # the killed run's claim lives 1.5 s unrenewed, not 30: the resume waits that out first
    # (renewed every 0.5 s while the run lives; nothing else claims the call meanwhile)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOOLLATCH_LEDGER__LEASE_S": "1.5"}
    with ScriptedServer({"m": killed_in_round_2_script()}, delay_scale=0) as server:
        command = [
            sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", str(tools),
            "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}", "--provider", provider,
            "--base-url", server.base_url(provider), "--model", "m",
        ]  # fmt: skip
        with subprocess.Popen(
            [*command, "--session", "r1"], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env
        ) as first:
            assert first.stdout is not None
            for line in first.stdout:
                event = json.loads(line)
                if event["type"] == "tool_started" and event["name"] == "write_file":
                    break
            deadline = time.monotonic() + 30
            while "write started" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "write_file never started"
                time.sleep(0.01)
            first.send_signal(signal.SIGKILL)  # mid-tool: round 2 is neither finished nor stored
        done = subprocess.run(
            [*command, "--resume", "r1"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip
        statuses = [r.status for r in server.requests]
    assert done.returncode == 0, done.stderr
    assert all(s == 200 for s in statuses), statuses
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["type"] == "run_ended"
    assert last["error"] is None
    # round 1 ran once (before the kill); round 2's write started once and is "started,
    # outcome unknown" (write_file is not idempotent): not run again, not round 1's result;
    # round 3's call_0 ran
    assert log.read_text().splitlines() == ["weather Oslo", "write started", "weather Lima"]
    calls = [(c["name"], c["error"]) for c in last["calls"]]
    assert calls == [("write_file", "outcome_unknown"), ("get_weather", None)]
    history = json.dumps(last["history"])
    assert history.count("sunny in Oslo") == 1
    assert history.count("sunny in Lima") == 1
    assert "its outcome is unknown" in history
    ids = ["gemini:2:0", "gemini:3:0"] if provider == "gemini" else ["call_0_r2", "call_0_r3"]
    assert [c["id"] for c in last["calls"]] == ids  # (gemini: the attempts go on from round 1)
