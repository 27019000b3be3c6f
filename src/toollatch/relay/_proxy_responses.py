"""What ``toollatch proxy`` answers on ``POST /v1/responses``: OpenAI Responses stream events
built from the gate's decisions (internal; the server is :mod:`._proxy`).

Theory of operation. As :mod:`._proxy_chunks` does for Chat Completions: the upstream's
Responses stream is read by a :class:`~toollatch.StreamParser` (every tool eager), and one
:class:`ResponseEvents` per answer turns what it decides into events, numbered by
``sequence_number`` from 0: ``response.created`` and ``response.in_progress`` first; text
as a ``message`` output item (``output_item.added``, ``content_part.added``,
``output_text.delta`` per piece as it comes, then the ``.done`` events when a call or the end
follows); a call only once the gate committed it, as a ``function_call`` item whose
arguments come in one ``function_call_arguments.delta`` with their ``.done``; then
``response.completed`` (``response.incomplete`` with ``max_output_tokens`` for a truncated
round with no committed call) whose ``response.output`` holds exactly those items and, when a
call did not commit, a ``toollatch`` key with the verdicts. A stream that broke ends with an
``error`` event (the ``openai`` SDK raises it). The shapes are the Responses streaming
reference's (https://platform.openai.com/docs/api-reference/responses-streaming).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._assembler import CallReady, CallUpdate, TextReceived
from ..core._events import RoundEnd
from ..core._gate import CommittedCall
from ..core._round import Round
from ._proxy_chunks import failed_calls


class ResponseEvents:
    """The events of one proxied Responses answer (see the module's doc); ``created`` is
    epoch seconds, passed in (no clock here)."""

    def __init__(self, *, response_id: str, model: str, created: int) -> None:
        self.response_id, self.model, self.created = response_id, model, created
        self._n = 0
        self._output: list[dict[str, Any]] = []
        self._text: list[str] | None = None  # the open message's pieces
        self._sent: set[str] = set()

    def _event(self, kind: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, **body, "sequence_number": self._n}
        self._n += 1
        return kind, event

    def response(self, status: str, **more: Any) -> dict[str, Any]:
        """The ``response`` object as it stands."""
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": list(self._output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
            **more,
        }

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        """``response.created`` and ``response.in_progress``."""
        return [
            self._event("response.created", {"response": self.response("in_progress")}),
            self._event("response.in_progress", {"response": self.response("in_progress")}),
        ]

    def notice(self, notice: CallUpdate) -> list[list[tuple[str, dict[str, Any]]]]:
        """The events a parser's notice makes, in groups: text as it comes, a call once
        committed (``--calls stream`` applies to Chat Completions only: here calls are held)."""
        if isinstance(notice, TextReceived):
            return [self.text(notice.choice, notice.text)]
        if isinstance(notice, CallReady):
            return [self.call(notice.call)]
        return []

    def text(self, choice: int, text: str) -> list[tuple[str, dict[str, Any]]]:
        """A text piece (the message item opened first if it is not; Responses has one
        choice, so ``choice`` is not read)."""
        out = []
        where = self._where()
        if self._text is None:
            self._text = []
            item = {"id": where["item_id"], "type": "message", "status": "in_progress"}
            item |= {"role": "assistant", "content": []}
            out.append(
                self._event(
                    "response.output_item.added",
                    {"output_index": where["output_index"], "item": item},
                )
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self._event(
                    "response.content_part.added", {**where, "content_index": 0, "part": part}
                )
            )
        self._text.append(text)
        body = {**where, "content_index": 0, "delta": text, "logprobs": []}
        out.append(self._event("response.output_text.delta", body))
        return out

    def _where(self) -> dict[str, Any]:
        index = len(self._output)
        return {"item_id": f"msg_{self.response_id}_{index}", "output_index": index}

    def _close_text(self) -> list[tuple[str, dict[str, Any]]]:
        if self._text is None:
            return []
        where, text = self._where(), "".join(self._text)
        self._text = None
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": where["item_id"], "type": "message", "status": "completed"}
        item |= {"role": "assistant", "content": [part]}
        self._output.append(item)
        return [
            self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": []},
            ),
            self._event("response.content_part.done", {**where, "content_index": 0, "part": part}),
            self._event(
                "response.output_item.done", {"output_index": where["output_index"], "item": item}
            ),
        ]

    def call(self, call: CommittedCall) -> list[tuple[str, dict[str, Any]]]:
        """A committed call, whole."""
        out = self._close_text()
        index = len(self._output)
        head = {"id": f"fc_{call.call_id}", "type": "function_call", "call_id": call.call_id}
        head["name"] = call.name
        where = {"item_id": head["id"], "output_index": index}
        added = {**head, "status": "in_progress", "arguments": ""}
        done = {**head, "status": "completed", "arguments": call.arguments_text}
        self._output.append(done)
        self._sent.add(call.call_id)
        return [
            *out,
            self._event("response.output_item.added", {"output_index": index, "item": added}),
            self._event(
                "response.function_call_arguments.delta", {**where, "delta": call.arguments_text}
            ),
            self._event(
                "response.function_call_arguments.done",
                {**where, "name": call.name, "arguments": call.arguments_text},
            ),
            self._event("response.output_item.done", {"output_index": index, "item": done}),
        ]

    def end(self, round_: Round) -> list[tuple[str, dict[str, Any]]]:
        """The calls committed at the end, the open message closed, the final event."""
        out = self._close_text()
        failed: list[dict[str, Any]] = []
        for choice in round_.choices:
            for record in choice.calls:
                if record.committed is not None and record.call_id not in self._sent:
                    out += self.call(record.committed)
            failed += failed_calls(choice)
        more: dict[str, Any] = {"usage": _usage(round_.usage)}
        if failed:
            more["toollatch"] = {"failed": failed}
        truncated = any(c.ended in (RoundEnd.TRUNCATED, RoundEnd.LIMITED) for c in round_.choices)
        if truncated and not self._sent:
            final = self.response("incomplete", **more)
            final["incomplete_details"] = {"reason": "max_output_tokens"}
            return [*out, self._event("response.incomplete", {"response": final})]
        return [
            *out,
            self._event("response.completed", {"response": self.response("completed", **more)}),
        ]

    def error(self, message: str, code: str) -> tuple[str, dict[str, Any]]:
        """The in-stream error of a stream that broke."""
        return self._event(
            "error",
            {
                "code": code,
                "message": message,
                "param": None,
                "error": {"code": code, "message": message},
            },
        )


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The upstream's usage in the Responses shape (passed through when it already is)."""
    if usage is None or "input_tokens" in usage:
        return None if usage is None else dict(usage)
    prompt = usage.get("prompt_tokens", 0)
    completion = usage.get("completion_tokens", 0)
    prompt = prompt if isinstance(prompt, int) else 0
    completion = completion if isinstance(completion, int) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
