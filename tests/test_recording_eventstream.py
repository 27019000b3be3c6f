"""core/_recording.py's EventStreamMasker: a Bedrock answer (AWS event stream) masked frame
by frame, every frame framed again with its CRCs, whatever the read boundaries."""

from __future__ import annotations

import itertools
import json

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import StreamParser
from toollatch.core._errors import StreamDecodeError
from toollatch.core._eventstream import EventStreamDecoder, encode_message
from toollatch.core._recording import EventStreamMasker

KEY = "sk-proj-" + "abcdefghijklmnopqrstuvwxyz012345"
TOKEN = "my-bedrock-bearer-token-0123"


def event(name: str, payload: dict[str, object]) -> bytes:
    headers = [(":event-type", name), (":content-type", "application/json")]
    return encode_message([*headers, (":message-type", "event")], json.dumps(payload).encode())


ARGS = json.dumps({"city": "Oslo", "api_key": KEY, "token": TOKEN})
FRAMES = [
    event("messageStart", {"role": "assistant", "p": "abc"}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": f"use {KEY} now"}}),
    event("contentBlockStop", {"contentBlockIndex": 0}),
    event(
        "contentBlockStart",
        {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "get_weather"}}},
    ),
    event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ARGS}}}),
    event("contentBlockStop", {"contentBlockIndex": 1}),
    event("messageStop", {"stopReason": "tool_use"}),
    event("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}}),
]
ANSWER = b"".join(FRAMES)


def masked(data: bytes, cuts: list[int] | None = None, **kw: object) -> bytes:
    masker = EventStreamMasker((TOKEN,), **kw)  # type: ignore[arg-type]
    bounds = [0, *sorted(cuts or []), len(data)]
    out = b"".join(masker.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    return out + masker.finish()


def test_no_secret_reaches_the_bytes_and_every_frame_still_decodes():
    out = masked(ANSWER)
    assert KEY.encode() not in out and TOKEN.encode() not in out
    assert b"sk-proj-" not in out
    ours = EventStreamDecoder().feed(out)
    assert [f.event for f in ours] == [f.event for f in EventStreamDecoder().feed(ANSWER)]
    theirs = EventStreamBuffer()
    theirs.add_data(out)
    messages = list(theirs)  # botocore checks both CRCs and raises on a mismatch
    assert len(messages) == len(FRAMES)
    assert messages[1].headers[":event-type"] == "contentBlockDelta"
    arguments = json.loads(json.loads(messages[4].payload)["delta"]["toolUse"]["input"])
    assert arguments["city"] == "Oslo" and len(arguments) == 3  # still JSON, same shape


def test_frames_without_a_secret_keep_their_exact_bytes():
    out = masked(ANSWER)
    for n in (0, 2, 3, 5, 6, 7):
        assert FRAMES[n] in out
    assert masked(FRAMES[0] + FRAMES[3]) == FRAMES[0] + FRAMES[3]


def test_the_masked_answer_commits_the_same_calls():
    def calls(data: bytes) -> list[tuple[str, str, str]]:
        parser = StreamParser("bedrock", framing="eventstream")
        parser.feed(data)
        round_ = parser.finish()
        return [(r.call_id, r.name, r.state) for c in round_.choices for r in c.calls]

    assert calls(masked(ANSWER)) == calls(ANSWER) == [("t1", "get_weather", "committed")]


def test_every_split_of_the_answer_gives_the_same_bytes():
    whole = masked(ANSWER)
    for cut in range(len(ANSWER) + 1):
        assert masked(ANSWER, [cut]) == whole, cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(ANSWER)), max_size=40))
def test_any_number_of_reads_gives_the_same_bytes(cuts):
    assert masked(ANSWER, cuts) == masked(ANSWER)


def test_only_the_partial_frame_is_held_back():
    masker = EventStreamMasker((TOKEN,))
    first = FRAMES[0] + FRAMES[1]
    out = masker.feed(first + FRAMES[2][:9])
    assert out == masked(first)  # the complete frames are out at once
    assert masker.feed(FRAMES[2][9:]) == FRAMES[2]


def test_a_truncated_last_frame_is_kept_as_it_came_masked_in_place():
    """A stream cut inside a frame is recorded cut at the same byte: the replay fails where
    the wire failed. Its visible secret is masked without changing its length."""
    cut = FRAMES[4][:-10]
    data = FRAMES[0] + cut
    out = masked(data, [len(FRAMES[0]) + 20])
    assert out[: len(FRAMES[0])] == FRAMES[0]
    assert len(out) == len(data) and KEY.encode() not in out
    for stream in (data, out):
        decoder = EventStreamDecoder()
        assert len(decoder.feed(stream)) == 1
        with pytest.raises(StreamDecodeError, match="ended inside a message"):
            decoder.finish()


def test_a_frame_with_a_bad_crc_stays_bad_and_a_lost_framing_passes_raw_masked():
    broken = bytearray(FRAMES[1])
    broken[-1] ^= 0xFF  # the message CRC no longer matches
    out = masked(FRAMES[0] + bytes(broken) + FRAMES[2])
    assert KEY.encode() not in out
    assert out.endswith(FRAMES[2]) and len(out) == len(FRAMES[0]) + len(broken) + len(FRAMES[2])
    with pytest.raises(StreamDecodeError, match="message CRC"):
        EventStreamDecoder().feed(out[len(FRAMES[0]) :])
    garbage = b"\x00\x00\x00\x20not a prelude at all " + KEY.encode() + b" tail"
    out = masked(FRAMES[0] + garbage + FRAMES[2])
    assert out.startswith(FRAMES[0]) and KEY.encode() not in out
    assert len(out) == len(FRAMES[0]) + len(garbage) + len(FRAMES[2])


def test_a_frame_past_the_bound_is_not_buffered_whole():
    big = event("contentBlockDelta", {"delta": {"text": "x" * 5000 + " " + KEY}})
    masker = EventStreamMasker((), max_message_bytes=1024)
    out = masker.feed(big[:100])
    assert len(out) == 100  # framing lost at once: written out raw-masked, nothing held
    out += masker.feed(big[100:]) + masker.finish()
    assert len(out) == len(big) and KEY.encode() not in out


def test_secrets_in_string_headers_are_masked_in_place():
    headers = [(":message-type", "error"), (":error-code", "Denied")]
    frame = encode_message([*headers, (":error-message", f"bad key {KEY}")], b"")
    out = masked(frame)
    assert KEY.encode() not in out and len(out) == len(frame)
    [f] = EventStreamDecoder().feed(out)
    assert f.event == "error" and "bad key xx-xxxx-xxxx" in f.data
