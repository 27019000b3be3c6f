"""The runtime's failure paths end every run with every call paired (issue 28): two calls of
one round with one id (R3), a result that is not valid Unicode (R4), call ids reused by
another conversation (R9), and a result told by ``tool_finished`` even when the tool did not
run here (N2). Over real loopback HTTP with the scripted server, which refuses a next request
whose history the real API would refuse."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ledger_helpers import chat_round
from toollatch import (
    Agent,
    ErrorCode,
    RetryPolicy,
    RunLimits,
    StreamParser,
    ToolResult,
    ToolSpec,
    model_client,
    tool,
    user_message,
)
from toollatch.core._messages._ids import derived_id
from toollatch.ledger import LedgerKey, digest_of
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._history import MemoryHistory
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.runtime import Dispatcher
from toollatch.scripted import Call, Script, ScriptedServer, Turn
from toollatch.stages import (
    AnomalyKind,
    assistant_messages,
    error_results,
    repaired_history,
    tool_results_messages,
)
from toollatch.tools._results import ResultShaper, valid_unicode

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
EVERY_PROVIDER = pytest.mark.parametrize("provider", PROVIDERS)
NOT_UTF8 = b"report-\xff.txt".decode("utf-8", "surrogateescape")  # what os.listdir gives


def weather(call_id: str, city: str) -> Call:
    return Call(call_id=call_id, name="get_weather", arguments=json.dumps({"city": city}))


def twice_one_id() -> Script:
    """A model bug: two calls of one response with one id."""
    turn = Turn(items=(weather("call_0", "Oslo"), weather("call_0", "Rome")), delay_ms=0)
    return Script(turns=(turn,), reuse_ids=True)


def weather_tool(ran: list[str], *, eager: bool = False):
    @tool(eager=eager)
    def get_weather(city: str) -> str:
        """Weather."""
        ran.append(city)
        return f"sunny in {city}"

    return get_weather


async def play(server, provider, tools, *, model, message="go", **kw):
    client = model_client(
        provider, model=model, base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
    )
    async with client:
        agent = Agent(client, tools, **kw)
        run = agent.run(message)
        events = [e.to_json() async for e in run]
    return events, run


def of(events, kind):
    return [e for e in events if e["type"] == kind]


# -- R3: two calls of one round with one id ----------------------------------------------------


@EVERY_PROVIDER
@pytest.mark.parametrize("eager", [False, True])
async def test_two_calls_with_one_id_run_the_first_once_and_the_run_goes_on(provider, eager):
    ran: list[str] = []
    async with ScriptedServer({"dup": twice_one_id()}, delay_scale=0) as server:
        events, run = await play(server, provider, [weather_tool(ran, eager=eager)], model="dup")
        statuses = [r.status for r in server.requests]
    last = events[-1]
    assert last["error"] is None
    assert last["rounds"] == 2
    assert statuses == [200, 200]  # the second request's history passed the API's checks
    if provider == "gemini":  # Gemini sends no ids: toollatch's own never repeat
        assert ran == ["Oslo", "Rome"]
        return
    assert ran == ["Oslo"]  # the second call never ran, eager or not
    # the call that ran reports its real outcome, the repeat its duplicate_call_id
    assert [(c["id"], c["state"], c["is_error"], c["error"]) for c in last["calls"]] == [
        ("call_0", "committed", False, None),
        ("call_0", "failed", True, "duplicate_call_id"),
    ]
    assert [(e["id"], e["is_error"]) for e in of(events, "tool_finished")] == [("call_0", False)]
    assert [e["error"] for e in of(events, "call_failed")] == ["duplicate_call_id"]
    kinds = [a.kind for a in run.rounds[0].anomalies]
    history = json.dumps(last["history"])
    assert "sunny in Oslo" in history
    if provider == "openai_responses":  # dropped with its result
        assert kinds[-1] is AnomalyKind.DUPLICATE_CALL_DROPPED
        assert history.count('"function_call"') == 1
        assert history.count('"function_call_output"') == 1
    else:  # renamed in the call and in its result
        assert kinds[-1] is AnomalyKind.CALL_ID_RENAMED
        assert "call_0_dup2" in run.rounds[0].anomalies[-1].detail
        assert history.count("call_0_dup2") == 2
        assert "duplicate_call_id: " in history


def _round(provider: str, events: list[Any]):
    parser = StreamParser(provider, tools=[ToolSpec(name="f", parameters={"type": "object"})])
    for event in events:
        parser.feed_event(event)
    return parser.finish()


BEDROCK_TWICE = [
    {
        "contentBlockStart": {
            "contentBlockIndex": 0,
            "start": {"toolUse": {"toolUseId": "t1", "name": "f"}},
        }
    },
    {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{}"}}}},
    {"contentBlockStop": {"contentBlockIndex": 0}},
    {
        "contentBlockStart": {
            "contentBlockIndex": 1,
            "start": {"toolUse": {"toolUseId": "t1", "name": "f"}},
        }
    },
    {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{}"}}}},
    {"contentBlockStop": {"contentBlockIndex": 1}},
    {"messageStop": {"stopReason": "tool_use"}},
]
GEMINI_TWICE = [
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"functionCall": {"id": "g1", "name": "f", "args": {}}},
                        {"functionCall": {"id": "g1", "name": "f", "args": {"x": 1}}},
                    ],
                },
                "finishReason": "STOP",
            }
        ]
    }
]


@pytest.mark.parametrize(
    ("provider", "events", "field"),
    [
        ("bedrock", BEDROCK_TWICE, "toolUseId"),
        ("gemini", GEMINI_TWICE, "id"),
    ],
)
def test_bedrock_and_gemini_histories_rename_a_repeated_id_in_the_call_and_its_result(
    provider, events, field
):
    round_ = _round(provider, events)
    assert [c.error for c in round_.calls] == [None, ErrorCode.DUPLICATE_CALL_ID]
    ran = ToolResult(tool_call_id=round_.calls[0].call_id, name="f", content="ran")
    # results in any order: the duplicate_call_id one answers the repeat
    entries = [
        *assistant_messages(round_),
        *tool_results_messages(round_, [*error_results(round_), ran]),
    ]
    text = json.dumps(entries)
    first, again = round_.calls[0].call_id, f"{round_.calls[0].call_id}_dup2"
    assert text.count(f'"{field}": "{again}"') == 2
    assert text.count(f'"{field}": "{first}"') == 2
    results = entries[-1].get("content") or entries[-1]["parts"]
    assert "ran" in json.dumps(results[0])
    assert "duplicate_call_id" in json.dumps(results[1])


def test_the_derived_id_stays_within_40_characters_and_unique():
    long = "call_" + "x" * 60
    assert len(derived_id(long, {long})) == 40
    assert derived_id("a", {"a", "a_dup2"}) == "a_dup3"


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
def test_run_json_with_a_repeated_id_exits_0_with_the_real_result(provider, tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(
        textwrap.dedent('''
        import toollatch

        @toollatch.tool
        def get_weather(city: str) -> str:
            """Weather."""
            return "sunny in " + city
    ''')
    )
    with ScriptedServer({"dup": twice_one_id()}, delay_scale=0) as server:
        url = server.base_url(provider)
        command = [sys.executable, "-m", "toollatch.cli", "run", "--provider", provider,
                   "--base-url", url, "--model", "dup", "--tools", str(tools)]  # fmt: skip
        ran: dict[str, Any] = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120}
        done = subprocess.run([*command, "--json"], check=False, **ran)
        shown = subprocess.run(command, check=False, **ran)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["id"], e["error"]) for e in of(events, "tool_finished")] == [("call_0", None)]
    calls = events[-1]["calls"]
    assert [(c["is_error"], c["error"]) for c in calls] == [
        (False, None),
        (True, "duplicate_call_id"),
    ]
    # the terminal view: the call that ran shows done, the repeat its failure
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert " done " in next(line for line in lines if line.startswith("call_0  "))
    assert "failed: dup" in next(line for line in lines if line.startswith("call_0 (rep"))


# -- R4: results that are not valid Unicode ----------------------------------------------------


def test_valid_unicode_replaces_lone_surrogates_and_joins_pairs():
    assert valid_unicode(NOT_UTF8) == ("report-\ufffd.txt", 1)
    assert valid_unicode("\ud83d\ude00 \udc80") == ("\U0001f600 \ufffd", 1)
    text = "déjà vu \ufffd"
    assert valid_unicode(text)[0] is text


def test_a_shaped_result_is_valid_utf8_says_so_and_keeps_the_note_when_cut():
    shaper = ResultShaper(None, None)
    long = NOT_UTF8 * 100
    result = shaper.tool_result(ToolResult(tool_call_id="c", name="t", content=long), 300)
    result.content.encode("utf-8")  # no surrogate left
    assert len(result.content.encode()) <= 300
    assert result.truncated_from is not None
    assert result.content.endswith("replaced with U+FFFD]")
    assert "100 character(s) that were not valid Unicode" in result.content


def listing_tools():
    @tool
    def list_files() -> str:
        """A directory listing with a name that is not UTF-8."""
        return "\n".join(["a.txt", NOT_UTF8])

    @tool
    def stat_files() -> dict:
        """Nested values and keys that are not UTF-8."""
        return {"files": [{"name": NOT_UTF8}], NOT_UTF8: 1}

    @tool
    def open_file() -> str:
        """Raises with a message that is not UTF-8."""
        raise ValueError(f"cannot open {NOT_UTF8}")

    return [list_files, stat_files, open_file]


LISTING = Script(
    turns=(
        Turn(
            items=(
                Call(call_id="c1", name="list_files", arguments="{}"),
                Call(call_id="c2", name="stat_files", arguments="{}"),
                Call(call_id="c3", name="open_file", arguments="{}"),
            ),
            delay_ms=0,
        ),
    )
)


@EVERY_PROVIDER
async def test_results_that_are_not_utf8_are_made_valid_and_the_run_goes_on(provider):
    async with ScriptedServer({"ls": LISTING}, delay_scale=0) as server:
        events, _ = await play(server, provider, listing_tools(), model="ls")
        statuses = [r.status for r in server.requests]
    last = events[-1]
    assert last["error"] is None
    assert last["rounds"] == 2
    assert statuses == [200, 200]
    assert [(c["is_error"], c["error"]) for c in last["calls"]] == [
        (False, None),
        (False, None),
        (True, "tool_error"),
    ]
    history = json.dumps(last["history"], ensure_ascii=False)
    history.encode("utf-8")
    assert history.count("report-\ufffd.txt") == 4  # one in list_files, two in stat, one raise
    assert history.count("were replaced with U+FFFD") == 3


def test_run_json_with_a_tool_returning_a_lone_surrogate_exits_0(tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(
        textwrap.dedent('''
        import toollatch

        @toollatch.tool
        def get_weather(city: str, unit: str = "c") -> str:
            """A listing of a folder whose name is not UTF-8."""
            return b"weather-\\xff".decode("utf-8", "surrogateescape")

        @toollatch.tool
        def write_file(path: str, content: str) -> str:
            """Pretend to write."""
            return {"written": [b"\\xfe".decode("utf-8", "surrogateescape")]}
    ''')
    )
    for json_mode in (["--json"], []):
        done = subprocess.run(
            [sys.executable, "-m", "toollatch.cli", "run", *json_mode, "--tools", str(tools)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    events = [
        json.loads(line)
        for line in subprocess.run(
            [sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", str(tools)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.splitlines()
    ]
    assert [c["is_error"] for c in events[-1]["calls"]] == [False, False, False]
    assert "weather-\ufffd" in json.dumps(events[-1]["history"], ensure_ascii=False)


# -- R9: call ids reused by another conversation -----------------------------------------------


def whoami_tool(ran: list[str]):
    @tool
    def whoami(user: str) -> str:
        """Who is asking."""
        ran.append(user)
        return f"run {len(ran)} for {user}"

    return whoami


def asks(user: str) -> Script:
    return Script(
        turns=(
            Turn(
                items=(
                    Call(call_id="call_0", name="whoami", arguments=json.dumps({"user": user})),
                ),
                delay_ms=0,
            ),
        )
    )


@EVERY_PROVIDER
async def test_two_runs_of_one_agent_with_their_own_histories_run_call_0_each(provider):
    ran: list[str] = []
    async with ScriptedServer({"alice": asks("alice")}, delay_scale=0) as server:
        url = server.base_url(provider)
        async with model_client(provider, model="alice", base_url=url) as client:
            agent = Agent(client, [whoami_tool(ran)], run_limits=RunLimits(max_rounds=2))
            one = agent.run("hi")
            first = [e.to_json() async for e in one]
            two = agent.run("hi")
            second = [e.to_json() async for e in two]
    assert one.conversation != two.conversation
    assert ran == ["alice", "alice"]  # a new conversation: its call_0 is a new call
    assert "run 1 for alice" in json.dumps(first[-1]["history"])
    assert "run 2 for alice" in json.dumps(second[-1]["history"])
    assert "run 1" not in json.dumps(second[-1]["history"])


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
async def test_two_agents_on_one_ledger_whose_models_reuse_call_0_each_run_their_own(
    provider, backend, tmp_path
):
    ran: list[str] = []
    ledger = MemoryLedger() if backend == "memory" else SQLiteLedger(tmp_path / "l.db")
    scripts = {"alice": asks("alice"), "bob": asks("bob")}
    async with ScriptedServer(scripts, delay_scale=0) as server:
        url = server.base_url(provider)
        runs = []
        for user in ("alice", "bob"):
            async with model_client(provider, model=user, base_url=url) as client:
                agent = Agent(
                    client, [whoami_tool(ran)], ledger=ledger, run_limits=RunLimits(max_rounds=2)
                )
                run = agent.run("hi")
                runs.append([e.to_json() async for e in run])
    await ledger.aclose()
    assert ran == ["alice", "bob"]
    assert [c["error"] for r in runs for c in r[-1]["calls"]] == [None, None]
    assert "run 1 for alice" in json.dumps(runs[0][-1]["history"])
    assert "run 2 for bob" in json.dumps(runs[1][-1]["history"])


async def test_the_ledger_key_names_the_conversation_and_a_named_one_is_kept():
    ledger = MemoryLedger()
    ran: list[str] = []
    async with ScriptedServer({"alice": asks("alice")}, delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="alice", base_url=url) as client:
            agent = Agent(
                client, [whoami_tool(ran)], ledger=ledger, run_limits=RunLimits(max_rounds=2)
            )
            for _ in range(2):  # the same named conversation twice: a replay, run once
                run = agent.run("hi", conversation="chat-7")
                [e async for e in run]
            fresh = agent.run("hi")
            [e async for e in fresh]
    assert ran == ["alice", "alice"]
    record = await ledger.get(LedgerKey(scope="chat-7", call_id="call_0"))
    assert record is not None
    assert record.result is not None
    assert record.result.content == "run 1 for alice"
    other = await ledger.get(LedgerKey(scope=fresh.conversation, call_id="call_0"))
    assert other is not None
    assert other.result is not None
    assert other.result.content == "run 2 for alice"


# -- N2: every result has its tool_finished ----------------------------------------------------


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "openai_responses"])
async def test_a_resumed_call_answered_outcome_unknown_emits_tool_finished(provider):
    # As after a SIGKILL mid-tool: the ledger holds a stale "started" record of call_0 in the
    # stored run; the resumed run's model sends call_0 again, and the ledger answers it.
    ran: list[str] = []
    ledger, store = MemoryLedger(), MemoryHistory()
    key = LedgerKey(scope="r1", call_id="call_0")
    digest = digest_of("whoami", {"user": "alice"})
    await ledger.claim(key, digest=digest, worker="dead", now=0.0, lease_s=1)
    await ledger.start(key, 1, now=0.0, lease_s=1)
    async with ScriptedServer({"alice": asks("alice")}, delay_scale=0) as server:
        url = server.base_url(provider)
        async with model_client(provider, model="alice", base_url=url) as client:
            await store.append("r1", [user_message(provider, "hi")], at=0)
            agent = Agent(
                client,
                [whoami_tool(ran)],
                ledger=ledger,
                history_store=store,
                session="r1",
                run_limits=RunLimits(max_rounds=2),
            )
            events = [e.to_json() async for e in agent.run(resume=True)]
    assert ran == []  # never run again: its outcome is unknown
    finished = [(e["id"], e["is_error"], e["error"]) for e in of(events, "tool_finished")]
    assert finished == [("call_0", True, "outcome_unknown")]
    assert [c["error"] for c in events[-1]["calls"]] == ["outcome_unknown"]
    assert not of(events, "tool_started")  # it did not start here


async def test_every_committed_call_has_one_tool_finished_whether_or_not_it_ran():
    events: list[Any] = []

    @tool
    def f(v: int) -> str:
        """Echo."""
        return str(v)

    d = Dispatcher([f], on_event=events.append)
    first = chat_round(d.specs, [("a", "f", {"v": 1}), ("b", "nope", {})])
    await d.run(first, session="s")
    replay = chat_round(d.specs, [("a", "f", {"v": 1}), ("a2", "f", {"v": 2})])
    await d.run(replay, session="s")
    assert [(e.type, e.id, getattr(e, "error", None)) for e in events] == [
        ("tool_started", "a", None),
        ("tool_finished", "a", None),
        ("tool_finished", "a", None),  # answered from memory, not run again
        ("tool_started", "a2", None),
        ("tool_finished", "a2", None),
    ]


def test_drop_with_protocol_repair_drops_a_repeat_and_keeps_the_real_result():
    round_ = _round("bedrock", BEDROCK_TWICE)
    ran = ToolResult(tool_call_id="t1", name="f", content="ran")
    entries = repaired_history(round_, [ran, *error_results(round_)], {ErrorCode.DUPLICATE_CALL_ID})
    uses = [b["toolUse"]["toolUseId"] for b in entries[0]["content"]]
    results = [b["toolResult"] for b in entries[1]["content"]]
    assert uses == ["t1"]
    assert [(r["toolUseId"], r["content"], r["status"]) for r in results] == [
        ("t1", [{"text": "ran"}], "success")
    ]
