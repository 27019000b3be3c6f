"""Quirk profiles: the scripted server's OpenAI chat stream as quirky servers send it.

``ScriptedServer(quirks="ollama")`` (``python -m toollatch.scripted --quirks ollama``) sends
each ``chat.completion.chunk`` stream rewritten the way that server family is documented to
send it (``QUIRKS.md``'s catalogue, Q-codes below), so that ``toollatch proxy`` and
``toollatch probe`` are tested against them without the servers themselves. A profile is a
sequence of rewrites over the stream's chunks (decoded objects, in order); each rewrite is
one quirk. They touch the OpenAI Chat Completions wire only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..core._errors import ConfigError
from ._wire import WireEvent, sse

Chunks = list[dict[str, Any]]


def _calls(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    calls = delta.get("tool_calls")
    return calls if isinstance(calls, list) else []


def _known(chunks: Chunks, field: str) -> None:
    """Every call entry gets its call's ``id`` (``field="id"``) or name, by index (Q3, Q5)."""
    seen: dict[int, Any] = {}
    for chunk in chunks:
        for entry in _calls(chunk):
            index = entry.get("index", 0)
            if field == "id":
                if entry.get("id"):
                    seen[index] = entry["id"]
                elif index in seen:
                    entry["id"], entry["type"] = seen[index], "function"
            else:
                function = entry.setdefault("function", {})
                if function.get("name"):
                    seen[index] = function["name"]
                elif index in seen:
                    function["name"] = seen[index]


def id_repeated(chunks: Chunks) -> Chunks:
    """Q3: the call's id on every chunk of it (DeepSeek, Qwen, TGI)."""
    _known(chunks, "id")
    return chunks


def name_repeated(chunks: Chunks) -> Chunks:
    """Q5: the function name on every delta (llama.cpp server before #13800)."""
    _known(chunks, "name")
    return chunks


def empty_name(chunks: Chunks) -> Chunks:
    """Q6: ``name: ""`` instead of no name on continuation deltas (SGLang)."""
    for chunk in chunks:
        for entry in _calls(chunk):
            function = entry.setdefault("function", {})
            if not function.get("name"):
                function["name"] = ""
    return chunks


def whole_arguments(chunks: Chunks) -> Chunks:
    """Q8: a call's whole arguments in its first chunk, with id and name (Ollama, Mistral)."""
    firsts: dict[int, dict[str, Any]] = {}
    out: Chunks = []
    for chunk in chunks:
        entries = _calls(chunk)
        if not entries:
            out.append(chunk)
            continue
        kept = []
        for entry in entries:
            index = entry.get("index", 0)
            if index not in firsts:
                firsts[index] = entry
                kept.append(entry)
            else:
                first = firsts[index].setdefault("function", {})
                more = (entry.get("function") or {}).get("arguments") or ""
                first["arguments"] = (first.get("arguments") or "") + more
        if kept:
            chunk["choices"][0]["delta"]["tool_calls"] = kept
            out.append(chunk)
    return out


def no_index(chunks: Chunks) -> Chunks:
    """Q1: no ``index`` on tool-call deltas (Ollama, Gemini's OpenAI endpoint)."""
    for chunk in chunks:
        for entry in _calls(chunk):
            entry.pop("index", None)
    return chunks


def shared_index(chunks: Chunks) -> Chunks:
    """Q2: every parallel call under ``index: 0``, each with its own id and complete
    arguments (Ollama through LiteLLM, Anthropic-to-OpenAI converters)."""
    out = whole_arguments(chunks)
    for chunk in out:
        for entry in _calls(chunk):
            entry["index"] = 0
    return out


def stop_with_calls(chunks: Chunks) -> Chunks:
    """Q12: ``finish_reason: "stop"`` although calls were streamed."""
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
    return chunks


