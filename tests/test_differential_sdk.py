"""Differential tests: toollatch against the official SDKs' own stream accumulators.

Test-only dependencies: ``openai`` and ``anthropic`` (``pip install openai anthropic``, or the
package's ``openai``/``anthropic`` extras). Without one of them its tests are skipped
(``pytest.importorskip``), never failed.

The same recorded bytes go through each SDK's *public* streaming helper
(``client.chat.completions.stream(...).get_final_completion()``,
``client.responses.stream(...).get_final_response()``,
``client.messages.stream(...).get_final_message()``), served by an in-memory transport of the
HTTP library the SDK itself uses, so SSE framing, event parsing and accumulation are all the
SDK's own. toollatch replays the same bytes. For well-formed streams the committed calls must
equal the SDK's final tool calls (id, name, parsed arguments), and the text, reasoning and
server-tool blocks must agree too.

Where the two differ by design, a separate test pins the exact difference and says in its
docstring why toollatch's answer is the one that may reach execution. JSONL recordings (event
payloads without SSE framing) are framed as SSE for the SDKs, with the ``event:`` name from the
payload's ``type`` for Anthropic, which is how those APIs send them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import CORPUS, corpus_dir
from sdk_clients import client
from toollatch import CallState, ErrorCode, Round, RoundEnd
from toollatch.cli import replay_bytes
from toollatch.stages import (
    AnomalyKind,
    ReasoningBlock,
    ServerToolBlock,
    assistant_messages,
    error_results,
)
from toollatch.testing import replay, sse

# -- running the SDKs on recorded bytes --------------------------------------------------------


def sdk_chat(body: bytes) -> Any:
    with client("openai", body).chat.completions.stream(model="m", messages=[]) as stream:
        return stream.get_final_completion()


def sdk_responses(body: bytes) -> Any:
    with client("openai", body).responses.stream(model="m", input="hi") as stream:
        return stream.get_final_response()


def sdk_anthropic(body: bytes) -> Any:
    messages = client("anthropic", body).messages
    with messages.stream(model="m", max_tokens=16, messages=[]) as stream:
        return stream.get_final_message()


def as_sse(raw: bytes, *, named: bool = False) -> bytes:
    """SSE bytes for an ``.sse`` recording (unchanged) or a JSONL one (framed)."""
    if raw.lstrip()[:1] != b"{":
        return raw
    out = bytearray()
    for line in raw.splitlines():
        if not line.strip():
            continue
        if named:
            out += f"event: {json.loads(line)['type']}\n".encode()
        out += b"data: " + line + b"\n\n"
    return bytes(out)


# -- the corpus ----------------------------------------------------------------------------------


def _expected() -> dict[str, Any]:
    path = CORPUS / "expected.json"
    return json.loads(path.read_text()) if path.is_file() else {}


EXPECTED = _expected()


def _files(fmt: str, *, leave_out: frozenset[str]) -> list[str]:
    found = [rel for rel, e in sorted(EXPECTED.items()) if e["format"] == fmt]
    return [rel for rel in found if rel not in leave_out] or ["<corpus absent>"]


def recorded(rel: str) -> tuple[bytes, Round]:
    """The raw bytes of a recording and toollatch's round for them."""
    raw = (corpus_dir() / rel).read_bytes()
    return raw, replay_bytes(raw, name=Path(rel).name)


NO_INDEX = frozenset(
    {
        "compat_gemini_openai/no_index_finish_stop.sse",
        "compat_mistral/no_index_finish_in_same_chunk.jsonl",
        "compat_mistral/parallel_no_index.sse",
        "compat_ollama/v1_no_index_finish_stop.sse",
    }
)
REPEATED_ID = "compat_openrouter/kimi_k2_id_and_name_repeated.sse"
NO_FINISH = "compat_tgi/id_repeated_no_finish_reason.jsonl"
ERROR_EVENT = "compat_groq/tool_use_failed_error_event.sse"
CHAT_DIFFERENT = NO_INDEX | {REPEATED_ID, NO_FINISH, ERROR_EVENT}
ANTHROPIC_TRUNCATED = "anthropic/max_tokens_truncated_tool_use.sse"
ANTHROPIC_MCP = "anthropic/thinking_then_mcp_tool_use.sse"


