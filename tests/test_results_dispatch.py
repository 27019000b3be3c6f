"""The dispatcher shapes every result before it is stored or emitted: budgets per dispatcher
and per tool, ``truncated_from`` on the result and the event, toollatch's own error results
within the budget but not redacted, and a failing redactor that fails closed."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from ledger_helpers import chat_round
from toollatch import ConfigError, PreviewPolicy, ResultLimits, ToolResult, schema_tool, tool
from toollatch.ledger import LedgerError, LedgerKey
from toollatch.ledger._base import MemoryLedger
from toollatch.relay import redact_secrets
from toollatch.runtime import Dispatcher

SECRET = "sk-live-0123456789abcdefXYZ"


def make_tools(ran: list[str]) -> list[Any]:
    @tool(max_result_bytes=300)
    def own(n: int) -> str:
        """Declares its own budget."""
        ran.append("own")
        return "ü" * n

    @tool
    def plain(n: int) -> str:
        """Uses the dispatcher's budget."""
        ran.append("plain")
        return "€" * n

    @tool
    def listed(n: int) -> list[str]:
        """Its budget is set in ResultLimits.tools; returns JSON."""
        ran.append("listed")
        return [f"item {i} 😀" for i in range(n)]

    @tool
    def leaky(n: int) -> dict[str, Any]:
        """Returns a secret."""
        ran.append("leaky")
        return {"user": "ana", "api_key": SECRET, "note": f"key {SECRET}", "n": n}

    @tool(timeout=0.05)
    async def slow(n: int) -> str:
        """Never finishes in time."""
        await asyncio.sleep(5)
        return "late"

    return [own, plain, listed, leaky, slow]


def size(text: str) -> int:
    return len(text.encode())


async def test_each_call_gets_its_budget_and_the_result_and_event_say_it_was_cut():
    ran: list[str] = []
    events: list[Any] = []
    d = Dispatcher(
        make_tools(ran),
        result_limits=ResultLimits(max_bytes=1000, tools={"listed": 500, "own": 400}),
        on_event=events.append,
    )
    specs = d.specs
    round_ = chat_round(
        specs,
        [("c1", "own", {"n": 1000}), ("c2", "plain", {"n": 1000}), ("c3", "listed", {"n": 200}),
         ("c4", "plain", {"n": 10})],
    )  # fmt: skip
    own, plain, listed, short = await d.run(round_, session="s")
    # ResultLimits.tools (400) wins over the tool's own 300; plain gets the default 1000
    assert size(own.content) <= 400 and own.truncated_from == 2000
    assert size(own.content) > 300
    assert size(plain.content) <= 1000 and plain.truncated_from == 3000
    assert size(listed.content) <= 500 and listed.content.startswith('["item 0 😀","item 1')
    assert listed.content.endswith(f"of {listed.truncated_from} bytes are shown]")
    assert short.content == "€" * 10 and short.truncated_from is None
    finished = {e.id: e for e in events if e.type == "tool_finished"}
    assert finished["c1"].truncated_from == 2000 and finished["c4"].truncated_from is None
    assert finished["c1"].to_json()["truncated_from"] == 2000
    assert "truncated_from" not in finished["c4"].to_json()  # the CLI's key set is unchanged


async def test_a_replayed_call_gets_the_shaped_result_without_running_or_redacting_again():
    ran: list[str] = []
    seen: list[str] = []

    def redactor(pointer: str, text: str) -> str:
        seen.append(text)
        return redact_secrets(pointer, text)

    d = Dispatcher(make_tools(ran), redaction=PreviewPolicy(redactor=redactor))
    round_ = chat_round(d.specs, [("c1", "leaky", {"n": 1})])
    first = (await d.run(round_, session="s"))[0]
    calls = len(seen)
    again = (await d.run(round_, session="s"))[0]
    assert again == first and ran == ["leaky"] and len(seen) == calls
    assert SECRET not in first.content and '"api_key":"[redacted]"' in first.content


async def test_the_ledger_stores_the_redacted_result():
    ledger = MemoryLedger()
    d = Dispatcher(make_tools([]), ledger=ledger, redaction=PreviewPolicy(redactor=redact_secrets))
    round_ = chat_round(d.specs, [("c1", "leaky", {"n": 1})])
    await d.run(round_, session="s")
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None and record.result is not None
    assert SECRET not in record.result.content and "[redacted]" in record.result.content


class DownLedger(MemoryLedger):
    """A ledger whose claims fail with a very long message."""

    async def claim(self, *args: Any, **kw: Any) -> Any:
        raise LedgerError("connection refused " + "x" * 50_000 + SECRET)


async def test_error_results_toollatch_makes_are_cut_to_the_budget_and_not_redacted():
    seen: list[str] = []

    def redactor(pointer: str, text: str) -> str:
        seen.append(text)
        return text

    policy = PreviewPolicy(redactor=redactor)
    limits = ResultLimits(max_bytes=512)
    d = Dispatcher(make_tools([]), result_limits=limits, redaction=policy, default_timeout_s=1)
    timed_out = (await d.run(chat_round(d.specs, [("c1", "slow", {"n": 1})]), session="s"))[0]
    assert str(timed_out.code) == "tool_timeout" and seen == []
    down = Dispatcher(make_tools([]), result_limits=limits, redaction=policy, ledger=DownLedger())
    failed = (await down.run(chat_round(d.specs, [("c2", "plain", {"n": 1})]), session="s"))[0]
    assert failed.is_error and failed.content.startswith("ledger_unavailable: the call ledger")
    assert size(failed.content) <= 512 and failed.truncated_from is not None
    assert seen == []  # toollatch's own text: no redactor call


