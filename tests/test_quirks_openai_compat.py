"""Named quirk rules of OpenAI-compatible servers (QUIRKS.md Q1-Q23 and the bug-report list).

Each test replays a hand-written transcript at every standard chunking (whole, byte by byte,
7-byte pieces, random splits with empty pieces) and asserts the same round each time.
"""

from __future__ import annotations

import json

from chat_chunks import WEATHER_TOOLS, chunk, fragments, tc
from toollatch import CallState, ErrorCode, Limits, Round, RoundEnd
from toollatch.cli import round_json
from toollatch.stages import AnomalyKind, assistant_messages, error_results
from toollatch.testing import chunkings, replay, sse, summary


def stable(data: bytes, tools=WEATHER_TOOLS) -> Round:
    first = replay(data, "openai_chat", tools=tools)
    for pieces in chunkings(data, seed=len(data)):
        assert summary(replay(pieces, "openai_chat", tools=tools)) == summary(first)
    return first


def calls(r: Round):
    return [(c.call_id, c.name, c.state.value, c.arguments, c.error) for c in r.calls]


def kinds(r: Round):
    return [a.kind for a in r.anomalies]


def test_q1_missing_index_keys_by_id_then_by_the_open_call():
    # ollama/ollama#7881, openai/openai-python#2806: no "index" on tool-call deltas.
    r = stable(
        sse(
            chunk(tc(None, "c1", "get_weather", '{"city":')),
            chunk(tc(None, args='"Oslo"}')),
            chunk(tc(None, "c2", "get_time", "{}")),
            chunk(finish="tool_calls"),
            done=True,
        )
    )
    assert calls(r) == [
        ("c1", "get_weather", "committed", {"city": "Oslo"}, None),
        ("c2", "get_time", "committed", {}, None),
    ]


def test_q2_parallel_calls_all_on_index_0_with_distinct_ids():
    # BerriAI/litellm#5231, maximhq/bifrost#1961: must not become "get_weatherget_time".
    r = stable(
        sse(
            chunk(tc(0, "c1", "get_weather", "")),
            *fragments(0, '{"city": "Rome"}', 4),
            chunk(tc(0, "c2", "get_time", "")),
            *fragments(0, "{}", 1),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [
        ("c1", "get_weather", "committed", {"city": "Rome"}, None),
        ("c2", "get_time", "committed", {}, None),
    ]


def test_q2_same_index_without_ids_is_never_split_by_guessing():
    # smolagents#1958 / langchainjs#8433: '{"q":"A"}{"q":"B"}' under one index and no ids.
    # Nothing on the wire says a second call began, so the text stays one call and the strict
    # parse refuses it: nothing runs, and the model gets an invalid_json result.
    r = stable(
        sse(
            chunk(tc(0, None, "get_weather", '{"city": "A"}')),
            chunk(tc(0, None, "get_weather", '{"city": "B"}')),
            chunk(finish="tool_calls"),
        )
    )
    assert [(c.state, c.error) for c in r.calls] == [(CallState.FAILED, ErrorCode.INVALID_JSON)]
    assert AnomalyKind.SYNTHESIZED_ID in kinds(r)


def test_q3_id_repeated_on_every_chunk():
    # langchain4j/langchain4j#4544 (DeepSeek, Qwen): never "c1c1".
    r = stable(
        sse(
            *[chunk(tc(0, "c1", None, p)) for p in ('{"ci', 'ty": ', '"Oslo"}')],
            chunk(tc(0, "c1", "get_weather")),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [("c1", "get_weather", "committed", {"city": "Oslo"}, None)]


def test_q4_id_less_name_less_continuations_of_parallel_calls():
    # oracle/langchain-oracle#254, lobehub#11219: only the first call kept its arguments.
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", "")),
            chunk(tc(1, "b", "get_weather", "")),
            chunk(tc(0, args='{"city": "A"}')),
            chunk(tc(1, args='{"city": "B"}')),
            chunk(finish="tool_calls"),
        )
    )
    assert [c.arguments for c in r.calls] == [{"city": "A"}, {"city": "B"}]


def test_q4_index_zero_is_an_index_not_a_missing_value():
    # langchain-ai/langchain#40028: Mistral index 0 treated as falsy.
    r = stable(
        sse(chunk(tc(0, "a", "get_time", "{")), chunk(tc(0, args="}")), chunk(finish="stop"))
    )
    assert calls(r) == [("a", "get_time", "committed", {}, None)]


def test_q5_name_repeated_on_every_delta():
    # langchain#40044, llama.cpp#13800: never "get_weatherget_weather".
    r = stable(
        sse(
            *[
                chunk(tc(0, "a" if i == 0 else None, "get_weather", p))
                for i, p in enumerate(('{"city"', ': "Oslo"', "}"))
            ],
            chunk(finish="stop"),
        )
    )
    assert calls(r) == [("a", "get_weather", "committed", {"city": "Oslo"}, None)]


def test_q6_empty_string_name_and_id_on_continuations():
    # sgl-project/sglang#4700 (name ""), compat_alibaba fixture (id "").
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", "")),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "",
                            "type": "function",
                            "function": {"name": "", "arguments": '{"city": "X"}'},
                        }
                    ]
                }
            ),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [("a", "get_weather", "committed", {"city": "X"}, None)]
    assert r.anomalies == ()


