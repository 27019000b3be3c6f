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

Client CPU per model request (``--cpu``)
----------------------------------------
::

    python benchmarks/bench_agent.py --cpu                 # 300 conversations per contender
    python benchmarks/bench_agent.py --cpu --conversations 100

The scripted server runs in a child process (its CPU is not counted); this process's CPU
(``time.process_time``, collector on, as in an application) is divided by the model requests
made. A conversation is two OpenAI Chat requests: a text and one ``lookup`` call of ~120
argument characters in 8-character fragments, the tool's result, then a text answer. The
contenders do the same work over the same loopback HTTP, alternating in blocks:

* **agent**: as a user writes it: ``async with model_client(...)`` and ``Agent(...).run()``
  per conversation;
* **agent, one client**: one ``model_client`` for every conversation, a new run each;
* **agent, own http/conv.**: the agent with an ``httpx.AsyncClient`` made and closed per
  conversation (``http=``), as ``model_client()`` did before the loop's shared pool;
* **bare httpx + orjson**: one ``httpx.AsyncClient`` for the process, a pre-built URL and
  headers, the body encoded with orjson, the body's lines split by hand, each event
  ``orjson.loads``-ed, the call's argument fragments joined and parsed, the tool awaited and
  its result sent back: the least a hand-written loop does. It asks for the response the
  agent's client asks for (``stream_options.include_usage``: the token usage in a last
  chunk, which the agent reports as ``Round.usage``), so both read the same bytes;
* **bare, no usage chunk**: the same without ``include_usage`` (one chunk fewer to read; the
  bare contender before the agent's request and its were made alike), for information;
* **bare, client per conv.**: the same with its own ``AsyncClient`` per conversation;
* **bare aiohttp + orjson**: the bare loop on one ``aiohttp.ClientSession`` (the HTTP client
  toollatch's model clients read with, behind httpx's API), for information: agent / this is
  what toollatch's own work costs over the least loop on the same HTTP client;
* **agent, baseline** (with ``--baseline SRC``): the **agent** contender run by another
  toollatch (``SRC`` holds its ``toollatch`` package, e.g. ``git archive main src | tar -x -C
  /tmp/main``), in a child process that plays its block when its turn comes and reports its
  own CPU: before and after a change, in one run.

The claim is agent / bare (target: 1.5x or less).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

# (--baseline's child process imports the toollatch it was given instead)
sys.path.insert(
    0, os.environ.get("TOOLLATCH_BENCH_SRC") or str(Path(__file__).resolve().parents[1] / "src")
)

from toollatch import Agent, RetryPolicy, RunLimits, model_client, tool
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]


def script(calls: int, event_ms: float) -> Script:
    items: list[Text | Call] = [Text(text="Let me look these up for you.", chunk_chars=6)]
    for n in range(calls):
        arguments = json.dumps({"query": f"question number {n} " + "x" * 90, "limit": 5})
        items.append(
            Call(call_id=f"call_{n}", name="lookup", arguments=arguments, fragment_chars=8)
        )
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
    client = model_client(
        provider, model="bench", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
    )
    async with client:
        agent = Agent(client, [make_tool(eager, tool_ms)], run_limits=RunLimits(max_rounds=1))
        start = time.perf_counter()
        seen: list[tuple[float, dict]] = []
        async for event in agent.run("go"):
            seen.append((time.perf_counter() - start, event.to_json()))
    first_open = next(t for t, e in seen if e["type"] == "call_opened")
    first_start = next(t for t, e in seen if e["type"] == "tool_started")
    last_commit = max(t for t, e in seen if e["type"] == "call_committed")
    done_before = sum(1 for t, e in seen if e["type"] == "tool_finished" and t < last_commit)
    round_end = next(t for t, e in seen if e["type"] == "round_ended")
    return {
        "open_to_start": first_start - first_open,
        "round": round_end,
        "done_before_end": done_before,
    }