def committed_calls(round_: Round, choice: int = 0) -> list[tuple[str | None, str | None, Any]]:
    calls = round_.choices[choice].calls
    assert all(c.state is CallState.COMMITTED for c in calls), [(c.error, c.detail) for c in calls]
    return [(c.call_id, c.name, c.arguments) for c in calls]


# -- OpenAI Chat Completions ---------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("rel", _files("openai_chat", leave_out=CHAT_DIFFERENT))
def test_chat_streams_agree_with_chat_completion_stream_state(rel):
    raw, ours = recorded(rel)
    final = sdk_chat(as_sse(raw))
    assert len(final.choices) == len(ours.choices)
    for sdk_choice, our_choice in zip(final.choices, ours.choices, strict=True):
        sdk_calls = [
            (t.id, t.function.name, json.loads(t.function.arguments))
            for t in sdk_choice.message.tool_calls or []
        ]
        assert committed_calls(ours, our_choice.index) == sdk_calls
        assert our_choice.text == (sdk_choice.message.content or "")
        assert our_choice.stop_reason == sdk_choice.finish_reason


@pytest.mark.corpus
@pytest.mark.parametrize("rel", sorted(NO_INDEX))
def test_chat_tool_calls_without_index_crash_the_sdk_and_commit_here(rel):
    """Ollama (ollama#7881), Mistral and Gemini's OpenAI endpoint omit ``tool_calls[].index``.

    ``ChatCompletionStreamState`` indexes its call list with ``None`` and raises ``TypeError``
    before user code sees a call (openai-python#2806). toollatch keys such a call by its id,
    else by "the open call", and commits exactly the calls in expected.json, because the
    protocol still announced the end of the round.
    """
    raw, ours = recorded(rel)
    with pytest.raises(TypeError, match="NoneType"):
        sdk_chat(as_sse(raw))
    want = [c for c in EXPECTED[rel]["calls"] if "kind" not in c]
    got = committed_calls(ours)
    assert [(name, args) for _, name, args in got] == [(c["name"], c["arguments"]) for c in want]


@pytest.mark.corpus
def test_chat_repeated_id_and_name_are_concatenated_by_the_sdk():
    """OpenRouter/Kimi repeats ``id: "0"`` and ``name: "llm_version"`` on every chunk.

    The SDK appends every repeat, producing a call ``"00"`` to a tool
    ``"llm_versionllm_version"`` that does not exist; toollatch treats an identical repeat as a
    no-op and commits the call the model made.
    """
    raw, ours = recorded(REPEATED_ID)
    (sdk_call,) = sdk_chat(as_sse(raw)).choices[0].message.tool_calls
    assert (sdk_call.id, sdk_call.function.name) == ("00", "llm_versionllm_version")
    assert committed_calls(ours) == [("0", "llm_version", {})]


@pytest.mark.corpus
def test_chat_stream_without_finish_reason_is_a_call_for_the_sdk_and_not_here():
    """TGI's recorded stream ends with neither a ``finish_reason`` nor ``[DONE]``.

    The SDK returns a final completion whose call id is ``"0"`` repeated 17 times (one per
    chunk) and whose arguments parse, with ``finish_reason`` None: nothing says the output was
    complete, yet the call looks runnable. toollatch fails it ``stream_interrupted`` and pairs
    an error result with the provider's id, because a stream that simply stops is not an end.
    """
    raw, ours = recorded(NO_FINISH)
    choice = sdk_chat(as_sse(raw)).choices[0]
    (sdk_call,) = choice.message.tool_calls
    assert choice.finish_reason is None
    assert sdk_call.id == "0" * 17
    assert json.loads(sdk_call.function.arguments) == {
        "location": "Brooklyn, NY",
        "format": "fahrenheit",
    }
    (call,) = ours.calls
    assert (call.call_id, call.state, call.error) == (
        "0",
        CallState.FAILED,
        ErrorCode.STREAM_INTERRUPTED,
    )
    assert error_results(ours)[0].tool_call_id == "0"