async def test_a_redactor_that_raises_fails_closed_and_logs_no_secret(caplog):
    ran: list[str] = []

    def redactor(pointer: str, text: str) -> str:
        if SECRET in text:
            raise RuntimeError(f"refusing {text}")
        return text

    d = Dispatcher(make_tools(ran), redaction=PreviewPolicy(redactor=redactor))
    round_ = chat_round(d.specs, [("c1", "leaky", {"n": 1}), ("c2", "plain", {"n": 3})])
    with caplog.at_level(logging.DEBUG):
        leaky, plain = await d.run(round_, session="s")
    assert ran == ["leaky", "plain"]  # it ran: the result is withheld, not the effect undone
    assert leaky.is_error and str(leaky.code) == "tool_error" and SECRET not in leaky.content
    assert "withheld" in leaky.content and "RuntimeError" in leaky.content
    assert plain.content == "€€€" and not plain.is_error
    assert "withheld" in caplog.text and SECRET not in caplog.text


def test_bad_budgets_are_config_errors():
    with pytest.raises(ConfigError, match="max_result_bytes must be an integer >= 256"):

        @tool(max_result_bytes=100)
        def tiny() -> str:
            """Too small."""
            return ""

    with pytest.raises(ConfigError, match="result_limits must be a ResultLimits"):
        Dispatcher([], result_limits=4096)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="redaction must be a PreviewPolicy"):
        Dispatcher([], redaction=redact_secrets)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="the redactor must be callable"):
        Dispatcher([], redactor="mask")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        Dispatcher([], redactor=redact_secrets, redaction=PreviewPolicy(redactor=redact_secrets))


async def test_a_redactor_of_its_own_redacts_results_without_a_preview_policy():
    seen: list[str] = []

    def mask(pointer: str, text: str) -> str:
        seen.append(pointer)
        return text.replace(SECRET, "[redacted]")

    @tool
    def leak(n: int) -> dict[str, str]:
        """A JSON object with the secret as a key's value."""
        return {"token": SECRET, "n": str(n)}

    d = Dispatcher([leak], redactor=mask)
    [result] = await d.run(chat_round(d.specs, [("c1", "leak", {"n": 1})]), session="s")
    assert SECRET not in result.content
    assert "[redacted]" in result.content
    assert "/token" in seen  # the pointers the previews use


async def test_a_large_result_is_redacted_off_the_event_loop_and_still_cut():
    threads: dict[int, int] = {}  # text length -> the thread that redacted it

    def redactor(pointer: str, text: str) -> str:
        threads[len(text)] = threading.get_ident()
        return text.replace(SECRET, "[redacted]")

    @tool
    def dump(n: int) -> str:
        """A large text with a secret at its start."""
        return SECRET + " " + "z" * n

    d = Dispatcher([dump], redaction=PreviewPolicy(redactor=redactor))
    round_ = chat_round(d.specs, [("c1", "dump", {"n": 200_000}), ("c2", "dump", {"n": 10})])
    big, small = await d.run(round_, session="s")
    loop_thread = threading.get_ident()
    assert threads[200_000 + len(SECRET) + 1] != loop_thread
    assert threads[10 + len(SECRET) + 1] == loop_thread
    assert big.content.startswith("[redacted] zzz") and big.truncated_from == 200_011
    assert SECRET not in big.content + small.content


async def test_a_tool_exception_quoting_a_secret_is_redacted_like_any_result():
    @tool
    def fails(n: int) -> str:
        """Raises with the secret in its message."""
        raise ValueError(f"login refused for key {SECRET}")

    def mask(pointer: str, text: str) -> str:
        return text.replace(SECRET, "[redacted]")

    d = Dispatcher([fails], redaction=PreviewPolicy(redactor=mask))
    result = (await d.run(chat_round(d.specs, [("c1", "fails", {"n": 1})]), session="s"))[0]
    assert result.is_error and str(result.code) == "tool_error"
    assert result.content == "tool_error: ValueError: login refused for key [redacted]"


async def test_a_schema_tool_carries_its_own_budget():
    async def long(arguments: dict[str, Any]) -> str:
        return "é" * 1000

    made = schema_tool("long", {"type": "object"}, long, max_result_bytes=512)
    d = Dispatcher([made])
    result = (await d.run(chat_round(d.specs, [("c1", "long", {})]), session="s"))[0]
    assert result.truncated_from == 2000 and len(result.content.encode()) <= 512
    with pytest.raises(ConfigError, match="max_result_bytes"):
        schema_tool("bad", {"type": "object"}, long, max_result_bytes=10)


def test_a_cut_result_keeps_its_original_size_in_the_ledger_record():
    from toollatch.ledger._records import result_from_json, result_to_json

    cut = ToolResult(
        tool_call_id="c1", name="big", content="x", is_error=False, truncated_from=9000
    )
    assert result_from_json(result_to_json(cut)) == cut
    older = '{"tool_call_id":"c1","name":"big","is_error":false,"content":"x","code":null}'
    assert result_from_json(older).truncated_from is None  # records written before the field
    with pytest.raises(LedgerError):
        result_from_json(older[:-1] + ',"truncated_from":"9000"}')
