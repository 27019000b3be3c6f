"""core/_recording.py: masking a recorded stream keeps it parseable and byte-exact where
nothing was masked."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from toollatch import StreamParser
from toollatch.core._recording import StreamMasker

KEY = "sk-proj-" + "abcdefghijklmnopqrstuvwxyz012345"


def masked(data: bytes, known: tuple[str, ...] = (), step: int | None = None) -> bytes:
    masker = StreamMasker(known)
    step = step or len(data) or 1
    out = b"".join(masker.feed(data[n : n + step]) for n in range(0, len(data), step))
    return out + masker.finish()


def test_lines_without_a_secret_keep_their_exact_bytes():
    data = b'event: x\nid: 7\ndata: {"a" : "b",  "c":[1, 2]}\n\ndata: [DONE]\n\n'
    assert masked(data) == data


def test_a_key_in_text_and_in_escaped_arguments_is_masked_and_the_json_still_parses():
    args = json.dumps({"api_key": KEY, "city": "Oslo"})
    event = {
        "choices": [
            {"delta": {"content": f"use {KEY}", "tool_calls": [{"function": {"arguments": args}}]}}
        ]
    }
    data = b"data: " + json.dumps(event).encode() + b"\r\n\r\n"
    out = masked(data, step=7)
    assert KEY.encode() not in out
    decoded = json.loads(out.split(b"\r\n")[0][6:])
    inner = json.loads(decoded["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"])
    assert inner["city"] == "Oslo"
    assert len(inner) == 2  # the same shape; the key's name is masked with its value
    assert out.endswith(b"\r\n\r\n")


def test_a_known_secret_is_masked_wherever_it_appears_whole():
    data = b'data: {"x": "my-own-upstream-secret!"}\n\nmy-own-upstream-secret\n'
    out = masked(data, known=("my-own-upstream-secret", "short"))
    assert b"my-own-upstream-secret" not in out
    assert masked(b"data: short\n", known=("short",)) == b"data: short\n"  # too short to mask


def test_a_lone_surrogate_escape_survives_masking():
    data = b'data: {"t": "\\ud800 ' + KEY.encode() + b'"}\n\n'
    out = masked(data)
    assert KEY.encode() not in out
    assert b"\\ud800" in out


def test_a_line_past_the_bound_is_written_out_masked_at_once():
    masker = StreamMasker(max_line_bytes=64)
    out = masker.feed(b"data: " + KEY.encode() * 4)  # no newline yet
    assert out
    assert KEY.encode() not in out
    assert masker.feed(b"\n") == b"\n"


def test_a_recorded_jsonl_stream_is_masked_line_by_line():
    data = json.dumps({"content": KEY}).encode() + b"\n"
    out = masked(data)
    assert KEY.encode() not in out
    assert json.loads(out)["content"].startswith("xx-xxxx-")


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=40))
def test_any_split_gives_the_same_bytes(data, step):
    assert masked(data, step=step) == masked(data)


def test_a_masked_stream_assembles_the_same_calls():
    args = '{"city": "Oslo", "note": "' + KEY + '"}'
    pieces = [args[:15], args[15:40], args[40:]]
    events = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "w", "arguments": pieces[0]},
                            }
                        ]
                    },
                }
            ]
        }
    ]
    events += [
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}
            ]
        }
        for p in pieces[1:]
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    data = (
        b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    )
    out = masked(data)
    assert KEY.encode() not in out
    parser = StreamParser("openai_chat")
    parser.feed(out)
    [call] = parser.finish().choices[0].calls
    assert call.committed is not None
    assert call.committed.arguments["city"] == "Oslo"