async def bench(provider: str, repeats: int, calls: int, event_ms: float, tool_ms: float) -> dict:
    runs: dict[bool, list[dict]] = {True: [], False: []}
    async with ScriptedServer({"bench": script(calls, event_ms)}) as server:
        for _ in range(repeats):
            for eager in (True, False):
                runs[eager].append(await one_run(server, provider, eager, tool_ms))
    med = {
        eager: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for eager, rs in runs.items()
    }
    return {
        "eager": med[True],
        "batch": med[False],
        "ratio": med[True]["round"] / med[False]["round"],
    }


# --- client CPU per model request (--cpu) ------------------------------------------------------

CPU_MODEL = "cpu"


def cpu_script() -> Script:
    arguments = json.dumps({"query": "question number 0 " + "x" * 90, "limit": 5})
    first = Turn(
        items=(
            Text(text="Let me look that up for you.", chunk_chars=6),
            Call(call_id="call_0", name="lookup", arguments=arguments, fragment_chars=8),
        ),
        delay_ms=0,
    )
    answer = Turn(
        items=(Text(text="Here is what I found: five results.", chunk_chars=6),), delay_ms=0
    )
    return Script(turns=(first, answer))


def _serve(conn: Any) -> None:  # the child process: serve until the parent says stop
    with ScriptedServer({CPU_MODEL: cpu_script()}, delay_scale=0) as server:
        conn.send(server.base_url("openai_chat"))
        conn.recv()


async def _lookup(query: str, limit: int = 5) -> str:
    """Look something up."""
    return f"{limit} results for {query[:20]}"


cpu_lookup = tool(name="lookup", side_effects="read")(_lookup)


async def agent_own_http(base_url: str) -> int:
    """A conversation through the agent loop with an httpx client of its own (made and
    closed per conversation, as ``model_client()`` did before the loop's shared pool)."""
    async with (
        httpx.AsyncClient(timeout=None, verify=_bare_tls()) as http,
        model_client(
            "openai_chat",
            model=CPU_MODEL,
            base_url=base_url,
            api_key="k",
            retry=RetryPolicy(attempts=1),
            http=http,
        ) as own,
    ):
        return await agent_conversation(base_url, own)


async def agent_conversation(base_url: str, client: Any = None) -> int:
    """One conversation through the agent loop; returns the model requests made."""
    if client is None:
        async with model_client(
            "openai_chat",
            model=CPU_MODEL,
            base_url=base_url,
            api_key="k",
            retry=RetryPolicy(attempts=1),
        ) as own:
            return await agent_conversation(base_url, own)
    rounds = 0
    async for event in Agent(client, [cpu_lookup]).run("go"):
        rounds += event.type == "round_ended"
    return rounds


LOOKUP_DEFINITION = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
            "required": ["query"],
        },
    },
}


_BARE_TLS: list[Any] = []


def _bare_tls() -> Any:
    if not _BARE_TLS:  # one TLS context per process, as model_client() shares its own
        _BARE_TLS.append(httpx.create_ssl_context())
    return _BARE_TLS[0]


