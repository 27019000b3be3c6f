"""Human approvals and client tools in the runtime: a committed call waits for its answer
(approve, deny, a client's result, expiry), the round's other calls run meanwhile, results
go back in call order, and every wrong answer is refused with a typed error. Over the
scripted model server on loopback (the default demo: two get_weather calls, then one
write_file call, then text)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger_helpers import chat_round
from toollatch import (
    Agent,
    AgentRun,
    ApprovalPolicy,
    ConfigError,
    Deny,
    ErrorCode,
    Limits,
    model_client,
    schema_tool,
    tool,
)
from toollatch.core._gate import Gate
from toollatch.ledger import (
    AlreadyAnswered,
    EditRejected,
    LedgerError,
    NotAsked,
    OtherSession,
    Question,
    QuestionStore,
    StaleArguments,
    WrongKind,
    approval_token,
    verify_approval_token,
)
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._records import LedgerKey, digest_of
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.runtime import ApprovalContext, Dispatcher, Metrics, Tracing
from toollatch.scripted import ScriptedServer


def demo_tools(ran: list[str], **write_options: Any) -> list[Any]:
    @tool(eager=True)
    def get_weather(city: str, unit: str = "c") -> str:
        """Weather."""
        ran.append(city)
        return "21 degrees"

    @tool(**write_options)
    def write_file(path: str, content: str) -> str:
        """Pretend to write."""
        ran.append(path)
        return "written"

    return [get_weather, write_file]


async def answered_run(
    tools: list[Any], answer: Any, *, approvals: ApprovalPolicy | None = None
) -> tuple[list[dict[str, Any]], AgentRun]:
    """Run the demo; ``answer(run, event)`` is awaited for each question event."""
    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            run = Agent(client, tools, approvals=approvals).run("weather?")
            events = []
            async for event in run:
                events.append(event.to_json())
                if event.type == "approval_requested":
                    await answer(run, event)
        assert all(r.status == 200 for r in server.requests)  # every history was valid
    return events, run


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if e["type"] not in ("text", "call_opened")]


async def test_an_approved_call_runs_once_with_its_committed_arguments():
    ran: list[str] = []

    async def approve(run: AgentRun, event: Any) -> None:
        assert run.pending == [event.id]
        await run.approve(event.id, args_sha256=event.args_sha256)

    events, run = await answered_run(demo_tools(ran, needs_approval=True), approve)
    asked = [e for e in events if e["type"] == "approval_requested"]
    assert len(asked) == 1
    assert asked[0]["name"] == "write_file"
    assert asked[0]["arguments"] == {
        "path": "notes/weather.md",
        "content": asked[0]["arguments"]["content"],
    }
    assert asked[0]["args_sha256"] == digest_of("write_file", asked[0]["arguments"])
    assert ran == ["Oslo", "Zürich", "notes/weather.md"]
    # the question comes after the commit, the run only after the answer
    order = types(events)
    i = order.index("approval_requested")
    assert order[i - 1] == "call_committed"
    assert order[i + 1 : i + 4] == ["approval_answered", "tool_started", "tool_finished"]
    answered = next(e for e in events if e["type"] == "approval_answered")
    assert answered["decision"] == "approved" and answered["waited_s"] >= 0
    assert events[-1]["error"] is None
    assert run.pending == []


async def test_a_denied_call_gets_a_paired_error_and_the_model_goes_on():
    ran: list[str] = []

    async def deny(run: AgentRun, event: Any) -> None:
        await run.deny(event.id, "not today")

    events, _ = await answered_run(demo_tools(ran, needs_approval=True), deny)
    assert ran == ["Oslo", "Zürich"]  # write_file never ran
    finished = [e for e in events if e["type"] == "tool_finished" and e["name"] == "write_file"]
    assert [(f["error"], f["is_error"]) for f in finished] == [("approval_denied", True)]
    assert "not today" in finished[0]["result"]
    last = events[-1]
    assert last["rounds"] == 3  # the model read the denial and answered again
    write = [c for c in last["calls"] if c["name"] == "write_file"]
    assert write[0]["error"] == "approval_denied"
    # the history pairs the call with its error result
    results = [m for m in last["history"] if m.get("role") == "tool"]
    assert any("approval_denied" in m["content"] and "not today" in m["content"] for m in results)


async def test_needs_approval_may_decide_on_the_committed_arguments():
    ran: list[str] = []
    seen: list[tuple[str, str]] = []

    def only_oslo(args: Any, context: Any) -> bool:
        seen.append((context.name, args["city"]))
        return args["city"] == "Oslo"

    @tool(needs_approval=only_oslo)
    def get_weather(city: str, unit: str = "c") -> str:
        """Weather."""
        ran.append(city)
        return "21 degrees"

    asked: list[str] = []

    async def approve(run: AgentRun, event: Any) -> None:
        asked.append(event.arguments["city"])
        # the round's other call (Zürich) runs while this one waits (were it held back
        # behind the question, this would time out)
        async with asyncio.timeout(30):
            while ran != ["Zürich"]:
                await asyncio.sleep(0.01)
        await run.approve(event.id, args_sha256=event.args_sha256)

    write = demo_tools(ran)[1]
    events, _ = await answered_run([get_weather, write], approve)
    assert asked == ["Oslo"]
    assert sorted(seen) == [("get_weather", "Oslo"), ("get_weather", "Zürich")]
    assert ran == ["Zürich", "Oslo", "notes/weather.md"]
    # results still go back in call order: Oslo's first
    history = events[-1]["history"]
    calls = next(m for m in history if m.get("tool_calls"))["tool_calls"]
    results = [m["tool_call_id"] for m in history if m.get("role") == "tool"][:2]
    assert results == [c["id"] for c in calls]


async def test_a_policy_names_tools_without_code_and_ask_covers_every_tool():
    ran: list[str] = []
    names: list[str] = []

    async def approve(run: AgentRun, event: Any) -> None:
        names.append(event.name)
        await run.approve(event.id, args_sha256=event.args_sha256)

    policy = ApprovalPolicy(tools=["write_file"])
    await answered_run(demo_tools(ran), approve, approvals=policy)
    assert names == ["write_file"]
    names.clear()
    await answered_run(demo_tools(ran), approve, approvals=ApprovalPolicy(default="ask"))
    assert sorted(names) == ["get_weather", "get_weather", "write_file"]
    with pytest.raises(ConfigError):
        ApprovalPolicy(default="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ApprovalPolicy(timeout_s=0)
    with pytest.raises(ConfigError):
        tool(needs_approval="yes")(lambda: None)  # type: ignore[call-overload]


async def test_always_allow_is_sticky_for_the_session_and_revocable():
    ran: list[str] = []
    tools = demo_tools(ran, needs_approval=True)
    dispatcher = Dispatcher(tools)
    specs = dispatcher.specs
    asked: list[tuple[str, str]] = []

    async def play(session: str, call_id: str, *, always: bool = False) -> None:
        args = {"path": call_id, "content": "x"}
        round_ = chat_round(specs, [(call_id, "write_file", args)])

        def on_event(event: Any) -> None:
            if event.type == "approval_requested":
                asked.append((session, call_id))
                answer = dispatcher.approve(
                    session, call_id, args_sha256=event.args_sha256, always=always
                )
                asyncio.get_running_loop().create_task(answer)

        async with dispatcher.round(session, on_event=on_event) as r:
            results = await r.finish(round_)
        assert [x.is_error for x in results] == [False]

    await play("s1", "c1", always=True)
    await play("s1", "c2")  # not asked: "always" for write_file in s1
    await play("s2", "c3")  # another session is asked
    assert await dispatcher.revoke("s1", "write_file")
    await play("s1", "c4")  # asked again
    assert asked == [("s1", "c1"), ("s2", "c3"), ("s1", "c4")]
    assert ran == ["c1", "c2", "c3", "c4"]


async def test_a_client_tool_waits_for_the_result_the_client_submits():
    ran: list[str] = []
    write = schema_tool(
        "write_file",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    )
    assert write.client
    got: list[dict[str, Any]] = []

    async def submit(run: AgentRun, event: Any) -> None:
        raise AssertionError("a client call is not an approval")

    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            run = Agent(client, [demo_tools(ran)[0], write]).run("weather?")
            async for event in run:
                got.append(event.to_json())
                if event.type == "approval_requested":
                    assert event.kind == "client"
                    with pytest.raises(WrongKind):
                        await run.approve(event.id, args_sha256=event.args_sha256)
                    await run.submit_result(event.id, {"saved": event.arguments["path"]})
    assert "client_call" in types(got)
    finished = next(e for e in got if e["type"] == "tool_finished" and e["name"] == "write_file")
    assert finished["result"] == '{"saved":"notes/weather.md"}' and not finished["is_error"]
    assert ran == ["Oslo", "Zürich"]


async def test_wrong_answers_are_refused_with_typed_errors():
    ran: list[str] = []
    refused: list[str] = []

    async def misuse(run: AgentRun, event: Any) -> None:
        with pytest.raises(NotAsked):
            await run.approve("call_nope", args_sha256=event.args_sha256)
        with pytest.raises(StaleArguments):
            await run.approve(event.id, args_sha256=digest_of("write_file", {"path": "/etc"}))
        with pytest.raises(WrongKind):
            await run.submit_result(event.id, "forged")  # write_file runs on the server
        await run.approve(event.id, args_sha256=event.args_sha256)
        with pytest.raises(AlreadyAnswered):
            await run.approve(event.id, args_sha256=event.args_sha256)
        with pytest.raises(AlreadyAnswered):
            await run.deny(event.id, "too late")
        refused.append(event.id)

    events, _ = await answered_run(demo_tools(ran, needs_approval=True), misuse)
    assert refused and ran == ["Oslo", "Zürich", "notes/weather.md"]
    assert events[-1]["error"] is None


async def test_an_answer_from_another_session_is_refused():
    ran: list[str] = []
    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            agent = Agent(client, demo_tools(ran, needs_approval=True))
            mine, theirs = agent.run("weather?"), agent.run("weather?")
            async for event in mine:
                if event.type == "approval_requested":
                    with pytest.raises(OtherSession):
                        await theirs.approve(event.id, args_sha256=event.args_sha256)
                    await mine.deny(event.id, "no")
    assert ran == ["Oslo", "Zürich"]


async def test_an_unanswered_call_expires_by_the_injected_clock():
    ticks = iter([1000.0, 5000.0, 5000.0, 5000.0, 5000.0])
    ran: list[str] = []
    tools = demo_tools(ran, needs_approval=True)
    dispatcher = Dispatcher(
        tools, approvals=ApprovalPolicy(timeout_s=60), clock=lambda: next(ticks)
    )
    metrics = Metrics()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            agent = Agent(client, tools, observers=[metrics, Tracing(provider)])
            agent.dispatcher = dispatcher  # the one with the test's clock
            agent._tools._dispatcher = dispatcher
            events = [e.to_json() async for e in agent.run("weather?")]
    seen = [e for e in events if e["type"] in ("approval_requested", "approval_answered")]
    assert [e["type"] for e in seen] == ["approval_requested", "approval_answered"]
    assert seen[0]["expires_at"] == 1060.0
    assert seen[1]["decision"] == "expired" and seen[1]["waited_s"] == 4000.0
    finished = [e for e in events if e["type"] == "tool_finished" and e["name"] == "write_file"]
    assert finished[0]["error"] == "approval_expired"
    assert ran == ["Oslo", "Zürich"]
    history = events[-1]["history"]  # every call id paired with one result
    ids = [c["id"] for m in history for c in m.get("tool_calls", [])]
    assert sorted(ids) == sorted(m["tool_call_id"] for m in history if m.get("role") == "tool")
    # how long it waited for a person: the metric and the call's span
    text = metrics.exposition().decode()
    assert (
        'tool_approval_wait_seconds_sum{decision="expired",provider="openai_chat"} 4000.0' in text
    )
    calls = [s for s in exporter.get_finished_spans() if s.name == "toollatch.tool_call"]
    waited = [s.attributes for s in calls if "toollatch.approval.waited_s" in s.attributes]
    assert [(a["toollatch.tool"], a["toollatch.approval.waited_s"]) for a in waited] == [
        ("write_file", 4000.0)
    ]
    assert waited[0]["toollatch.approval.decision"] == "expired"


async def test_a_run_cancelled_while_waiting_pairs_the_call():
    ran: list[str] = []

    async def cancel(run: AgentRun, event: Any) -> None:
        run.cancel()

    events, _ = await answered_run(demo_tools(ran, needs_approval=True), cancel)
    finished = [e for e in events if e["type"] == "tool_finished" and e["name"] == "write_file"]
    assert [f["error"] for f in finished] == ["cancelled"]
    assert "waited for its answer" in finished[0]["result"]  # it was awaiting, not running
    history = events[-1]["history"]
    ids = [c["id"] for m in history for c in m.get("tool_calls", [])]
    assert sorted(ids) == sorted(m["tool_call_id"] for m in history if m.get("role") == "tool")
    assert ran == ["Oslo", "Zürich"]


# -- the stores ------------------------------------------------------------------------------


# (the ``store`` fixture, each built-in ledger in turn, is in conftest.py)


async def test_every_store_keeps_questions_and_takes_one_answer(store: Any):
    assert isinstance(store, QuestionStore)
    key = LedgerKey(scope="s1", call_id="c1")
    digest = digest_of("write_file", {"path": "a"})
    asked = Question(
        key=key, kind="approval", name="write_file", digest=digest, asked_at=1.0, expires_at=61.0
    )
    assert await store.ask(asked) == asked
    again = Question(
        key=key, kind="approval", name="write_file", digest=digest, asked_at=9.0, expires_at=69.0
    )
    assert await store.ask(again) == asked  # asked before: the first question stands
    with pytest.raises(StaleArguments):
        await store.ask(Question(**{**_fields(asked), "digest": digest_of("write_file", {})}))
    with pytest.raises(StaleArguments):
        await store.answer(key, digest="0" * 64, decision="approved", now=2.0)
    with pytest.raises(NotAsked):
        await store.answer(
            LedgerKey(scope="s2", call_id="c1"), digest=digest, decision="approved", now=2.0
        )
    done = await store.answer(key, digest=digest, decision="denied", now=3.0, reason="no")
    assert (done.decision, done.reason, done.answered_at) == ("denied", "no", 3.0)
    with pytest.raises(AlreadyAnswered):
        await store.answer(key, digest=digest, decision="approved", now=4.0)
    assert await store.question(key) == done
    assert await store.questions("s1") == [done]
    assert await store.questions("s2") == []


async def test_every_store_lists_the_pending_questions_of_every_scope(store: Any):
    """What a restarted relay reads to find the runs to resume: oldest first, bounded, the
    answered ones left out, scopes with odd characters intact."""
    digest = digest_of("write_file", {"path": "a"})
    scopes = ["s1", "relay-ab/c d{x}", "chat-9-x/branch"]
    for n, scope in enumerate(scopes):
        for call_id in ("c1", "c2"):
            key = LedgerKey(scope=scope, call_id=call_id)
            await store.ask(
                Question(key=key, kind="approval", name="write_file", digest=digest,
                         asked_at=float(10 * n + int(call_id[1])), expires_at=None)
            )  # fmt: skip
    await store.answer(LedgerKey(scope="s1", call_id="c2"), digest=digest, decision="denied", now=5)
    found = await store.pending_questions(100)
    keys = [(q.key.scope, q.key.call_id) for q in found]
    assert keys == [("s1", "c1"), *((s, c) for s in scopes[1:] for c in ("c1", "c2"))]
    assert all(q.pending for q in found)
    assert [q.key.call_id for q in await store.pending_questions(2)] == ["c1", "c1"]


def _fields(q: Question) -> dict[str, Any]:
    return {f: getattr(q, f) for f in Question.__dataclass_fields__}


async def test_concurrent_answers_one_wins(store: Any):
    key = LedgerKey(scope="s", call_id="c")
    digest = digest_of("t", {})
    await store.ask(
        Question(key=key, kind="approval", name="t", digest=digest, asked_at=0, expires_at=None)
    )
    tries = [
        store.answer(key, digest=digest, decision=d, now=1.0) for d in ("approved", "denied") * 5
    ]
    outcomes = await asyncio.gather(*tries, return_exceptions=True)
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert all(isinstance(o, AlreadyAnswered) for o in outcomes if isinstance(o, BaseException))


def test_signed_approval_tokens_bind_name_id_and_arguments():
    secret = b"s" * 32
    digest = digest_of("write_file", {"path": "a"})
    token = approval_token(secret, "write_file", "call_1", digest)
    assert verify_approval_token(secret, token, "write_file", "call_1", digest)
    assert not verify_approval_token(secret, token, "write_file", "call_2", digest)
    assert not verify_approval_token(secret, token, "delete_file", "call_1", digest)
    other = digest_of("write_file", {"path": "b"})
    assert not verify_approval_token(secret, token, "write_file", "call_1", other)
    assert not verify_approval_token(b"t" * 32, token, "write_file", "call_1", digest)
    assert not verify_approval_token(secret, token[:-1] + "0", "write_file", "call_1", digest)
    with pytest.raises(Exception, match="16 bytes"):
        approval_token(b"short", "write_file", "call_1", digest)
    assert ErrorCode.APPROVAL_DENIED == "approval_denied"


async def test_an_approval_with_edits_passes_the_gate_again_and_the_model_is_told():
    ran: list[str] = []

    def no_etc(name: str, arguments: Any) -> Any:
        return Deny("not under /etc") if str(arguments.get("path", "")).startswith("/etc") else None

    rejected: list[str] = []

    async def edit(run: AgentRun, event: Any) -> None:
        sha = event.args_sha256
        for bad, code in (
            ({"path": 3, "content": "x"}, "schema_violation"),
            ({"path": "/etc/passwd", "content": "x"}, "policy_denied"),
            ('{"path": "a", "path": "b", "content": "x"}', "invalid_json"),
            ({"path": "a", "content": "x" * 300}, "arguments_exceed_max_bytes"),
        ):
            with pytest.raises(EditRejected) as caught:
                await run.approve(event.id, args_sha256=sha, args=bad)
            rejected.append(caught.value.code)
            assert caught.value.code == code
        assert run.pending == [event.id]  # still waiting after every refused edit
        await run.approve(event.id, args_sha256=sha, args={"path": "notes/x.md", "content": "x"})

    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            agent = Agent(
                client,
                demo_tools(ran, needs_approval=True),
                policy=no_etc,
                limits=Limits(max_argument_bytes=200),
            )
            run = agent.run("weather?")
            events = []
            async for event in run:
                events.append(event.to_json())
                if event.type == "approval_requested":
                    await edit(run, event)
    assert len(rejected) == 4
    assert ran == ["Oslo", "Zürich", "notes/x.md"]  # it ran with the edited arguments
    answered = next(e for e in events if e["type"] == "approval_answered")
    assert answered["edited"] is True
    history = events[-1]["history"]
    result = next(
        m["content"] for m in history if m.get("role") == "tool" and "edited" in m["content"]
    )
    assert '"path":"notes/x.md"' in result and result.endswith("written")


async def test_an_answer_given_while_no_process_waits_is_found_by_the_next_round(tmp_path):
    """A question asked before a crash, answered in the ledger meanwhile (as a restarted
    relay would), is not asked again: the round that meets the call uses the answer."""
    ran: list[str] = []
    tools = demo_tools(ran, needs_approval=True)
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    try:
        args = {"path": "a.md", "content": "x"}
        digest = digest_of("write_file", args)
        for call_id, answer in (("c1", "approve"), ("c2", "deny")):
            key = LedgerKey(scope="s1", call_id=call_id)
            await ledger.ask(
                Question(
                    key=key, kind="approval", name="write_file", digest=digest, asked_at=1.0,
                    expires_at=None,
                )
            )  # fmt: skip
            dispatcher = Dispatcher(tools, ledger=ledger)  # a new process
            assert (await dispatcher.questions("s1"))[-1].pending  # it lists what was left
            if answer == "approve":
                await dispatcher.approve("s1", call_id, args_sha256=digest)
            else:
                await dispatcher.deny("s1", call_id, "no")
            events: list[Any] = []
            round_ = chat_round(dispatcher.specs, [(call_id, "write_file", args)])
            async with dispatcher.round("s1", on_event=events.append) as r:
                (result,) = await r.finish(round_)
            assert "approval_requested" not in [e.type for e in events]
            answered = [e.decision for e in events if e.type == "approval_answered"]
            assert answered == (["approved"] if answer == "approve" else ["denied"])
            assert result.is_error is (answer == "deny")
        assert ran == ["a.md"]  # the approved one ran, once; the denied one never
        assert [q.decision for q in await ledger.questions("s1")] == ["approved", "denied"]
    finally:
        await ledger.aclose()


class _AnswersFail(MemoryLedger):
    """A ledger that keeps questions but cannot write an answer (the backend went down)."""

    async def answer(self, key: LedgerKey, **kwargs: Any) -> Question:
        raise LedgerError("down")


async def test_a_cancel_while_waiting_stays_a_cancel_when_the_store_fails():
    ran: list[str] = []

    async def cancel(run: AgentRun, event: Any) -> None:
        run.cancel()

    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            agent = Agent(client, demo_tools(ran, needs_approval=True), ledger=_AnswersFail())
            run = agent.run("weather?")
            events = []
            async for event in run:
                events.append(event.to_json())
                if event.type == "approval_requested":
                    await cancel(run, event)
    finished = [e for e in events if e["type"] == "tool_finished" and e["name"] == "write_file"]
    assert [f["error"] for f in finished] == ["cancelled"]
    assert events[-1]["type"] == "run_ended"


async def test_sqlite_purge_drops_answered_questions_and_keeps_pending_ones(tmp_path):
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    try:
        digest = digest_of("t", {})
        for call_id in ("old", "pending"):
            key = LedgerKey(scope="s", call_id=call_id)
            asked = Question(
                key=key, kind="approval", name="t", digest=digest, asked_at=1.0, expires_at=None
            )
            await ledger.ask(asked)
        old = LedgerKey(scope="s", call_id="old")
        await ledger.answer(old, digest=digest, decision="denied", now=5.0)
        await ledger.purge(finished_before=10.0)
        assert [q.key.call_id for q in await ledger.questions("s")] == ["pending"]
    finally:
        await ledger.aclose()


def test_a_needs_approval_function_that_raises_asks():
    def broken(args: Any, context: Any) -> bool:
        raise RuntimeError("bug")

    @tool(needs_approval=broken)
    def write_file(path: str) -> str:
        """Write."""
        return "ok"

    context = ApprovalContext(session="s", call_id="c", name="write_file")
    assert write_file.asks({"path": "a"}, context)  # a doubt asks
    assert not demo_tools([])[1].asks({"path": "a"}, context)


async def test_an_answer_another_process_writes_reaches_the_waiting_call(tmp_path):
    """Two dispatchers on one SQLite ledger (two workers of a server): the call waits in
    one, the person's answer arrives at the other; the waiting one reads it and runs."""
    ran: list[str] = []
    here = SQLiteLedger(tmp_path / "ledger.db")
    there = SQLiteLedger(tmp_path / "ledger.db")
    try:
        waiting = Dispatcher(demo_tools(ran, needs_approval=True), ledger=here)
        waiting._state.approvals.poll_s = 0.05  # (1 s by default)
        other = Dispatcher(demo_tools(ran, needs_approval=True), ledger=there)
        args = {"path": "a.md", "content": "x"}
        round_ = chat_round(waiting.specs, [("c1", "write_file", args)])
        asked = asyncio.Event()

        async def answer_elsewhere() -> None:
            await asyncio.wait_for(asked.wait(), 30)
            with pytest.raises(NotAsked):
                await other.approve("s2", "c1", args_sha256=digest_of("write_file", args))
            await other.approve("s1", "c1", args_sha256=digest_of("write_file", args))

        def on_event(event: Any) -> None:
            if event.type == "approval_requested":
                asked.set()

        answering = asyncio.create_task(answer_elsewhere())
        async with waiting.round("s1", on_event=on_event) as r:
            async with asyncio.timeout(30):
                (result,) = await r.finish(round_)
        await answering
        assert not result.is_error and ran == ["a.md"]
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_wait_cancelled_with_keep_on_cancel_leaves_its_question_pending():
    """A durable run's question step cancelled because its worker stops: the question
    stays pending (a survivor waits for it again); ``close`` then answers it ``cancelled``
    (the run's own cancel), and a plain wait's cancel records ``cancelled`` itself."""
    dispatcher = Dispatcher(demo_tools([], needs_approval=True), ledger=MemoryLedger())
    approvals = dispatcher.approvals
    args = {"path": "a.md", "content": "x"}
    digest = digest_of("write_file", args)
    round_ = chat_round(dispatcher.specs, [("c1", "write_file", args), ("c2", "write_file", args)])
    gate = Gate(dispatcher.specs)
    for call, keep in ((round_.calls[0].committed, True), (round_.calls[1].committed, False)):
        assert call is not None
        asked = asyncio.Event()
        waiting = asyncio.create_task(
            approvals.wait(
                "s1", call, "approval", lambda _e, a=asked: a.set(), gate, keep_on_cancel=keep
            )
        )
        await asyncio.wait_for(asked.wait(), 30)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    kept = await approvals.store.question(LedgerKey(scope="s1", call_id="c1"))
    closed = await approvals.store.question(LedgerKey(scope="s1", call_id="c2"))
    assert kept is not None and kept.pending
    assert closed is not None and closed.decision == "cancelled"
    await approvals.close("s1", "c1", digest)
    kept = await approvals.store.question(LedgerKey(scope="s1", call_id="c1"))
    assert kept is not None and kept.decision == "cancelled"
    await approvals.close("s1", "c9", digest)  # (never asked: nothing to close, no error)