@pytest.mark.corpus
def test_chat_error_event_raises_in_the_sdk_and_ends_the_round_here():
    """Groq sends ``event: error`` (tool_use_failed) instead of a call.

    The SDK raises ``APIError`` out of the iterator; toollatch returns an interrupted round
    with no calls and the provider's message in ``round.error``, so an agent loop can record
    it and decide, without an exception crossing its stream loop.
    """
    openai = pytest.importorskip("openai")
    raw, ours = recorded(ERROR_EVENT)
    with pytest.raises(openai.APIError, match="tool call validation failed"):
        sdk_chat(as_sse(raw))
    assert ours.calls == ()
    assert ours.ended is RoundEnd.INTERRUPTED
    assert "tool call validation failed" in (ours.error or "").lower()


def _chat(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }


def _chat_call(args: str, call_id: str | None = "call_1") -> dict[str, Any]:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": args}}
    if call_id:
        call.update(id=call_id, type="function")
        call["function"]["name"] = "get_weather"
    return _chat({"tool_calls": [call]})


def test_chat_duplicated_arguments_are_a_string_for_the_sdk_and_invalid_here():
    """A server repeating the whole argument text (``{...}{...}``, seen from vLLM/Ollama
    parsers) gives the SDK one call whose ``arguments`` no JSON parser accepts. toollatch's
    single strict parse fails it ``invalid_json``; it is never "repaired" to the first object.
    """
    body = sse(
        _chat_call('{"city": "Paris"}'),
        _chat_call('{"city": "Paris"}', call_id=None),
        _chat(finish="tool_calls"),
        done=True,
    )
    (sdk_call,) = sdk_chat(body).choices[0].message.tool_calls
    assert sdk_call.function.arguments == '{"city": "Paris"}{"city": "Paris"}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(sdk_call.function.arguments)
    (call,) = replay(body, "openai_chat").calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.INVALID_JSON)


def test_chat_length_finish_raises_in_the_sdk_and_fails_only_the_call_here():
    """``finish_reason: length`` mid-arguments: ``get_final_completion`` raises
    ``LengthFinishReasonError`` for the whole completion. toollatch keeps the round (text,
    usage) and fails the cut call ``truncated`` with a paired error result."""
    openai = pytest.importorskip("openai")
    body = sse(
        _chat({"content": "Checking."}),
        _chat_call('{"city": "Pa'),
        _chat(finish="length"),
        done=True,
    )
    with pytest.raises(openai.LengthFinishReasonError):
        sdk_chat(body)
    ours = replay(body, "openai_chat")
    assert ours.text == "Checking."
    (call,) = ours.calls
    assert (call.state, call.error, call.arguments) == (
        CallState.FAILED,
        ErrorCode.TRUNCATED,
        None,
    )
    assert [r.tool_call_id for r in error_results(ours)] == ["call_1"]


# -- OpenAI Responses ------------------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("rel", _files("openai_responses", leave_out=frozenset()))
def test_responses_streams_agree_with_the_sdk_response_stream(rel):
    """Calls, text, and reasoning/hosted items agree. The one difference: the API re-encrypts a
    reasoning item's ``encrypted_content`` in each event that repeats it; the SDK keeps the
    copy in ``response.completed``, toollatch the one in ``output_item.done``. Both are the
    provider's own values for the same item."""
    raw, ours = recorded(rel)
    final = sdk_responses(as_sse(raw))
    sdk_calls = [
        (o.call_id, o.name, json.loads(o.arguments))
        for o in final.output
        if o.type == "function_call"
    ]
    assert committed_calls(ours) == sdk_calls
    assert ours.text == final.output_text

    def opaque(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k != "encrypted_content"}

    sdk_items = [
        opaque(o.to_dict()) for o in final.output if o.type not in ("function_call", "message")
    ]
    assert [opaque(dict(b.data)) for b in ours.blocks] == sdk_items


_RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m"}