def test_q7_arguments_before_the_name():
    r = stable(
        sse(
            chunk(tc(0, None, None, '{"city": ')),
            chunk(tc(0, None, None, '"Oslo"}')),
            chunk(tc(0, "late", "get_weather")),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [("late", "get_weather", "committed", {"city": "Oslo"}, None)]


def test_q8_whole_call_in_one_chunk_with_the_finish_reason():
    # Ollama (huggingface.js#1512), Mistral, Gemini compat.
    r = stable(sse(chunk(tc(0, "a", "get_weather", '{"city": "Oslo"}'), "tool_calls")))
    assert calls(r) == [("a", "get_weather", "committed", {"city": "Oslo"}, None)]


def test_q9_arguments_as_an_object_are_serialized_once():
    # ggml-org/llama.cpp#20198, huggingface/text-generation-inference#2136.
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", {"city": "Zürich", "days": 2})),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [("a", "get_weather", "committed", {"city": "Zürich", "days": 2}, None)]
    assert r.calls[0].arguments_text == '{"city":"Zürich","days":2}'
    assert kinds(r) == [AnomalyKind.OBJECT_ARGUMENTS]


def test_q9_object_arguments_mixed_with_text_fail_the_call():
    # an arguments object is the call's whole text: after other text it fails the call at
    # once ('{"a": ' + '{"x":1}' + '}' would even parse)
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", '{"city": ')),
            chunk(tc(0, args={"x": 1})),
            chunk(finish="tool_calls"),
        )
    )
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION


def test_q10_null_or_missing_arguments_for_a_tool_with_required_parameters():
    # vllm-project/vllm#31501 (also #9693, #47901): lost arguments become {} -> schema failure,
    # never a silent run with no arguments.
    data = sse(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": None},
                    }
                ]
            }
        ),
        chunk(finish="tool_calls"),
    )
    r = stable(data)
    assert calls(r) == [("a", "get_weather", "failed", None, ErrorCode.SCHEMA_VIOLATION)]
    assert "city" in r.calls[0].detail


def test_q11_arguments_duplicated_by_an_end_of_stream_flush():
    # vllm-project/vllm#51697, lidge-jun/opencodex#361: never "repaired".
    for text in ('{"city": "Oslo"}{"city": "Oslo"}', '{{"city": "Oslo"}'):
        r = stable(sse(chunk(tc(0, "a", "get_weather", text)), chunk(finish="tool_calls")))
        assert r.calls[0].error is ErrorCode.INVALID_JSON and r.calls[0].arguments is None


def test_q12_finish_reason_stop_with_tool_calls():
    # vllm#25054, googleapis/python-genai#2868.
    r = stable(sse(chunk(tc(0, "a", "get_time", "{}")), chunk(finish="stop"), done=True))
    assert r.calls[0].state is CallState.COMMITTED