class BareClient:
    """A hand-written OpenAI Chat loop over one shared httpx client and orjson."""

    def __init__(self, base_url: str, *, usage: bool = True) -> None:
        self.usage = usage  # ask for the usage chunk, as the agent's client does
        self.tokens: dict[str, Any] | None = None  # the last response's usage
        self.http = httpx.AsyncClient(timeout=None, verify=_bare_tls())
        self.url = httpx.URL(base_url + "/chat/completions")
        self.headers = {
            "authorization": "Bearer k",
            "content-type": "application/json",
            "accept": "text/event-stream",
        }

    async def request(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        request_body: dict[str, Any] = {
            "model": CPU_MODEL,
            "messages": messages,
            "stream": True,
            "tools": [LOOKUP_DEFINITION],
        }
        if self.usage:
            request_body["stream_options"] = {"include_usage": True}
        body = orjson.dumps(request_body)
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        request = self.http.build_request("POST", self.url, content=body, headers=self.headers)
        response = await self.http.send(request, stream=True)
        try:
            await self.events(response.aiter_raw(), text, calls)
        finally:
            await response.aclose()
        return {"text": "".join(text), "calls": [calls[i] for i in sorted(calls)]}

    async def events(self, reads: Any, text: list[str], calls: dict[int, dict[str, Any]]) -> None:
        """The body's reads split into lines by hand, each event ``orjson.loads``-ed."""
        pending = bytearray()  # (a line that spans reads: gathered, copied out once)
        async for read in reads:
            data = read
            if pending:
                pending += read
                if b"\n" not in read:
                    continue
                data = bytes(pending)
                pending.clear()
            lines = data.split(b"\n")
            pending += lines.pop()
            for line in lines:
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if event.get("usage"):
                    self.tokens = event["usage"]
                for choice in event.get("choices", ()):
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                    for part in delta.get("tool_calls") or ():
                        call = calls.setdefault(part["index"], {"fragments": []})
                        if part.get("id"):
                            call["id"] = part["id"]
                        function = part.get("function") or {}
                        if function.get("name"):
                            call["name"] = function["name"]
                        if function.get("arguments"):
                            call["fragments"].append(function["arguments"])

    async def conversation(self) -> int:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        requests = 0
        while True:
            answer = await self.request(messages)
            requests += 1
            if not answer["calls"]:
                return requests
            messages.append(
                {
                    "role": "assistant",
                    "content": answer["text"] or None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": "".join(c["fragments"])},
                        }
                        for c in answer["calls"]
                    ],
                }
            )
            for call in answer["calls"]:
                result = await _lookup(**orjson.loads("".join(call["fragments"])))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


class BareAiohttpClient(BareClient):
    """The same loop on one ``aiohttp.ClientSession`` instead of httpx (what toollatch's
    model clients read with, behind httpx's API): what is left of agent / bare is then
    toollatch's own work, not the HTTP client's."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.session: Any = None
        self.plain_url = base_url + "/chat/completions"

    async def request(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        request_body = {
            "model": CPU_MODEL,
            "messages": messages,
            "stream": True,
            "tools": [LOOKUP_DEFINITION],
            "stream_options": {"include_usage": True},
        }
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        post = self.session.post(
            self.plain_url, data=orjson.dumps(request_body), headers=self.headers
        )
        async with post as response:
            await self.events(response.content.iter_any(), text, calls)
        return {"text": "".join(text), "calls": [calls[i] for i in sorted(calls)]}

    async def aclose(self) -> None:
        await self.http.aclose()
        if self.session is not None:
            await self.session.close()


async def bare_conversation(base_url: str) -> int:
    """The bare client as a user of httpx writes a conversation: its own ``AsyncClient`` (so
    a new connection), closed at the end: what is left of the per-conversation cost is
    httpx's own."""
    bare = BareClient(base_url)
    async with bare.http:
        return await bare.conversation()


class Baseline:
    """The **agent** contender played by the toollatch in ``src``, in a child process
    (``--baseline-child``): :meth:`block` has it run ``n`` conversations and returns the
    CPU seconds it spent and the model requests it made."""

    def __init__(self, src: str, base_url: str) -> None:
        env = {**os.environ, "TOOLLATCH_BENCH_SRC": str(Path(src).resolve())}
        command = [sys.executable, __file__, "--baseline-child", base_url]
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def block(self, n: int) -> tuple[float, int]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{n}\n")
        self.process.stdin.flush()
        seconds, requests = self.process.stdout.readline().split()
        return float(seconds), int(requests)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


async def baseline_child(base_url: str) -> None:
    """The child of :class:`Baseline`: warm up, then one block per line read."""
    for _ in range(5):
        await agent_conversation(base_url)
    print("ready", flush=True)
    for line in sys.stdin:
        gc.collect()
        start, requests = time.process_time(), 0
        for _ in range(int(line)):
            requests += await agent_conversation(base_url)
        print(time.process_time() - start, requests, flush=True)