def _responses_call(arguments: str, final_arguments: str | None = None) -> bytes:
    """One function call streamed as ``arguments``; the provider's ``.done`` events and the
    completed response carry ``final_arguments`` (default: the same text)."""
    final = arguments if final_arguments is None else final_arguments
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather"}
    done_item = {**item, "arguments": final, "status": "completed"}
    return sse(
        {
            "type": "response.created",
            "response": {**_RESPONSE, "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "arguments": "", "status": "in_progress"},
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": arguments,
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": 0,
            "arguments": final,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {
            "type": "response.completed",
            "response": {**_RESPONSE, "status": "completed", "output": [done_item]},
        },
    )


def test_responses_agree_on_a_hand_written_call():
    body = _responses_call('{"city": "Paris"}')
    (sdk_call,) = sdk_responses(body).output
    assert (sdk_call.call_id, json.loads(sdk_call.arguments)) == ("call_1", {"city": "Paris"})
    assert committed_calls(replay(body, "openai_responses")) == [
        ("call_1", "get_weather", {"city": "Paris"})
    ]


def test_responses_done_text_that_contradicts_the_deltas_wins_in_the_sdk_and_fails_here():
    """The ``.done`` events repeat the full argument text. When they disagree with the
    fragments that were streamed (a broken proxy or server), the SDK silently returns the
    ``.done`` text; toollatch cannot know which one the model meant, records an
    ``arguments_mismatch`` anomaly and fails the call ``protocol_violation``."""
    body = _responses_call('{"city": "Paris"}', final_arguments='{"city": "Lyon"}')
    (sdk_call,) = sdk_responses(body).output
    assert json.loads(sdk_call.arguments) == {"city": "Lyon"}
    ours = replay(body, "openai_responses")
    (call,) = ours.calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION)
    assert AnomalyKind.ARGUMENTS_MISMATCH in {a.kind for a in ours.anomalies}


def test_responses_duplicated_arguments_are_a_string_for_the_sdk_and_invalid_here():
    """Same as the chat case: ``{...}{...}`` reaches the SDK user as a call; never here."""
    body = _responses_call('{"city": "Paris"}{"city": "Paris"}')
    (sdk_call,) = sdk_responses(body).output
    assert sdk_call.arguments == '{"city": "Paris"}{"city": "Paris"}'
    (call,) = replay(body, "openai_responses").calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.INVALID_JSON)


def test_responses_incomplete_raises_in_the_sdk_and_fails_only_the_call_here():
    """``response.incomplete`` (max_output_tokens) mid-call: the SDK's
    ``get_final_response`` raises because no ``response.completed`` came; toollatch ends the
    round ``truncated`` and pairs the cut call with a ``truncated`` error result."""
    body = sse(
        {
            "type": "response.created",
            "response": {**_RESPONSE, "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": "",
                "status": "in_progress",
            },
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": '{"city": "Pa',
        },
        {
            "type": "response.incomplete",
            "response": {
                **_RESPONSE,
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
            },
        },
    )
    with pytest.raises(RuntimeError, match=r"response\.completed"):
        sdk_responses(body)
    ours = replay(body, "openai_responses")
    assert ours.ended is RoundEnd.TRUNCATED
    (error,) = error_results(ours)
    assert (error.tool_call_id, error.code) == ("call_1", ErrorCode.TRUNCATED)


# -- Anthropic Messages ----------------------------------------------------------------------------


def _anthropic_blocks(message: Any, kind: str) -> list[dict[str, Any]]:
    return [b.to_dict() for b in message.content if b.type == kind]


@pytest.mark.corpus
@pytest.mark.parametrize("rel", _files("anthropic", leave_out=frozenset({ANTHROPIC_TRUNCATED})))
def test_anthropic_streams_agree_with_the_sdk_accumulator(rel):
    """tool_use input vs committed arguments; thinking text and signature; server_tool_use
    blocks; and the text. (``mcp_tool_use`` input: see the test below.)"""
    raw, ours = recorded(rel)
    final = sdk_anthropic(as_sse(raw, named=True))
    sdk_calls = [(b["id"], b["name"], b["input"]) for b in _anthropic_blocks(final, "tool_use")]
    assert committed_calls(ours) == sdk_calls
    assert ours.text == "".join(b.text for b in final.content if b.type == "text")
    thinking = [(b["thinking"], b["signature"]) for b in _anthropic_blocks(final, "thinking")]
    ours_thinking = [
        (b.data["thinking"], b.data["signature"])
        for b in ours.blocks
        if isinstance(b, ReasoningBlock) and b.data.get("type") == "thinking"
    ]
    assert ours_thinking == thinking
    server = [(b["id"], b["name"], b["input"]) for b in _anthropic_blocks(final, "server_tool_use")]
    ours_server = [
        (b.data["id"], b.data["name"], b.data["input"])
        for b in ours.blocks
        if isinstance(b, ServerToolBlock) and b.data.get("type") == "server_tool_use"
    ]
    assert ours_server == server


