"""`toollatch probe` (cli/_probe.py): the battery against the scripted server and its quirk
profiles, over real loopback HTTP; each profile's quirks are found and nothing else."""

from __future__ import annotations

import json

import httpx
import pytest

from toollatch.cli._probe_battery import BATTERY, QUIRKS, report, run_probe, scan
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.scripted._quirks import PROFILES

TWO = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking."),
                Call(call_id="c_osl", name="get_weather", arguments='{"city": "Oslo"}'),
                Call(call_id="c_lim", name="get_weather", arguments='{"city": "Lima"}'),
            ),
            delay_ms=0.5,
        ),
    )
)
KEY = "sk-probe-0123456789abcdefghij"
SINGLE = [p for p in BATTERY if p.name in ("single", "parallel")]


async def probed(quirks: str | None, record=None) -> list:
    async with ScriptedServer({"m": TWO}, delay_scale=0.1, quirks=quirks) as upstream:
        async with httpx.AsyncClient() as http:
            return await run_probe(
                http, upstream.base_url("openai_chat"), "m", api_key=KEY, battery=SINGLE,
                record=record,
            )  # fmt: skip


async def test_a_clean_server_shows_no_quirk_and_every_call_commits():
    results = await probed(None)
    assert [r.name for r in results] == ["single", "parallel"]
    for r in results:
        assert r.status == 200
        assert r.quirks == []
        assert r.finish_reasons == ["tool_calls"]
        assert r.done and r.usage
        assert r.ended == "normal"
        assert [(c["id"], c["committed"]) for c in r.calls] == [("c_osl", True), ("c_lim", True)]
    assert "no quirks seen" in report(results)


@pytest.mark.parametrize("name", sorted(PROFILES))
async def test_each_profile_shows_exactly_its_quirks(name):
    results = await probed(name)
    profile = PROFILES[name]
    for r in results:
        assert set(r.quirks) == set(profile.codes), (name, r.quirks)
        assert all(c["committed"] for c in r.calls)
    table = report(results)
    for code in profile.codes:
        assert f"{code}: {QUIRKS[code]}" in table


async def test_probe_records_every_answer_without_the_key(tmp_path):
    await probed("ollama", record=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len([f for f in files if f.endswith(".sse")]) == 2
    assert any(f.endswith("-single.sse") for f in files)
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes()
    meta = json.loads(
        next(p for p in tmp_path.iterdir() if p.name.endswith("-single.json")).read_text()
    )
    assert meta["status"] == 200


async def test_a_refusing_server_is_reported_not_raised():
    async with ScriptedServer({"m": TWO}) as upstream:
        async with httpx.AsyncClient() as http:
            results = await run_probe(
                http, upstream.base_url("openai_chat"), "nonesuch", battery=SINGLE
            )
            [unreachable] = await run_probe(http, "http://127.0.0.1:9/v1", "m", battery=SINGLE[:1])
    assert all(r.status is not None and r.status >= 400 and r.error for r in results)
    assert unreachable.status is None
    assert unreachable.error is not None
    assert unreachable.error.startswith("ConnectError")


def chunk(entries=None, finish=None, content=None, choices=True):
    delta = {}
    if entries is not None:
        delta["tool_calls"] = entries
    if content is not None:
        delta["content"] = content
    return (
        {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if choices
        else {"choices": []}
    )


def test_scan_finds_object_arguments_repeats_and_one_character_fragments():
    q9 = [
        chunk([{"index": 0, "id": "a", "function": {"name": "f", "arguments": {"x": 1}}}]),
        chunk(finish="tool_calls"),
    ]
    assert scan(q9) == {"Q9"}
    q11 = [
        chunk([{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}]),
        chunk([{"index": 0, "function": {"arguments": ' 1}{"x": 1}'}}]),
        chunk(finish="tool_calls"),
    ]
    assert scan(q11) == {"Q11"}
    text = '{"city": "Oslo, Norway"}'
    q17 = [chunk([{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}])]
    q17 += [chunk([{"index": 0, "function": {"arguments": ch}}]) for ch in text]
    assert scan([*q17, chunk(finish="tool_calls")]) == {"Q17"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"required": ["x"]}}}]
    q10 = [
        chunk([{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]),
        chunk(finish="tool_calls"),
    ]
    assert scan(q10, tools) == {"Q10"}
    q21 = [chunk(choices=False), chunk(content="hi"), chunk(finish="stop")]
    assert scan(q21) == {"Q21"}
    usage_last = [
        chunk(content="hi"),
        chunk(finish="stop"),
        {"choices": [], "usage": {"total_tokens": 3}},
    ]
    assert scan(usage_last) == set()
