"""The cost per run of a durable run (DBOS on PostgreSQL) against the same run without it.

    python3 benchmarks/bench_durable.py               # starts its own PostgreSQL (see
                                                      # tests/durable_helpers.py), 30 runs each
    python3 benchmarks/bench_durable.py --durable postgresql://... --runs 100

One process, one scripted model server (no delays), the demo script: three rounds, three
calls (get_weather twice, write_file), a memory ledger for both sides. Runs one after the
other, the two sides interleaved in blocks (plain, durable, plain, durable...) so the
machine's load hits both; wall time and this process's CPU time per run, and their ratio.
DBOS's own threads (queue and notification listeners) count in the CPU time: they are what
a durable worker pays.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from toollatch import Agent, model_client, open_ledger  # noqa: E402
from toollatch.runtime import DurableRuns, example_tools  # noqa: E402
from toollatch.scripted import ScriptedServer  # noqa: E402


async def plain(agent: Agent) -> None:
    events = [e async for e in agent.run("weather?")]
    assert events[-1].error is None
    assert events[-1].rounds == 3


async def durable(runs: DurableRuns) -> None:
    run_id = await runs.start("bench", "weather?", run_id=f"bench-{secrets.token_hex(8)}")
    result = await runs.result(run_id)
    assert result.error is None
    assert result.rounds == 3


async def main(url: str, count: int, blocks: int) -> None:
    spent = {"plain": [0.0, 0.0], "durable": [0.0, 0.0]}
    with tempfile.TemporaryDirectory() as workspace:
        async with ScriptedServer(delay_scale=0) as server:
            base = server.base_url("openai_chat")
            async with model_client("openai_chat", model="scripted", base_url=base) as client:
                agent = Agent(client, example_tools(workspace), ledger=open_ledger("memory:"))
                async with DurableRuns(url, executor_id="bench") as runs:
                    runs.register("bench", agent)
                    await plain(agent)  # warm both paths up
                    await durable(runs)
                    for _ in range(blocks):
                        for side in ("plain", "durable"):
                            wall, cpu = time.perf_counter(), time.process_time()
                            for _ in range(count // blocks):
                                await (plain(agent) if side == "plain" else durable(runs))
                            spent[side][0] += time.perf_counter() - wall
                            spent[side][1] += time.process_time() - cpu
    n = count // blocks * blocks
    print(f"{n} runs each (3 rounds, 3 calls per run)")
    print("| side | wall ms/run | CPU ms/run |")
    print("|---|---|---|")
    for side, (wall, cpu) in spent.items():
        print(f"| {side} | {wall / n * 1000:.1f} | {cpu / n * 1000:.1f} |")
    (pw, pc), (dw, dc) = spent["plain"], spent["durable"]
    print(f"durable / plain: wall {dw / pw:.1f}x, CPU {dc / pc:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durable", help="a postgresql:// URL (default: start one)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    if args.durable:
        asyncio.run(main(args.durable, args.runs, args.blocks))
    else:
        from durable_helpers import PostgresServer

        server = PostgresServer()
        try:
            server.start()
            asyncio.run(main(server.url(), args.runs, args.blocks))
        finally:
            server.close()
