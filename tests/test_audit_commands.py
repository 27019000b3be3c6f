"""The opt-in audit of uncommitted calls through the commands: ``toollatch run`` and
``toollatch serve`` with the config's ``ledger`` section (``url`` and
``audit_uncommitted``) keep a redacted record of each call that did not commit, in the
ledger's own file, and none of the calls that did."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from relay_helpers import served_run, serving
from toollatch.ledger import LedgerKey
from toollatch.ledger._audit_sqlite import SQLiteAudit
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.relay._app import run_scope
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-live-0123456789abcdef"
BAD = '{"unit": "f", "city": "' + SECRET + '", }'


def _script() -> Script:
    calls = Turn(
        items=(
            Call(call_id="ok", name="get_weather", arguments='{"city": "Oslo"}'),
            # invalid JSON holding a secret: never committed, so audited (redacted)
            Call(call_id="bad", name="get_weather", arguments=BAD),
        ),
        delay_ms=0,
    )
    return Script(turns=(calls, Turn(items=(Text(text="Done."),), delay_ms=0)))


def _config(tmp: Path, db: Path) -> Path:
    config = tmp / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "ledger": {
                    "url": f"sqlite:///{db}",
                    "audit_uncommitted": True,
                    "audit_max_bytes": 64,
                },
                # the previews show /unit only, and so does the audit
                "previews": {"default": {"mode": "fields", "fields": ["/unit"]}},
            }
        )
    )
    return config


async def _read(db: Path, scope: str) -> tuple[list, list]:
    audit, ledger = SQLiteAudit(db), SQLiteLedger(db)
    try:
        records = await audit.records(scope, now=time.time())
        states = [await ledger.get(LedgerKey(scope=scope, call_id=c)) for c in ("ok", "bad")]
    finally:
        await audit.aclose()
        await ledger.aclose()
    return records, [s.state if s is not None else None for s in states]


def _check(records: list, states: list) -> None:
    assert [(r.call_id, r.code) for r in records] == [("bad", "invalid_json")]
    assert records[0].argument_bytes == len(BAD)
    assert json.loads(records[0].shown) == {"unit": "f"}
    assert SECRET not in records[0].to_json()
    assert states == ["completed", None]  # the committed call is the ledger's, the other not


def test_run_takes_the_config_ledger_and_audits_the_uncommitted_call(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with ScriptedServer({"m": _script()}) as model:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "toollatch.cli",
                "run",
                "--json",
                "--session",
                "s1",
                "--config",
                str(_config(tmp_path, db)),
                "--base-url",
                model.base_url("openai_chat"),
                "--model",
                "m",
                "--workspace",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    _check(*asyncio.run(_read(db, "s1")))


def test_run_refuses_an_audit_without_a_ledger(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"ledger": {"audit_uncommitted": True}}))
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "audit_uncommitted needs a ledger" in done.stderr


def test_serve_audits_the_uncommitted_calls_of_its_runs(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with (
        ScriptedServer({"m": _script()}) as model,
        serving(
            "--config",
            str(_config(tmp_path, db)),
            "--base-url",
            model.base_url("openai_chat"),
            "--model",
            "m",
        ) as url,
    ):
        run, frames = served_run(url, "weather")
    assert frames[-1].event == "run_ended"
    ended = frames[-1].data
    assert {c["id"]: c["error"] for c in ended["calls"]} == {"ok": None, "bad": "invalid_json"}, [
        (f.event, f.data) for f in frames if f.event not in ("text", "preview")
    ]
    _check(*asyncio.run(_read(db, run_scope(run["session"], run["id"]))))
