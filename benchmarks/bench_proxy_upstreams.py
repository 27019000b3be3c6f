"""`toollatch proxy` CPU per event: an Anthropic or Bedrock upstream (``--upstream-provider
anthropic|bedrock``: the request translated, the provider's stream read with its adapter)
beside the OpenAI chat upstream (passed through), on the same script, in one run.

Run it from the repository root::

    python benchmarks/bench_proxy_upstreams.py              # 1 and 50 streams, 3 rounds
    python benchmarks/bench_proxy_upstreams.py --streams 1 --rounds 2 --single 20
    python benchmarks/bench_proxy_upstreams.py --providers anthropic bedrock

Processes as in ``bench_proxy.py`` (whose script, client and CPU accounting this reuses):
the scripted server (``python -m toollatch.scripted``), one proxy per upstream wire, each in
a process of its own (all on that one server), and the clients here (httpx, raw SSE,
no SDK). For each concurrency the two proxies are measured in turn, ``--rounds`` times,
interleaved, so the machine's load falls on both alike.

**CPU per event**: a proxy process's utime + stime over its streams, divided by the *chat*
wire's upstream events (the same denominator for all: the same script gives the same answer
to the client; the other wires spend more events on it, printed too). The ratio is
provider / chat. (Bedrock's proxy sends no credentials here: the scripted server takes
requests without them; signing is not in the figure.) Every stream must assemble the
script's text and calls (``ok``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from toollatch.core._eventstream import EventStreamDecoder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import MODEL, RUNNER, load, read_line, run_level, scripted_process, stop

USER = "Weather in Oslo and Lima?"
WIRES: dict[str, tuple[str, str, dict[str, object]]] = {
    # provider: (base URL under the server's root, path of a direct request, its body)
    "openai_chat": (
        "/v1",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": USER}], "stream": True},
    ),
    "anthropic": (
        "",
        "/v1/messages",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": USER}],
            "stream": True,
            "max_tokens": 4096,
        },
    ),
    "bedrock": (
        "",
        f"/model/{MODEL}/converse-stream",
        {"messages": [{"role": "user", "content": [{"text": USER}]}]},
    ),
}


async def wire_events(url: str, path: str, body: dict[str, object]) -> int:
    """The events of one direct answer (SSE ``data:`` lines, or event-stream messages)."""
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(url + path, json=body)
    if answer.headers["content-type"].startswith("application/vnd.amazon.eventstream"):
        return len(EventStreamDecoder().feed(answer.content))
    return sum(1 for line in answer.text.splitlines() if line.startswith("data:"))


async def bench(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_upstreams_"))
    procs: list[subprocess.Popen[str]] = []
    try:
        _upstream, root = scripted_process(tmp, args.delay_ms, procs)
        targets, events = [], {}
        for provider in ("openai_chat", *args.providers):
            under, path, body = WIRES[provider]
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    RUNNER,
                    root + under,
                    json.dumps({"upstream_provider": provider}),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            targets.append((provider, read_line(proc, "http://", 30), proc.pid))
            events[provider] = await wire_events(root, path, body)
        chat_events = events["openai_chat"]
        print(f"# bench_proxy_upstreams: {load()}; delay {args.delay_ms} ms between events")
        counts = ", ".join(f"{name} {n}" for name, n in events.items())
        print(f"# upstream events per answer: {counts}")
        print("| streams | upstream | ok / streams | CPU µs/event (per round) | median | ratio |")
        print("|---:|---|---:|---|---:|---:|", flush=True)
        for n in args.streams:
            repeat = args.single if n == 1 else 1
            cpu: dict[str, list[float]] = {name: [] for name, _, _ in targets}
            ok: dict[str, list[int]] = {name: [0, 0] for name, _, _ in targets}
            for _ in range(args.rounds):
                for name, base, pid in targets:
                    streams, spent, _wall = await run_level(base, pid, n, repeat)
                    cpu[name].append(spent / (chat_events * len(streams)) * 1e6)
                    ok[name][0] += sum(s.ok() for s in streams)
                    ok[name][1] += len(streams)
            chat = statistics.median(cpu["openai_chat"])
            for name, values in cpu.items():
                median = statistics.median(values)
                each = ", ".join(f"{v:.0f}" for v in values)
                print(
                    f"| {n} | {name} | {ok[name][0]} / {ok[name][1]} | {each} | {median:.0f} "
                    f"| {median / chat:.2f} |",
                    flush=True,
                )
        print(f"# at the end: {load()}")
    finally:
        for proc in reversed(procs):
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 50])
    parser.add_argument(
        "--providers",
        nargs="+",
        choices=["anthropic", "bedrock"],
        default=["anthropic"],
        help="upstream wires beside chat (anthropic)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--single", type=int, default=20, help="sequential streams at 1 (20)")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="between upstream events")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