@pytest.mark.corpus
def test_anthropic_max_tokens_cut_is_a_partial_input_in_the_sdk_and_a_failed_call_here():
    """The SDK fixture itself: ``make_file`` cut by ``max_tokens`` with no
    ``content_block_stop``. The SDK's final message has a ``tool_use`` block whose ``input``
    is a partial parse (a list missing its unfinished last line) that looks complete; a caller
    that runs ``tool_use`` blocks writes a truncated file. toollatch fails the call
    ``truncated``, writes ``{}`` to history and pairs an error result."""
    raw, ours = recorded(ANTHROPIC_TRUNCATED)
    final = sdk_anthropic(as_sse(raw, named=True))
    assert final.stop_reason == "max_tokens"
    (block,) = _anthropic_blocks(final, "tool_use")
    assert block["input"]["filename"] == "taxes.txt"
    assert isinstance(block["input"]["lines_of_text"], list)
    assert block["input"]["lines_of_text"]  # something runnable-looking
    (call,) = ours.calls
    assert (call.state, call.error, call.arguments) == (
        CallState.FAILED,
        ErrorCode.TRUNCATED,
        None,
    )
    tool_use = [b for b in assistant_messages(ours)[0]["content"] if b["type"] == "tool_use"]
    assert [b["input"] for b in tool_use] == [{}]
    assert error_results(ours)[0].content.startswith("truncated: ")


@pytest.mark.corpus
def test_anthropic_mcp_tool_use_input_is_dropped_by_the_sdk_and_kept_here():
    """``mcp_tool_use`` streams its input as ``input_json_delta`` like ``tool_use``, but the
    SDK only accumulates input for the block types it tracks, so its final block keeps the
    ``{}`` from ``content_block_start``. History must carry the block as the model produced it;
    toollatch's server-tool block has the streamed input (the one in expected.json)."""
    raw, ours = recorded(ANTHROPIC_MCP)
    final = sdk_anthropic(as_sse(raw, named=True))
    (sdk_block,) = _anthropic_blocks(final, "mcp_tool_use")
    assert sdk_block["input"] == {}
    (want,) = EXPECTED[ANTHROPIC_MCP]["calls"]
    (mcp,) = [b for b in assistant_messages(ours)[0]["content"] if b["type"] == "mcp_tool_use"]
    assert (mcp["id"], mcp["input"]) == (want["id"], want["arguments"])
    assert mcp["input"]


def _anthropic(*events: dict[str, Any]) -> bytes:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    }
    end: list[dict[str, Any]] = [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    return sse(start, *events, *end, named=True)


def _anthropic_tool(*fragments: str) -> Iterator[dict[str, Any]]:
    yield {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    }
    for fragment in fragments:
        yield {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": fragment},
        }
    yield {"type": "content_block_stop", "index": 0}


def test_anthropic_duplicated_input_is_silently_merged_by_the_sdk_and_invalid_here():
    """``{"city": "Paris"}{"city": "Paris"}``: the SDK's partial-mode parser stops after the
    first object, so its final ``input`` looks like a clean call. The model's output was not
    one JSON object; toollatch fails it ``invalid_json`` instead of guessing."""
    body = _anthropic(*_anthropic_tool('{"city": "Paris"}', '{"city": "Paris"}'))
    (block,) = _anthropic_blocks(sdk_anthropic(body), "tool_use")
    assert block["input"] == {"city": "Paris"}
    (call,) = replay(body, "anthropic").calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.INVALID_JSON)


def test_anthropic_invalid_input_aborts_the_sdk_stream_and_fails_one_call_here():
    """Invalid input JSON makes the SDK raise ``ValueError`` mid-stream: the whole message,
    including other calls, is lost. toollatch fails that call ``invalid_json`` and the round
    (with its other blocks) is still returned."""
    body = _anthropic(*_anthropic_tool('{"city": ', "}"))
    with pytest.raises(ValueError, match="Unable to parse tool parameter JSON"):
        sdk_anthropic(body)
    ours = replay(body, "anthropic")
    (call,) = ours.calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.INVALID_JSON)
    assert ours.ended is RoundEnd.NORMAL
