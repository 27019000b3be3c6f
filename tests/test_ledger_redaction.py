"""What the ledger and the run history store passes the redactor when the user asks for it
(``ledger.redact``, ``open_ledger/open_history(redactor=...)``): the files never hold what
it masks. Sample secrets are built by concatenation (no literal key-looking string here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from toollatch import ToolResult, open_history, open_ledger
from toollatch.ledger import LedgerError, LedgerKey, digest_of
from toollatch.relay import redact_secrets

FAKE_KEY = "s" + "k-" + "live" + "A1b2C3d4E5f6G7h8J9k0L1m2"
PASSWORD = "hun" + "ter2-correct-horse"
MESSAGES = [
    {"role": "user", "content": "log in as ana"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "login",
                    "arguments": json.dumps({"user": "ana", "password": PASSWORD}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": f"session key {FAKE_KEY}"},
]


async def test_the_history_stores_arguments_and_results_redacted(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    history = open_history(url, redactor=redact_secrets)
    await history.append("run-1", MESSAGES, at=0)
    loaded = await history.load("run-1")
    await history.aclose()
    arguments = json.loads(loaded[1]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"user": "ana", "password": "[redacted]"}
    assert loaded[2] == {"role": "tool", "tool_call_id": "call_1", "content": "[redacted]"}
    assert loaded[0] == MESSAGES[0]  # the rest as it was
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert PASSWORD.encode() not in raw
    assert FAKE_KEY.encode() not in raw


async def test_without_a_redactor_the_history_keeps_everything(tmp_path):
    # (the test above can fail: this is what is stored without the option)
    history = open_history(f"sqlite:///{tmp_path / 'h.db'}")
    await history.append("run-1", MESSAGES, at=0)
    assert await history.load("run-1") == MESSAGES
    await history.aclose()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert FAKE_KEY.encode() in raw


@pytest.mark.parametrize("redacted", [True, False])
async def test_the_ledger_stores_results_redacted(tmp_path, redacted):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    ledger = open_ledger(url, redactor=redact_secrets if redacted else None)
    key = LedgerKey(scope="run-1", call_id="call_1")
    won = await ledger.claim(key, digest=digest_of("t", {}), worker="w", now=0.0, lease_s=30)
    result = ToolResult(tool_call_id="call_1", name="t", content=json.dumps({"key": FAKE_KEY}))
    await ledger.finish(key, won.token, result, now=1.0)  # type: ignore[union-attr]
    record = await ledger.get(key)
    await ledger.aclose()
    assert record is not None
    assert record.result is not None
    assert (FAKE_KEY in record.result.content) is not redacted
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert (FAKE_KEY.encode() in raw) is not redacted


# -- the stores redact as tool results are redacted (one walk, toollatch.core._redact) -----------


def mask_sk(pointer: str, text: str) -> str:
    return "[r]" if text.startswith("s" + "k-") else text


async def stored_result(tmp_path, content: str, redactor=mask_sk) -> str:  # type: ignore[no-untyped-def]
    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}", redactor=redactor)
    key = LedgerKey(scope="run-1", call_id="call_1")
    won = await ledger.claim(key, digest=digest_of("t", {}), worker="w", now=0.0, lease_s=30)
    result = ToolResult(tool_call_id="call_1", name="t", content=content)
    try:
        await ledger.finish(key, won.token, result, now=1.0)  # type: ignore[union-attr]
        record = await ledger.get(key)
    finally:
        await ledger.aclose()
    assert record is not None
    assert record.result is not None
    return record.result.content


async def test_a_stored_result_keeps_duplicate_keys_and_number_literals(tmp_path):
    # json.loads would keep only the last "k" (the first secret stored as it was before)
    # and write 2.50 back as 2.5, 1e400 as Infinity
    content = '{"k": "' + FAKE_KEY + '", "k": "ok", "price": 2.50, "big": 1e400}'
    assert await stored_result(tmp_path, content) == (
        '{"k":"[r]","k":"ok","price":2.50,"big":1e400}'
    )


async def test_a_stored_result_too_deep_for_the_walk_is_redacted_whole(tmp_path):
    content = "[" * 100_000 + '"' + FAKE_KEY + '"' + "]" * 100_000
    whole = await stored_result(tmp_path, content, lambda p, t: "[whole]" if p == "" else t)
    assert whole == "[whole]"


async def test_a_stored_result_walks_json_inside_strings(tmp_path):
    content = json.dumps({"call": {"arguments": json.dumps({"key": FAKE_KEY, "n": 1})}})
    shown = json.loads(await stored_result(tmp_path, content))
    assert json.loads(shown["call"]["arguments"]) == {"key": "[r]", "n": 1}


async def test_a_redactor_that_fails_stores_nothing(tmp_path):
    def broken(pointer: str, text: str) -> str:
        raise ValueError(f"cannot look at {text}")  # (its message quotes the secret)

    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}", redactor=broken)
    key = LedgerKey(scope="run-1", call_id="call_1")
    won = await ledger.claim(key, digest=digest_of("t", {}), worker="w", now=0.0, lease_s=30)
    result = ToolResult(tool_call_id="call_1", name="t", content=FAKE_KEY)
    with pytest.raises(LedgerError) as info:
        await ledger.finish(key, won.token, result, now=1.0)  # type: ignore[union-attr]
    assert FAKE_KEY not in str(info.value)
    assert "ValueError" in str(info.value)
    record = await ledger.get(key)
    assert record is not None
    assert record.state == "claimed"  # nothing stored
    history = open_history(f"sqlite:///{tmp_path / 'h.db'}", redactor=broken)
    with pytest.raises(LedgerError):
        await history.append("run-1", MESSAGES, at=0)
    await history.aclose()
    await ledger.aclose()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert FAKE_KEY.encode() not in raw


@pytest.mark.parametrize("redact", [True, False])
def test_run_with_ledger_redact_stores_no_secret(tmp_path, redact):
    tools = tmp_path / "secret_tools.py"
    tools.write_text(
        textwrap.dedent(f'''
        import toollatch

        @toollatch.tool
        def get_weather(city: str, unit: str = "c") -> str:
            """Weather, and a key it should not have printed."""
            return "21 degrees; key " + {FAKE_KEY[:6]!r} + {FAKE_KEY[6:]!r}

        @toollatch.tool
        def write_file(path: str, content: str) -> str:
            """Pretend to write."""
            return "ok"
    ''')
    )
    db = tmp_path / "ledger.db"
    config = tmp_path / "toollatch.yaml"
    config.write_text(f"ledger: {{url: 'sqlite:///{db}', redact: {str(redact).lower()}}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", str(tools),
         "--config", str(config), "--session", "s1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.db*"))
    assert b"toollatch_history" in raw or db.stat().st_size > 0
    assert (FAKE_KEY.encode() in raw) is not redact


@pytest.mark.parametrize("redact", [True, False])
async def test_serve_with_ledger_redact_stores_no_secret(tmp_path, redact):
    """``toollatch serve`` passes ``ledger.redact`` to the relay's ledger and history too."""
    import httpx

    from relay_helpers import read_events, start_run
    from toollatch import tool
    from toollatch.relay import RelayServer
    from toollatch.scripted import Call, Script, Text, Turn

    @tool(side_effects="read")
    def account(user: str, password: str) -> str:
        """Log in (the relay's result redaction already masks secret-looking results, so the
        secret here is in the arguments, which the history stores as the model sent them)."""
        return f"plan pro for {user}"

    arguments = json.dumps({"user": "ana", "password": PASSWORD})
    call = Call(call_id="c_acc", name="account", arguments=arguments)
    script = Script(turns=(Turn(items=(Text(text="Looking."), call), delay_ms=0),
                           Turn(items=(Text(text="Done."),), delay_ms=0)))  # fmt: skip
    db = tmp_path / "relay.db"
    async with (
        RelayServer(
            scripts={"scripted": script},
            tools=[account],
            delay_scale=0,
            ledger=f"sqlite:///{db}",
            redact_stored=redact,
        ) as relay,
        httpx.AsyncClient(base_url=relay.url) as client,
    ):
        run = await start_run(client, "who am I?")
        frames = await read_events(client, run["events_url"])
    assert [f.event for f in frames][-1] == "run_ended"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("relay.db*"))
    assert b"plan pro for ana" in raw
    assert (PASSWORD.encode() in raw) is not redact