def test_q15_truncation_reported_as_tool_calls_with_invalid_json():
    # MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#55: the history must not replay the text.
    r = stable(
        sse(
            chunk(tc(0, "a", "write_file", '{"path": "a.md", "content": "abc')),
            chunk(finish="tool_calls"),
        )
    )
    assert r.calls[0].error is ErrorCode.INVALID_JSON
    assert assistant_messages(r)[0]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_q19_multi_tool_use_parallel_wrapper_is_expanded_through_the_gate():
    # OpenAI models, handled by LiteLLM handle_parallel_tool_calls.py.
    wrapper = json.dumps(
        {
            "tool_uses": [
                {"recipient_name": "functions.get_weather", "parameters": {"city": "Oslo"}},
                {"recipient_name": "functions.get_weather", "parameters": {"town": "Bergen"}},
            ]
        }
    )
    r = stable(
        sse(
            chunk(tc(0, "call_W", "multi_tool_use.parallel", "")),
            *fragments(0, wrapper, 9),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [
        ("call_W_0", "get_weather", "committed", {"city": "Oslo"}, None),
        ("call_W_1", "get_weather", "failed", None, ErrorCode.SCHEMA_VIOLATION),
    ]
    assert AnomalyKind.WRAPPER_EXPANDED in kinds(r)
    assert [c["id"] for c in assistant_messages(r)[0]["tool_calls"]] == ["call_W_0", "call_W_1"]


def test_q19_wrapper_is_not_expanded_after_truncation():
    wrapper = json.dumps(
        {"tool_uses": [{"recipient_name": "functions.get_time", "parameters": {}}]}
    )
    r = stable(sse(chunk(tc(0, "w", "multi_tool_use.parallel", wrapper)), chunk(finish="length")))
    assert calls(r) == [("w", "multi_tool_use.parallel", "failed", None, ErrorCode.TRUNCATED)]


def test_bug3_sparse_reused_and_omitted_indexes():
    # vercel/ai#18333, camel-ai/camel#3662 (index reused with a new id -> "Extra data").
    r = stable(
        sse(
            chunk(tc(1, "a", "get_time", "{}")),
            chunk(tc(3, "b", "get_time", "{}")),
            chunk(tc(1, "c", "get_weather", '{"city": "X"}')),
            chunk(tc(None, "d", "get_time", "{}")),
            chunk(finish="tool_calls"),
        )
    )
    assert [(c.call_id, c.state.value) for c in r.calls] == [
        ("a", "committed"),
        ("b", "committed"),
        ("c", "committed"),
        ("d", "committed"),
    ]


def test_bug23_no_tool_deltas_and_stop_means_no_phantom_calls():
    # earendil-works/pi#1125.
    r = stable(sse(chunk({"content": "Done."}), chunk(finish="stop"), done=True))
    assert r.calls == () and r.text == "Done." and r.ended is RoundEnd.NORMAL


def test_error_event_mid_stream_gives_zero_calls_and_surfaces_the_error():
    # compat_groq/tool_use_failed_error_event.sse in the corpus, hand-written here.
    data = sse(chunk({"reasoning": "thinking"})) + (
        b'event: error\ndata: {"error":{"message":"tool call validation failed",'
        b'"type":"invalid_request_error","code":"tool_use_failed"}}\n\n'
    )
    r = stable(data)
    assert r.calls == () and r.ended is RoundEnd.INTERRUPTED
    assert "tool_use_failed" in (r.error or "")


def test_n2_choices_interleaved_are_separate_sets_of_calls():
    # compat_watsonx fixture: keys are (choice, index); JSON output gains "choices".
    data = sse(
        chunk(tc(0, "a0", "get_weather", ""), index=0),
        chunk(tc(0, "b0", "get_time", ""), index=1),
        chunk(tc(0, args='{"city": "A"}'), index=0),
        chunk(tc(0, args="{}"), index=1),
        chunk(finish="tool_calls", index=1),
        chunk(finish="tool_calls", index=0),
    )
    r = stable(data)
    assert [[(c.call_id, c.arguments) for c in ch.calls] for ch in r.choices] == [
        [("a0", {"city": "A"})],
        [("b0", {})],
    ]
    out = round_json("x.sse", r)
    assert [c["id"] for c in out["calls"]] == ["a0"]
    assert [[c["id"] for c in ch["calls"]] for ch in out["choices"]] == [["a0"], ["b0"]]


def test_q17_one_character_deltas():
    # earendil-works/pi#9062: Azure sends one-character deltas.
    text = json.dumps({"path": "a.md", "content": "x" * 300 + "é😀"}, ensure_ascii=False)
    r = stable(
        sse(chunk(tc(0, "a", "write_file", "")), *fragments(0, text, 1), chunk(finish="stop"))
    )
    assert r.calls[0].arguments["content"].endswith("é😀")


def test_q20_extra_content_thought_signature_goes_back_with_its_call():
    # open-webui/computer#224: Gemini's OpenAI-compatible endpoint sends
    # tool_calls[].extra_content.google.thought_signature; dropping it breaks the next turn.
    extra = {"google": {"thought_signature": "c2ln+/=="}}
    entry = {
        "index": 0,
        "id": "g1",
        "type": "function",
        "extra_content": extra,
        "function": {"name": "get_time", "arguments": "{}"},
    }
    r = stable(
        sse(
            chunk({"tool_calls": [entry]}),
            chunk(tc(1, "g2", "get_time", "{}")),
            chunk(finish="stop"),
        )
    )
    assert [c.state for c in r.calls] == [CallState.COMMITTED] * 2
    tool_calls = assistant_messages(r)[0]["tool_calls"]
    assert tool_calls[0]["extra_content"] == extra and "extra_content" not in tool_calls[1]


# -- issue 11: paths to a wrong commit, OpenAI chat ---------------------------------------------


def test_a_fragment_after_the_finish_reason_fails_its_call():
    late = chunk(tc(0, args='/../../etc/passwd"}'))
    r = stable(
        sse(
            chunk(tc(0, "a", "write_file", '{"path":"/safe","content":"x"}')),
            chunk(finish="tool_calls"),
            late,
            done=True,
        )
    )
    assert calls(r) == [("a", "write_file", "failed", None, ErrorCode.PROTOCOL_VIOLATION)]
    assert AnomalyKind.FRAGMENT_AFTER_CLOSE in kinds(r)


def test_a_fragment_after_done_fails_its_call():
    data = sse(
        chunk(tc(0, "a", "get_weather", '{"city":"Oslo"')),
        chunk(tc(0, args="}")),
        chunk(finish="tool_calls"),
        done=True,
    ) + sse(chunk(tc(0, args=" ")))
    r = stable(data)
    assert calls(r) == [("a", "get_weather", "failed", None, ErrorCode.PROTOCOL_VIOLATION)]
    assert kinds(r)[:2] == [AnomalyKind.EVENT_AFTER_END, AnomalyKind.EVENT_AFTER_END]


def test_a_call_opened_after_the_end_is_never_closed_and_fails():
    r = stable(
        sse(
            chunk(tc(0, "a", "get_time", "{}")),
            chunk(finish="tool_calls"),
            chunk(tc(1, "b", "get_time", "{}")),
            done=True,
        )
    )
    assert calls(r) == [
        ("a", "get_time", "committed", {}, None),
        ("b", "get_time", "failed", None, ErrorCode.PROTOCOL_VIOLATION),
    ]
    assert AnomalyKind.NEVER_CLOSED in kinds(r)
    assert [e.tool_call_id for e in error_results(r)] == ["b"]


def test_an_unreadable_chunk_while_a_call_is_open_fails_it():
    # The middle fragment's chunk is lost: what committed would not be what was sent.
    head = chunk(tc(0, "a", "write_file", '{"path":"/safe'))
    lost = json.dumps(chunk(tc(0, args="/../../etc/passwd"))).replace('"index": 0', '"index": 0,')
    for middle in (lost, "{not json", '{"choices": "\\ud800"}', "[1, 2]"):
        r = stable(
            sse(head, middle, chunk(tc(0, args='","content":"x"}')), chunk(finish="tool_calls"))
        )
        assert calls(r) == [("a", "write_file", "failed", None, ErrorCode.PROTOCOL_VIOLATION)]
        assert AnomalyKind.INVALID_PAYLOAD in kinds(r)


def test_q9_object_arguments_with_a_repeated_key_fail():
    raw = (
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":'
        '{"name":"get_weather","arguments":{"city":"Oslo","city":"Rome"}}}]}}]}'
    )
    r = stable(sse(raw, chunk(finish="tool_calls")))
    assert calls(r) == [("a", "get_weather", "failed", None, ErrorCode.PROTOCOL_VIOLATION)]
    assert AnomalyKind.DUPLICATE_KEY in kinds(r)
    # Repeated keys in argument *text* were always refused by the gate's strict parse.
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", '{"city":"Oslo","city":"Rome"}')),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [("a", "get_weather", "failed", None, ErrorCode.INVALID_JSON)]


def test_numbers_no_double_holds_never_commit():
    for text in ('{"city":"Oslo","days":1e999}', '{"city":"Oslo","days":-1E400}'):
        r = stable(
            sse(chunk(tc(0, "a", "get_weather", text)), chunk(finish="tool_calls")), tools=None
        )
        assert calls(r) == [("a", "get_weather", "failed", None, ErrorCode.INVALID_JSON)]
    big = '{"n":18446744073709551616}'  # an integer survives exactly
    r = stable(sse(chunk(tc(0, "a", "f", big)), chunk(finish="tool_calls")), tools=None)
    assert r.calls[0].arguments == {"n": 2**64}
    assert json.loads(json.dumps(r.calls[0].arguments)) == r.calls[0].arguments


def test_q19_expanded_ids_never_equal_a_real_call_id():
    wrapper = json.dumps(
        {
            "tool_uses": [
                {"recipient_name": "functions.get_time", "parameters": {}},
                {"recipient_name": "functions.get_time", "parameters": {}},
            ]
        }
    )
    r = stable(
        sse(
            chunk(tc(0, "w", "multi_tool_use.parallel", wrapper)),
            chunk(tc(1, "w_0", "get_time", "{}")),
            chunk(finish="tool_calls"),
        )
    )
    ids = [c.call_id for c in r.calls]
    assert len(set(ids)) == len(ids) == 3 and "w_0" in ids
    assert [c.state for c in r.calls] == [CallState.COMMITTED] * 3
    assert [c["id"] for c in assistant_messages(r)[0]["tool_calls"]] == ids


def test_q19_a_wrapper_with_one_inner_call_is_expanded():
    wrapper = json.dumps(
        {"tool_uses": [{"recipient_name": "functions.get_time", "parameters": {}}]}
    )
    r = stable(
        sse(chunk(tc(0, "w", "multi_tool_use.parallel", wrapper)), chunk(finish="tool_calls"))
    )
    assert calls(r) == [("w_0", "get_time", "committed", {}, None)]
    assert AnomalyKind.WRAPPER_EXPANDED in kinds(r)


def test_q19_expansion_respects_the_call_limit():
    wrapper = json.dumps(
        {"tool_uses": [{"recipient_name": "functions.get_time", "parameters": {}}] * 3}
    )
    data = sse(chunk(tc(0, "w", "multi_tool_use.parallel", wrapper)), chunk(finish="tool_calls"))
    r = replay(data, "openai_chat", tools=WEATHER_TOOLS, limits=Limits(max_calls_per_round=2))
    assert [c.error for c in r.calls] == [None, None, ErrorCode.TOO_MANY_TOOL_CALLS]


def test_q19_a_malformed_or_user_defined_wrapper_is_not_expanded():
    bad = json.dumps({"tool_uses": [{"recipient_name": 3, "parameters": {}}]})
    r = stable(sse(chunk(tc(0, "w", "multi_tool_use.parallel", bad)), chunk(finish="tool_calls")))
    assert calls(r) == [("w", "multi_tool_use.parallel", "failed", None, ErrorCode.UNKNOWN_TOOL)]
    mine = [*WEATHER_TOOLS, {"name": "multi_tool_use.parallel", "parameters": {"type": "object"}}]
    good = json.dumps({"tool_uses": [{"recipient_name": "functions.get_time", "parameters": {}}]})
    r = stable(
        sse(chunk(tc(0, "w", "multi_tool_use.parallel", good)), chunk(finish="tool_calls")),
        tools=mine,
    )
    assert [(c.name, c.state) for c in r.calls] == [
        ("multi_tool_use.parallel", CallState.COMMITTED)
    ]
    assert AnomalyKind.WRAPPER_EXPANDED not in kinds(r)


def test_a_known_id_at_another_index_is_a_new_call_not_the_first_one():
    # Issue 12: the index is present and differs, so it is a second call reusing the id; the
    # first call keeps its complete text, the second fails as a duplicate id.
    r = stable(
        sse(
            chunk(tc(0, "a", "get_time", "{}")),
            chunk(tc(1, "a", "get_weather", '{"city":')),
            chunk(tc(1, args='"Oslo"}')),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [
        ("a", "get_time", "committed", {}, None),
        ("a", "get_weather", "failed", None, ErrorCode.DUPLICATE_CALL_ID),
    ]


def test_a_repeated_id_on_its_own_index_stays_the_same_call():
    r = stable(
        sse(
            chunk(tc(0, "a", "get_weather", '{"city":')),
            chunk(tc(1, "b", "get_time", "{}")),
            chunk(tc(0, "a", args='"Oslo"}')),
            chunk(finish="tool_calls"),
        )
    )
    assert calls(r) == [
        ("a", "get_weather", "committed", {"city": "Oslo"}, None),
        ("b", "get_time", "committed", {}, None),
    ]