async def cpu_bench(
    base_url: str, conversations: int, block: int, baseline: Baseline | None = None
) -> dict[str, float]:
    bare = BareClient(base_url)
    no_usage = BareClient(base_url, usage=False)
    on_aiohttp = BareAiohttpClient(base_url)
    shared = model_client(
        "openai_chat",
        model=CPU_MODEL,
        base_url=base_url,
        api_key="k",
        retry=RetryPolicy(attempts=1),
    )
    contenders = {
        "agent": lambda: agent_conversation(base_url),
        "agent, one client": lambda: agent_conversation(base_url, shared),
        "agent, own http/conv.": lambda: agent_own_http(base_url),
        "bare httpx + orjson": bare.conversation,
        "bare, client per conv.": lambda: bare_conversation(base_url),
        "bare, no usage chunk": no_usage.conversation,
        "bare aiohttp + orjson": on_aiohttp.conversation,
    }
    for run in contenders.values():  # warm up: imports, connections, caches
        for _ in range(5):
            await run()
    names = [*contenders, *(["agent, baseline"] if baseline else [])]
    cpu = dict.fromkeys(names, 0.0)
    requests = dict.fromkeys(names, 0)
    done = 0
    while done < conversations:
        n = min(block, conversations - done)
        if baseline is not None:
            seconds, made = baseline.block(n)
            cpu["agent, baseline"] += seconds
            requests["agent, baseline"] += made
        for name, run in contenders.items():
            gc.collect()
            start = time.process_time()
            for _ in range(n):
                requests[name] += await run()
            cpu[name] += time.process_time() - start
        done += n
    await shared.aclose()
    await bare.http.aclose()
    await no_usage.http.aclose()
    await on_aiohttp.aclose()
    return {name: cpu[name] / requests[name] for name in names}


def measure_cpu(
    conversations: int, block: int, baseline_src: str | None = None
) -> dict[str, float]:
    """Client CPU seconds per model request of each contender (``--cpu``), the scripted
    server in a child process; ``bench_targets.py`` imports it."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve, args=(child,), daemon=True)
    server.start()
    baseline = None
    try:
        base_url = parent.recv()
        if baseline_src is not None:
            baseline = Baseline(baseline_src, base_url)
            assert baseline.process.stdout is not None
            baseline.process.stdout.readline()  # "ready": warmed up
        per_request = asyncio.run(cpu_bench(base_url, conversations, block, baseline))
    finally:
        if baseline is not None:
            baseline.close()
        parent.send("stop")
        server.join(10)
    return per_request


def run_cpu(conversations: int, block: int, baseline_src: str | None = None) -> None:
    per_request = measure_cpu(conversations, block, baseline_src)
    bare = per_request["bare httpx + orjson"]
    print(
        f"client CPU per model request, {conversations} conversations of 2 requests "
        f"(openai_chat, server in another process)"
    )
    print(f"{'contender':24} {'CPU/request':>12} {'vs bare':>8}")
    for name, seconds in per_request.items():
        print(f"{name:24} {seconds * 1000:9.3f} ms {seconds / bare:7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--provider", choices=PROVIDERS, action="append")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--event-ms", type=float, default=15.0)
    parser.add_argument("--tool-ms", type=float, default=600.0)
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="client CPU per model request: agent vs bare httpx + orjson",
    )
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        help="with --cpu: also the agent run by the toollatch package in SRC (a child process)",
    )
    parser.add_argument("--baseline-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        asyncio.run(baseline_child(args.baseline_child))
        return
    if args.cpu:
        run_cpu(args.conversations, args.block, args.baseline)
        return
    print(
        f"{args.calls} calls, {args.event_ms:g} ms between events, "
        f"tool n {args.tool_ms:g} ms / (n+1); median of {args.repeats}"
    )
    print(
        f"{'provider':18} {'open->start eager':>18} {'batch':>8} {'round eager':>12} "
        f"{'batch':>8} {'eager/batch':>12} {'done early':>11}"
    )
    for provider in args.provider or PROVIDERS:
        r = asyncio.run(bench(provider, args.repeats, args.calls, args.event_ms, args.tool_ms))
        e, b = r["eager"], r["batch"]
        opened = f"{e['open_to_start'] * 1000:15.0f} ms {b['open_to_start'] * 1000:5.0f} ms"
        print(
            f"{provider:18} {opened}"
            f" {e['round'] * 1000:9.0f} ms {b['round'] * 1000:5.0f} ms {r['ratio']:11.2f}x"
            f" {e['done_before_end']:11.0f}"
        )


if __name__ == "__main__":
    main()
