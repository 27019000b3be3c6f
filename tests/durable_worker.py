"""One worker process of the durable-run test: ``durable_worker.py start|live|recover PG_URL
MODEL_URL LEDGER_URL LOG RUN_ID EXECUTOR [DEAD_EXECUTOR]``. ``start`` starts the run and
waits for it; ``live`` too, its sink live (an attempt hook, which LOG.attempts records; each
event's line says how many steps of the run DBOS had recorded when it was told);
``recover`` takes over the dead executor's runs and waits for RUN_ID. The result
(``DurableResult``, with what this process's Prometheus metrics counted) is printed as one
JSON line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time

import psycopg
from dbos import DBOS

from toollatch import Agent, RunLimits, model_client, open_ledger, tool
from toollatch.core._events import ReasoningBlock
from toollatch.core._round import reasoning_text
from toollatch.ledger import current_call
from toollatch.runtime import DurableRuns, Metrics


def tools(log: str) -> list:
    def note(what: str) -> None:
        call = current_call()
        with open(log, "a") as f:
            f.write(f"{what} {call.idempotency_key if call else None}\n")

    @tool(eager=True)
    def get_weather(city: str, unit: str = "c") -> str:
        """Weather."""
        note("weather " + city)
        return "21 degrees"

    @tool(timeout=120)
    def write_file(path: str, content: str) -> str:
        """Write, slowly (WRITE_SLEEP_S, 60 s): the test may kill the worker meanwhile."""
        note("write started")
        time.sleep(float(os.environ.get("WRITE_SLEEP_S", "60")))
        note("write finished")
        return "ok"

    return [get_weather, write_file]


def as_json(event: object) -> dict:
    """An event told as JSON (a reasoning block as ``{"type": "reasoning", "text"}``)."""
    if isinstance(event, ReasoningBlock):
        return {"type": "reasoning", "text": reasoning_text(event.data)}
    data = event.to_json()  # type: ignore[attr-defined]
    data.pop("history", None)
    return data


def tell(log: str, number: int, event: object) -> None:
    """The sink: one JSON line per event told (with this process's id) in LOG.events."""
    data = as_json(event)
    with open(log + ".events", "a") as f:
        f.write(json.dumps({"n": number, "pid": os.getpid(), **data}) + "\n")


RECORDED = """select count(*) from dbos.operation_outputs
where workflow_uuid = %s and (output is not null or error is not null)"""
"""The steps of a run DBOS recorded (its own table, read on a connection of our own: a
DBOS call from the sink would be one of the workflow's steps)."""


async def tell_live(pg: str, log: str, run_id: str, number: int, event: object) -> None:
    """The live sink: :func:`tell`, with the steps recorded so far."""
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as db:
        (steps,) = await (await db.execute(RECORDED, (run_id,))).fetchone()  # type: ignore[misc]
    data = as_json(event)
    line = {"n": number, "pid": os.getpid(), "steps": steps, **data}
    with open(log + ".events", "a") as f:
        f.write(json.dumps(line) + "\n")


async def attempt(log: str, number: int) -> int:
    """The attempt hook: records ``number``; nothing was told past it (one worker)."""
    with open(log + ".attempts", "a") as f:
        f.write(f"{number}\n")
    return number


def counted(metrics: Metrics) -> dict[str, float]:
    """What the metrics counted: rounds by how they ended, tool runs by outcome (and the
    tools' run time, all outcomes together: ``seconds``)."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "tool_rounds_total":
                out["rounds " + sample.labels["ended"]] = sample.value
            elif sample.name == "tool_execute_seconds_count":
                out["runs " + sample.labels["outcome"]] = sample.value
            elif sample.name == "tool_execute_seconds_sum":
                out["seconds"] = out.get("seconds", 0.0) + sample.value
    return out


async def main(mode: str, pg: str, model: str, ledger_url: str, log: str, run_id: str,
               executor: str, dead: str = "") -> None:  # fmt: skip
    ledger = open_ledger(ledger_url)
    metrics = Metrics()
    async with model_client("openai_chat", model="scripted", base_url=model) as client:
        agent = Agent(
            client,
            tools(log),
            ledger=ledger,
            lease_s=2.0,
            run_limits=RunLimits(max_rounds=5),
            observers=[metrics],
        )
        async with DurableRuns(pg, executor_id=executor) as runs:
            if mode == "live":
                runs.register(
                    "weather",
                    agent,
                    on_event=lambda run, n, event: tell_live(pg, log, run, n, event),
                    on_attempt=lambda run, n: attempt(log, n),
                )
            else:
                runs.register("weather", agent, on_event=lambda run, n, e: tell(log, n, e))
            if mode in ("start", "live"):
                await runs.start("weather", "weather?", run_id=run_id)
            else:
                print(json.dumps({"recovered": await runs.recover([dead])}), flush=True)
            result = await runs.result(run_id)
            steps = await DBOS.list_workflow_steps_async(run_id)
            ended = {
                **dataclasses.asdict(result),
                "steps": [s["function_name"] for s in steps],
                "counted": counted(metrics),
            }
            print(json.dumps(ended), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