def finish_on_last_delta(chunks: Chunks) -> Chunks:
    """Q13: the finish reason on the chunk of the last content or argument delta, no
    separate finish chunk (Mistral, vLLM)."""
    at = next(
        (
            n
            for n, c in enumerate(chunks)
            if c.get("choices") and c["choices"][0].get("finish_reason")
        ),
        None,
    )
    if at is None or at == 0:
        return chunks
    finish = chunks[at]["choices"][0]["finish_reason"]
    before = chunks[at - 1]
    if not before.get("choices"):
        return chunks
    before["choices"][0]["finish_reason"] = finish
    return chunks[:at] + chunks[at + 1 :]


def no_finish_reason(chunks: Chunks) -> Chunks:
    """The finish chunk left out: the stream ends with ``[DONE]`` only (TGI)."""
    return [c for c in chunks if not (c.get("choices") and c["choices"][0].get("finish_reason"))]


@dataclass(frozen=True, slots=True)
class QuirkProfile:
    """A named server family's quirks, applied in order."""

    name: str
    """``--quirks NAME``."""
    codes: tuple[str, ...]
    """The QUIRKS.md codes it shows (``Q1``...)."""
    rewrites: tuple[Callable[[Chunks], Chunks], ...]
    """The rewrites, in order."""
    summary: str
    """Which servers send it so, in a line."""

    def apply(self, chunks: Sequence[dict[str, Any]]) -> Chunks:
        """The rewritten stream (the input is left as it was)."""
        out = copy.deepcopy(list(chunks))
        for rewrite in self.rewrites:
            out = rewrite(out)
        return out


PROFILES: dict[str, QuirkProfile] = {
    p.name: p
    for p in (
        QuirkProfile(
            "ollama",
            ("Q1", "Q8", "Q12"),
            (whole_arguments, no_index, stop_with_calls),
            "Ollama's /v1: whole arguments per call, no index, finish 'stop'",
        ),
        QuirkProfile(
            "vllm",
            ("Q3", "Q13"),
            (id_repeated, finish_on_last_delta),
            "vLLM's tool parsers: the id on every chunk, the finish on the last delta",
        ),
        QuirkProfile(
            "llamacpp",
            ("Q5",),
            (name_repeated,),
            "llama.cpp server: the function name on every delta",
        ),
        QuirkProfile(
            "sglang",
            ("Q6",),
            (empty_name,),
            'SGLang: name "" on continuation deltas',
        ),
        QuirkProfile(
            "mistral",
            ("Q1", "Q8", "Q13"),
            (whole_arguments, no_index, finish_on_last_delta),
            "Mistral: whole arguments, no index, the finish on the last delta",
        ),
        QuirkProfile(
            "tgi",
            ("Q3", "Q5"),
            (id_repeated, name_repeated, no_finish_reason),
            "Text Generation Inference: id and name repeated, no finish reason",
        ),
        QuirkProfile(
            "shared-index",
            ("Q2", "Q8"),
            (shared_index,),
            "converters that put every parallel call under index 0",
        ),
        QuirkProfile(
            "gemini-openai",
            ("Q1", "Q8", "Q12"),
            (whole_arguments, no_index, stop_with_calls),
            "Gemini's OpenAI-compatible endpoint: whole calls, no index, finish 'stop'",
        ),
    )
}
"""The profiles by name."""


def profile(name: str | None) -> QuirkProfile | None:
    """The profile called ``name`` (None: none); raises ConfigError for an unknown name."""
    if name is None or name == "none":
        return None
    found = PROFILES.get(name)
    if found is None:
        raise ConfigError(f"unknown quirk profile {name!r}; known: {', '.join(PROFILES)}")
    return found


def rewritten(events: Sequence[WireEvent], quirks: QuirkProfile) -> list[WireEvent]:
    """A chat stream's events (``data: <json>`` each, ``[DONE]`` last) with ``quirks``."""
    chunks: Chunks = []
    tail: list[WireEvent] = []
    for event in events:
        payload = event.data.partition(b"data: ")[2].strip()
        if payload == b"[DONE]":
            tail.append(event)
        else:
            chunks.append(orjson.loads(payload))
    out = []
    for chunk in quirks.apply(chunks):
        fragment = any((e.get("function") or {}).get("arguments") for e in _calls(chunk))
        out.append(WireEvent(sse(chunk), in_arguments=fragment))
    return out + tail
