"""``POST /runs`` takes the page's ``chat_id`` (its conversation: 1 to 128 characters of
``A-Za-z0-9_-``; the page sends 24), and refuses a malformed one with 422 (issue 31)."""

from __future__ import annotations

import httpx
import pytest

from relay_helpers import read_events, start_run
from toollatch.relay import RelayServer


async def test_a_run_with_a_chat_id_runs_and_a_bad_chat_id_is_refused():
    async with RelayServer(delay_scale=0) as relay:
        async with httpx.AsyncClient(base_url=relay.url) as client:
            run = await start_run(client, "hi", chat_id="Zm9vYmFyYmF6cXV4MTIzNDU2")
            frames = await read_events(client, run["events_url"])
            assert frames[-1].event == "run_ended"
            for bad in ("", "a b", "x" * 129, 7, "é" * 24):
                answer = await client.post("/runs", json={"message": "hi", "chat_id": bad})
                assert answer.status_code == 422, bad
                assert "chat_id" in answer.json()["error"]["message"]


@pytest.mark.parametrize("field", ["chat", "thread_id"])
async def test_other_unknown_fields_are_still_refused(field):
    async with RelayServer(delay_scale=0) as relay:
        async with httpx.AsyncClient(base_url=relay.url) as client:
            answer = await client.post("/runs", json={"message": "hi", field: "x"})
            assert answer.status_code == 422
            assert field in answer.json()["error"]["message"]
