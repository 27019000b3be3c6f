"""What ``toollatch proxy`` answers: OpenAI Chat Completions chunks built from the gate's
decisions (internal; the server is :mod:`._proxy`).

Theory of operation. The proxy reads the upstream's stream with a
:class:`~toollatch.StreamParser` (every tool eager, ``observe=True``) and hands what it
learns to one :class:`ChatChunks` per response, which is pure: values in, JSON-ready dicts
out. Text is forwarded as it comes (``delta.content``). A call is written only once the gate
has committed it, as ONE delta carrying ``id``, ``type``, ``name`` and its complete
arguments, under an ``index`` counting the *sent* calls of its choice from 0: a client that
keys its buffers by ``index`` (the official SDKs, LangChain, the AI SDK) can never merge two
calls, see a half object, or run a call the gate refused. At the round's end the calls
committed then (the last call of a stream has no "moved on" signal) are written in call
order, and the last chunk of each choice carries one ``finish_reason`` and, when some call
did not commit, the verdicts under the extension key ``toollatch``
(``{"failed": [{"id", "name", "code", "message"}]}``). A round with no committed call that
was cut by a token limit finishes ``length``; a stream that broke is reported as an
``error`` object (which the ``openai`` SDK raises as an ``APIError``), never as a normal end.

The same decisions give the non-streaming answer (:meth:`ChatChunks.completion`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._assembler import CallReady, CallUpdate, TextReceived
from ..core._events import CallKey, RoundEnd
from ..core._gate import CommittedCall
from ..core._round import Choice, Round
from ..core._state import CallState

_FINISH = {
    RoundEnd.TRUNCATED: "length",
    RoundEnd.LIMITED: "length",
}
"""Finish reasons of the round ends that are not the model's own stop."""


def failed_calls(choice: Choice) -> list[dict[str, Any]]:
    """The verdicts of ``choice``'s calls that did not commit (id, name, code, message)."""
    return [
        {
            "id": record.call_id,
            "name": record.name,
            "code": str(record.error) if record.error is not None else "cancelled",
            "message": record.detail,
        }
        for record in choice.calls
        if record.state is not CallState.COMMITTED
    ]


def interrupted(round_: Round) -> bool:
    """Whether the upstream's stream broke (no terminal signal, a dropped connection, an idle
    timeout): such a round is answered with an error, not a finish."""
    return any(
        c.ended is RoundEnd.INTERRUPTED and c.stop_reason != "content_filter"
        for c in round_.choices
    ) or (not round_.choices and round_.error is not None)


class ChatChunks:
    """The chunks of one proxied streaming response (see the module's doc).

    ``completion_id``, ``model`` and ``created`` (epoch seconds, passed in: no clock here)
    go in every chunk, as OpenAI's do.
    """

    def __init__(self, *, completion_id: str, model: str, created: int) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._sent: dict[int, list[CallKey]] = {}  # choice -> calls written, in index order
        self._started: set[int] = set()

    def _chunk(
        self, choice: int, delta: dict[str, Any], finish: str | None = None
    ) -> dict[str, Any]:
        if choice not in self._started:
            self._started.add(choice)
            delta = {"role": "assistant", **delta}
        entry = {"index": choice, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**self._head, "choices": [entry]}

    def notice(self, notice: CallUpdate) -> list[dict[str, Any]]:
        """The chunks a parser's notice makes: text as it comes, a call once committed."""
        if isinstance(notice, TextReceived):
            return [self.text(notice.choice, notice.text)]
        if isinstance(notice, CallReady):
            return [self.call(notice.call)]
        return []

    def text(self, choice: int, text: str) -> dict[str, Any]:
        """A text delta."""
        return self._chunk(choice, {"content": text})

    def call(self, call: CommittedCall) -> dict[str, Any]:
        """The one delta of a committed call (its ``index``: the choice's next)."""
        return self._opening(call.key, call.call_id, call.name, call.arguments_text)

    def _opening(self, key: CallKey, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        """A call's first delta (``id``, ``type``, ``name``, ``arguments`` so far) under the
        choice's next ``index``."""
        sent = self._sent.setdefault(key.choice, [])
        entry = {
            "index": len(sent),
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        sent.append(key)
        return self._chunk(key.choice, {"tool_calls": [entry]})

    def end(self, round_: Round, *, usage: bool = False) -> list[dict[str, Any]]:
        """The closing chunks: each choice's calls committed at the end (in call order), its
        finish chunk (with the ``toollatch`` verdicts when a call did not commit), and, with
        ``usage`` (the request's ``stream_options.include_usage``), the usage chunk."""
        out: list[dict[str, Any]] = []
        for choice in round_.choices:
            sent = set(self._sent.get(choice.index, ()))
            for record in choice.calls:
                if record.committed is not None and record.key not in sent:
                    out.append(self.call(record.committed))
            finish = self._chunk(choice.index, {}, self._finish(choice))
            failed = failed_calls(choice)
            if failed:
                finish["toollatch"] = {"failed": failed}
            out.append(finish)
        if usage:
            out.append({**self._head, "choices": [], "usage": openai_usage(round_.usage)})
        return out

    def _finish(self, choice: Choice) -> str:
        if any(record.committed is not None for record in choice.calls):
            return "tool_calls"
        if choice.ended in _FINISH:
            return _FINISH[choice.ended]
        reason = choice.stop_reason
        if reason in ("stop", "length", "content_filter"):
            return reason
        return "stop"  # (tool_calls whose calls all failed; a server's own word)

    def completion(self, round_: Round) -> dict[str, Any]:
        """The non-streaming answer: one ``chat.completion`` holding committed calls only."""
        choices = []
        verdicts: list[dict[str, Any]] = []
        for choice in round_.choices:
            calls = [r.committed for r in choice.calls if r.committed is not None]
            text = "".join(getattr(item, "text", "") for item in choice.content)
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_text},
                    }
                    for c in calls
                ]
            choices.append(
                {
                    "index": choice.index,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish(choice),
                }
            )
            verdicts += failed_calls(choice)
        head = {**self._head, "object": "chat.completion"}
        answer: dict[str, Any] = {**head, "choices": choices, "usage": openai_usage(round_.usage)}
        if verdicts:
            answer["toollatch"] = {"failed": verdicts}
        return answer


def openai_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The upstream's usage in OpenAI's shape (passed through when it already is)."""
    if usage is None:
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return dict(usage)
    prompt = usage.get("input_tokens", usage.get("promptTokenCount", usage.get("inputTokens")))
    completion = usage.get(
        "output_tokens", usage.get("candidatesTokenCount", usage.get("outputTokens"))
    )
    prompt = prompt if isinstance(prompt, int) else 0
    completion = completion if isinstance(completion, int) else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def error_chunk(message: str, code: str) -> dict[str, Any]:
    """An in-stream error object, as OpenAI sends one (the ``openai`` SDK raises it)."""
    return {"error": {"message": message, "type": "upstream_error", "code": code}}
