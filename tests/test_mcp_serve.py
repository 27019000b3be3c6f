"""``toollatch serve --mcp ...``: a served run's calls go to the MCP server's tools (which
replace the examples), once per call, through the same gate as in ``toollatch run``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from mcp_helpers import SERVER, calls_of
from relay_helpers import served_run, serving
from toollatch.mcp import parse_server_spec
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

NOTE = json.dumps({"name": "n", "text": "t"})


def _script(flag: str) -> Script:
    calls = Turn(
        items=(
            Call(call_id="c1", name=f"{flag}__echo", arguments='{"text": "served"}'),
            Call(call_id="c2", name=f"{flag}__echo", arguments='{"text": "cut'),  # never sent
            Call(call_id="c3", name=f"{flag}__write_note", arguments=NOTE),
            Call(call_id="c4", name="cfg__write_note", arguments=NOTE),  # not in its allow list
        ),
        delay_ms=0,
    )
    return Script(turns=(calls, Turn(items=(Text(text="Done."),), delay_ms=0)))


def test_serve_runs_the_mcp_servers_tools_instead_of_the_examples(tmp_path: Path) -> None:
    spec = "stdio:" + shlex.join(
        [*SERVER, "--log", str(tmp_path / "s.log"), "--notes", str(tmp_path)]
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "mcp": {
                    "servers": [
                        {
                            "name": "cfg",
                            "command": [*SERVER, "--log", str(tmp_path / "cfg.log")],
                            "allow": ["echo"],
                        },
                    ]
                }
            }
        )
    )
    flag = parse_server_spec(spec).name  # named after its program (python, python3...)
    with ScriptedServer({"m": _script(flag)}) as model:
        with serving(
            "--mcp",
            spec,
            "--config",
            str(config),
            "--ledger",
            "none",
            "--base-url",
            model.base_url("openai_chat"),
            "--model",
            "m",
        ) as url:
            _, frames = served_run(url, "note it")
        offered = sorted(t["function"]["name"] for t in model.requests[0].body["tools"])
    # both servers list the same tools, so each name is namespaced by its server's name (the
    # flag's server is named after its program)
    assert "get_weather" not in offered
    assert {f"{flag}__echo", "cfg__echo", f"{flag}__write_note", "cfg__write_note"} <= set(offered)
    ended = frames[-1]
    assert ended.event == "run_ended"
    assert ended.data["error"] is None
    codes = {c["id"]: c["error"] for c in ended.data["calls"]}
    assert codes == {"c1": None, "c2": "invalid_json", "c3": None, "c4": "policy_denied"}
    # each committed call reached its server once; nothing the gate refused reached one
    assert calls_of(tmp_path, "s") == [
        ("echo", {"text": "served"}),
        ("write_note", {"name": "n", "text": "t"}),
    ]
    assert calls_of(tmp_path, "cfg") == []
    assert (tmp_path / "n.txt").read_text() == "t\n"
