"""What the official clients send by default reaches the scripted server and gets an answer:
requests without streaming get the turn whole, ``GET /v1/models`` lists the scripts, Gemini's
methods are served on ``/v1`` and ``/v1beta``, ``python -m toollatch.scripted`` takes
``--host``/``--port``, and a kept-alive connection answers as quickly as a new one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import toollatch
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn, demo_script

# The SDKs are imported in the tests that use them, not at the top: every pytest-xdist worker
# collects every file, and importing both costs ~10 s of CPU.
DEMO_CALLS = [(c.call_id, c.name, json.loads(c.arguments)) for c in demo_script().turns[0].calls]
USER = [{"role": "user", "content": "Weather in Oslo and Zürich?"}]
ARGS = '{"path": "a.md", "content": "' + "x" * 40 + '"}'
CUT = Script(
    turns=(
        Turn(
            items=(Text(text="writing"), Call(call_id="c_cut", name="write_file", arguments=ARGS)),
            stop="max_tokens",
        ),
    )
)
BROKEN = Script(
    turns=(Turn(items=(Call(call_id="c_bad", name="write_file", arguments='{"path": '),)),)
)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer({"cut": CUT, "broken": BROKEN}, delay_scale=0) as s:
        yield s


def test_openai_chat_without_stream(server: ScriptedServer) -> None:
    from openai import OpenAI

    with OpenAI(base_url=server.base_url("openai_chat"), api_key="x") as client:
        done = client.chat.completions.create(model="scripted", messages=USER)  # type: ignore[arg-type]
        cut = client.chat.completions.create(model="cut", messages=USER)  # type: ignore[arg-type]
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me check the weather in both cities."
    got = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]  # type: ignore[union-attr]
    assert got == DEMO_CALLS
    assert done.usage is not None
    assert done.usage.total_tokens > 0
    # truncated: the half text a real server sends with ``length``
    assert cut.choices[0].finish_reason == "length"
    cut_call = cut.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert cut_call.function.arguments == ARGS[: len(ARGS) // 2]  # type: ignore[union-attr]


def test_openai_responses_without_stream(server: ScriptedServer) -> None:
    from openai import OpenAI

    with OpenAI(base_url=server.base_url("openai_responses"), api_key="x") as client:
        done = client.responses.create(model="scripted", input=USER)  # type: ignore[arg-type]
        cut = client.responses.create(model="cut", input=USER)  # type: ignore[arg-type]
    assert done.status == "completed"
    assert done.output_text == "Let me check the weather in both cities."
    got = [
        (i.call_id, i.name, json.loads(i.arguments))
        for i in done.output
        if i.type == "function_call"
    ]
    assert got == DEMO_CALLS
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    (call,) = [i for i in cut.output if i.type == "function_call"]
    assert call.status == "incomplete"
    assert call.arguments == ARGS[: len(ARGS) // 2]


def test_anthropic_without_stream(server: ScriptedServer) -> None:
    import anthropic
    from anthropic import Anthropic

    with Anthropic(base_url=server.base_url("anthropic"), api_key="x", max_retries=0) as client:
        done = client.messages.create(model="scripted", max_tokens=512, messages=USER)  # type: ignore[arg-type]
        cut = client.messages.create(model="cut", max_tokens=512, messages=USER)  # type: ignore[arg-type]
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="broken", max_tokens=512, messages=USER)  # type: ignore[arg-type]
    assert done.stop_reason == "tool_use"
    got = [(b.id, b.name, b.input) for b in done.content if b.type == "tool_use"]
    assert got == DEMO_CALLS
    # arguments are an object here: the cut call is left out, the stop reason says why
    assert cut.stop_reason == "max_tokens"
    assert [b.type for b in cut.content] == ["text"]
    assert "c_bad" in str(refused.value)
    assert "stream" in str(refused.value)


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_gemini_generate_content(server: ScriptedServer, version: str) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "Weather?"}]}]}
    with httpx.Client() as http:
        done = http.post(f"{server.url}/{version}/models/scripted:generateContent", json=body)
        cut = http.post(f"{server.url}/{version}/models/cut:generateContent", json=body)
    assert done.status_code == 200
    (candidate,) = done.json()["candidates"]
    calls = [p["functionCall"] for p in candidate["content"]["parts"] if "functionCall" in p]
    assert [(c["name"], c["args"]) for c in calls] == [(n, a) for _, n, a in DEMO_CALLS]
    assert candidate["finishReason"] == "STOP"
    (cut_candidate,) = cut.json()["candidates"]
    assert cut_candidate["finishReason"] == "MAX_TOKENS"
    assert cut_candidate["content"]["parts"] == [{"text": "writing"}]


def test_models_are_listed_for_each_sdk(server: ScriptedServer) -> None:
    from anthropic import Anthropic
    from openai import OpenAI

    with OpenAI(base_url=server.base_url("openai_chat"), api_key="x") as client:
        openai_ids = [m.id for m in client.models.list()]
    with Anthropic(base_url=server.base_url("anthropic"), api_key="x") as client:
        anthropic_ids = [m.id for m in client.models.list()]
    with httpx.Client() as http:
        gemini = http.get(server.url + "/v1beta/models").json()
    assert openai_ids == anthropic_ids == ["broken", "cut", "scripted"]
    assert [m["name"] for m in gemini["models"]] == [
        "models/broken",
        "models/cut",
        "models/scripted",
    ]


def _module_env() -> dict[str, str]:
    src = str(Path(toollatch.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_python_m_listens_on_the_given_host_and_port() -> None:
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "toollatch.scripted",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_module_env()) as child:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.strip() == f"toollatch scripted model server: http://127.0.0.1:{port}"
        # the port is taken now: a second server says so and exits 2
        taken = subprocess.run(
            [*command[:-1], str(port)],
            check=False,
            capture_output=True,
            text=True,
            env=_module_env(),
            timeout=30,
        )
        assert taken.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr
        with httpx.Client() as http:
            assert http.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=10) == 0


def test_a_kept_alive_request_answers_as_quickly_as_the_first(server: ScriptedServer) -> None:
    """Without TCP_NODELAY on the server's socket, every response after the first on a kept-
    alive connection waited for the client's delayed ACK (about 40 ms on Linux) before its
    body went out. The fastest of ten kept-alive requests must stay well under that."""
    body = {"model": "scripted", "stream": True, "messages": USER}
    url = server.base_url("openai_chat") + "/chat/completions"
    times = []
    with httpx.Client() as http:
        for _ in range(11):
            start = time.perf_counter()
            with http.stream("POST", url, json=body) as response:
                for _chunk in response.iter_raw():
                    pass
            times.append(time.perf_counter() - start)
    # the fastest: CPU load slows some requests, the delayed ACK holds back every one
    assert min(times[1:]) < 0.03, times
