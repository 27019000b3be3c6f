"""The parser's route for ``bench_agent.py --cpu``'s responses, stage by stage, in one process.

Run it from the repository root::

    python benchmarks/bench_parse_route.py               # 3,000 conversations, best of 5
    python benchmarks/bench_parse_route.py --conversations 1000
    TOOLLATCH_BENCH_SRC=/tmp/main/src python benchmarks/bench_parse_route.py   # another checkout

Theory of operation
-------------------
The two responses of the ``--cpu`` conversation (OpenAI Chat SSE: a text in 6-character
deltas, one ``lookup`` call in 8-character fragments, the usage chunk, ``[DONE]``; then a text
answer) are read once from the scripted server over loopback, as the agent's client reads them
(``aiter_raw``: about one event a read, 27 and 10 reads). Then, without the network, the same
reads are fed, CPU time per model request (best of 5 passes):

* **decoder**: ``SSEDecoder.feed_payloads`` with an empty callback;
* **decoder + translate**: the adapter's ``translate`` on every run the decoder hands over
  (the events it returns are dropped, not fed to an assembler);
* **StreamParser**: the whole route as the agent sets it up (``observe=True``, the tool's
  gate made once), construction and ``finish()`` included;
* **StreamParser setup + finish**: construction and ``finish()`` alone, no bytes fed;
* **bare parse**: the bare loop of ``bench_agent.py`` without the network (the reads split
  on LF, each ``data:`` line ``orjson.loads``-ed, text and argument fragments collected).

The differences between rows are what each stage adds. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (bench_agent puts this checkout's src first on the path, or TOOLLATCH_BENCH_SRC)
from bench_agent import CPU_MODEL, cpu_lookup, cpu_script

import toollatch
from toollatch import StreamParser
from toollatch.scripted import ScriptedServer
from toollatch.stages import Gate, OpenAIChatAdapter, SSEDecoder

Reads = list[bytes]


async def capture() -> list[Reads]:
    """The two responses' reads, as ``aiter_raw`` yields them."""
    call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    first: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "5 results"},
    ]
    responses: list[Reads] = []
    with ScriptedServer({CPU_MODEL: cpu_script()}, delay_scale=0) as server:
        url = server.base_url("openai_chat") + "/chat/completions"
        async with httpx.AsyncClient() as http:
            for messages in (first, second):
                body = {
                    "model": CPU_MODEL,
                    "messages": messages,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with http.stream("POST", url, json=body) as response:
                    responses.append([read async for read in response.aiter_raw()])
    return responses


def decoder(reads: Reads) -> None:
    feed = SSEDecoder().feed_payloads
    for read in reads:
        feed(read, lambda event, payloads: None)


def decoder_translate(reads: Reads) -> None:
    translate = OpenAIChatAdapter().translate

    def on_run(event: str, payloads: list[bytes]) -> None:
        stop = translate(event, payloads, 0)[0]
        while stop != len(payloads):
            stop = translate(event, payloads, stop)[0]

    feed = SSEDecoder().feed_payloads
    for read in reads:
        feed(read, on_run)


GATE = Gate([cpu_lookup.spec])


def parser(reads: Reads) -> None:
    stream = StreamParser("openai_chat", gate=GATE, observe=True)
    for read in reads:
        stream.feed(read)
    stream.finish()


def setup_finish(reads: Reads) -> None:
    StreamParser("openai_chat", gate=GATE, observe=True).finish()


def bare(reads: Reads) -> None:
    pending = bytearray()
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    for read in reads:
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
            for choice in event.get("choices", ()):
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(delta["content"])
                for part in delta.get("tool_calls") or ():
                    fragments = calls.setdefault(part["index"], [])
                    function = part.get("function") or {}
                    if function.get("arguments"):
                        fragments.append(function["arguments"])


def per_request(route: Callable[[Reads], None], responses: list[Reads], n: int) -> float:
    """Best of 5 passes of ``n`` conversations: CPU seconds per model request."""
    best = float("inf")
    for _ in range(5):
        gc.collect()
        start = time.process_time()
        for _ in range(n):
            for reads in responses:
                route(reads)
        best = min(best, (time.process_time() - start) / (n * len(responses)))
    return best


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("--conversations", type=int, default=3000)
    n = cli.parse_args().conversations
    responses = asyncio.run(capture())
    print(toollatch.__file__, "reads per response:", [len(reads) for reads in responses])
    routes = {
        "decoder": decoder,
        "decoder + translate": decoder_translate,
        "StreamParser": parser,
        "StreamParser setup+finish": setup_finish,
        "bare parse": bare,
    }
    for name, route in routes.items():
        print(f"{name:26} {per_request(route, responses, n) * 1e6:7.1f} us/request")


if __name__ == "__main__":
    main()
