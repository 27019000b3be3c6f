"""Eager vs batch: when tools start and how long a round takes, over real loopback HTTP.

Run it from the repository root::

    python benchmarks/bench_agent.py             # every provider, 5 rounds each
    python benchmarks/bench_agent.py --repeats 2 --provider anthropic

Theory of operation
-------------------
The scripted model server plays one turn with realistic pacing: ``--event-ms`` between wire
events (a model emitting a few tokens per event), a short text, then three ``lookup`` calls of
about 120 argument characters each, streamed in 8-character fragments. The tool sleeps like an
API call: ``--tool-ms`` for the first call, half of it for the second, a third for the third
(the first lookup is the slow one). Batch starts all three at the stream's end, so its round
lasts the stream plus the slowest tool; eager runs the earlier calls while the later ones still
stream, so its round lasts the stream plus what is left of the slowest. The same turn is run by
an agent whose tool is eager and by one whose tool is not (batch: every call starts at the
round's normal end), on the same server, alternately, ``--repeats`` times; the medians are
reported.

Per run, from the agent events' arrival times (``time.perf_counter`` on the consumer side):

* **first start after open**: from the first call's ``call_opened`` to its ``tool_started``
  (what eager start saves: batch waits for the whole stream);
* **round wall time**: from the request to the round's ``round_ended`` (every result in);
* **tools done before the stream's end**: for eager, how many calls had already finished when
  the stream's last call committed (batch: none, by construction).

The claim is the ratio eager / batch of the round wall time, and that eager's first start
comes while the stream still runs. Nothing here is a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from toollatch.runtime import Agent, RetryPolicy, RunLimits, model_client, tool
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]


def script(calls: int, event_ms: float) -> Script:
    items: list[Text | Call] = [Text(text="Let me look these up for you.", chunk_chars=6)]
    for n in range(calls):
        arguments = json.dumps({"query": f"question number {n} " + "x" * 90, "limit": 5})
        items.append(Call(call_id=f"call_{n}", name="lookup", arguments=arguments,
                          fragment_chars=8))
    return Script(turns=(Turn(items=tuple(items), delay_ms=event_ms),))


def make_tool(eager: bool, tool_ms: float):
    @tool(name="lookup", eager=eager, side_effects="read")
    async def lookup(query: str, limit: int = 5) -> str:
        """Look something up (sleeps like an API call: call n takes tool_ms / (n + 1))."""
        n = int(query.split()[2])
        await asyncio.sleep(tool_ms / (n + 1) / 1000)
        return f"{limit} results for {query[:20]}"

    return lookup


async def one_run(server: ScriptedServer, provider: str, eager: bool, tool_ms: float) -> dict:
    client = model_client(provider, model="bench", base_url=server.base_url(provider),
                          retry=RetryPolicy(attempts=1))
    async with client:
        agent = Agent(client, [make_tool(eager, tool_ms)],
                      run_limits=RunLimits(max_rounds=1))
        start = time.perf_counter()
        seen: list[tuple[float, dict]] = []
        async for event in agent.run("go"):
            seen.append((time.perf_counter() - start, event.to_json()))
    first_open = next(t for t, e in seen if e["type"] == "call_opened")
    first_start = next(t for t, e in seen if e["type"] == "tool_started")
    last_commit = max(t for t, e in seen if e["type"] == "call_committed")
    done_before = sum(1 for t, e in seen if e["type"] == "tool_finished" and t < last_commit)
    round_end = next(t for t, e in seen if e["type"] == "round_ended")
    return {"open_to_start": first_start - first_open, "round": round_end,
            "done_before_end": done_before}


async def bench(provider: str, repeats: int, calls: int, event_ms: float, tool_ms: float) -> dict:
    runs: dict[bool, list[dict]] = {True: [], False: []}
    async with ScriptedServer({"bench": script(calls, event_ms)}) as server:
        for _ in range(repeats):
            for eager in (True, False):
                runs[eager].append(await one_run(server, provider, eager, tool_ms))
    med = {
        eager: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for eager, rs in runs.items()
    }
    return {"eager": med[True], "batch": med[False],
            "ratio": med[True]["round"] / med[False]["round"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--provider", choices=PROVIDERS, action="append")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--event-ms", type=float, default=15.0)
    parser.add_argument("--tool-ms", type=float, default=600.0)
    args = parser.parse_args()
    print(f"{args.calls} calls, {args.event_ms:g} ms between events, "
          f"tool n {args.tool_ms:g} ms / (n+1); median of {args.repeats}")
    print(f"{'provider':18} {'open->start eager':>18} {'batch':>8} {'round eager':>12} "
          f"{'batch':>8} {'eager/batch':>12} {'done early':>11}")
    for provider in args.provider or PROVIDERS:
        r = asyncio.run(bench(provider, args.repeats, args.calls, args.event_ms, args.tool_ms))
        e, b = r["eager"], r["batch"]
        opened = f"{e['open_to_start'] * 1000:15.0f} ms {b['open_to_start'] * 1000:5.0f} ms"
        print(f"{provider:18} {opened}"
              f" {e['round'] * 1000:9.0f} ms {b['round'] * 1000:5.0f} ms {r['ratio']:11.2f}x"
              f" {e['done_before_end']:11.0f}")


if __name__ == "__main__":
    main()
