"""Redaction of tool results with the previews' redactor: the same pointer contract as the
previews for JSON results, the whole text with pointer "" otherwise, and fail closed."""

from __future__ import annotations

import json
import re

import pytest

from toollatch import (
    ConfigError,
    PreviewPolicy,
    ResultLimits,
    StreamParser,
    ToolPreview,
    ToolResult,
)
from toollatch.relay import redact_secrets
from toollatch.runtime import redact_result
from toollatch.tools._results import RedactionFailed, ResultShaper

NESTED = {
    "token": "sk-live-0123456789abcdef",
    "env": {"HOME": "/home/ana", "a/b~c": "x", "list": ["one", {"password": "hunter2"}]},
    "n": [1, 2.50, -0.0, 1e400, 123456789012345678901234567890],
    "ok": True,
    "none": None,
}
TEXT = (
    '{"token": "sk-live-0123456789abcdef", "env": {"HOME": "/home/ana", "a/b~c": "x", '
    '"list": ["one", {"password": "hunter2"}]}, "n": [1, 2.50, -0.0, 1e400, '
    '123456789012345678901234567890], "ok": true, "none": null}'
)


def recording() -> tuple[list[tuple[str, str]], object]:
    seen: list[tuple[str, str]] = []

    def redactor(pointer: str, text: str) -> str:
        seen.append((pointer, text))
        return text

    return seen, redactor


def test_a_json_result_gets_the_same_redactor_calls_as_a_preview_of_the_same_json():
    preview_calls, preview_redactor = recording()
    policy = PreviewPolicy(default=ToolPreview(mode="full"), redactor=preview_redactor)
    parser = StreamParser("openai_chat", previews=policy)
    delta = {"index": 0, "id": "c1", "function": {"name": "t", "arguments": TEXT}}
    parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    parser.finish()
    result_calls, result_redactor = recording()
    assert redact_result(TEXT, result_redactor) is TEXT  # nothing changed: the same text
    assert sorted(result_calls) == sorted(preview_calls)
    assert ("", "token") in result_calls and ("/token", NESTED["token"]) in result_calls
    assert ("/env", "a/b~c") in result_calls and ("/env/a~1b~0c", "x") in result_calls
    assert ("/env/list/1/password", "hunter2") in result_calls


def test_a_changed_json_result_is_written_again_compact_with_its_numbers_as_they_were():
    shown = redact_result(TEXT, redact_secrets)
    assert "sk-live" not in shown and "hunter2" not in shown
    assert shown == (
        '{"token":"[redacted]","env":{"HOME":"/home/ana","a/b~c":"x","list":["one",'
        '{"password":"[redacted]"}]},"n":[1,2.50,-0.0,1e400,123456789012345678901234567890],'
        '"ok":true,"none":null}'
    )


def test_keys_are_redacted_and_duplicate_keys_each_pass_the_redactor():
    text = '{"a": "sk-live-0123456789abcdef", "a": "fine", "sk-live-0123456789abcdef": 1}'
    shown = redact_result(text, lambda p, t: "[r]" if t.startswith("sk-") else t)
    assert shown == '{"a":"[r]","a":"fine","[r]":1}'


@pytest.mark.parametrize(
    "text",
    [
        "wrote 3 files; key sk-live-0123456789abcdef",
        '"sk-live-0123456789abcdef"',  # a bare JSON string: whole text
        '{"token": "sk-live-0123456789abcdef"',  # malformed JSON: whole text
        '{"token": NaN, "k": "sk-live-0123456789abcdef"}',  # not strict JSON: whole text
        "[" * 100_000 + "]" * 100_000,  # too deep for the parser: whole text
    ],
)
def test_any_other_text_is_redacted_whole_with_the_empty_pointer(text):
    seen, redactor = recording()
    redact_result(text, redactor)
    assert seen == [("", text)]


def test_a_redactor_that_raises_or_returns_no_str_fails_closed():
    def raises(pointer: str, text: str) -> str:
        raise ValueError(f"cannot redact {text}")

    for redactor in (raises, lambda p, t: None):
        for text in ("plain sk-live-0123456789abcdef", '{"k": "sk-live-0123456789abcdef"}'):
            with pytest.raises(RedactionFailed) as info:
                redact_result(text, redactor)  # type: ignore[arg-type]
            assert "sk-live" not in str(info.value)

    shaper = ResultShaper(ResultLimits(), PreviewPolicy(redactor=raises))
    secret = ToolResult(tool_call_id="c1", name="t", content='{"k": "sk-live-0123456789ab"}')
    withheld = shaper.tool_result(secret, 1024)
    assert withheld.is_error and str(withheld.code) == "tool_error"
    assert "sk-live" not in withheld.content and "ValueError" in withheld.content
    assert "withheld" in withheld.content


def test_redaction_runs_before_the_budget_so_a_secret_is_never_half_shown():
    secret = "sk-live-" + "0123456789abcdef" * 4
    text = "x" * 200 + secret + " " + "y" * 1000

    def mask(pointer: str, text: str) -> str:
        return re.sub(r"sk-[A-Za-z0-9-]{12,}", "[redacted]", text)

    shaper = ResultShaper(ResultLimits(), PreviewPolicy(redactor=mask))
    budget = 200 + 30 + 72  # the cut falls inside the secret
    shaped = shaper.tool_result(ToolResult(tool_call_id="c", name="t", content=text), budget)
    assert shaped.truncated_from is not None and "sk-" not in shaped.content
    assert "[redacted]" in shaped.content
    # without redaction the same cut shows the secret's head
    plain = ResultShaper(ResultLimits(), None).tool_result(
        ToolResult(tool_call_id="c", name="t", content=text), budget
    )
    assert "sk-live-01" in plain.content


def test_a_bad_redaction_policy_or_limits_is_a_config_error():
    with pytest.raises(ConfigError, match="PreviewPolicy"):
        ResultShaper(None, redact_secrets)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ResultLimits"):
        ResultShaper({"max_bytes": 1}, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="the redactor must be callable"):
        ResultShaper(None, PreviewPolicy(redactor="mask"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="keys are tool names"):
        ResultLimits(tools={1: 4096})  # type: ignore[dict-item]
    assert json.loads(redact_result('{"a": []}', redact_secrets)) == {"a": []}
