"""Raw spellings: how a provider spells the bare argument fragments of an open call.

An adapter that knows (or has learned) the bytes around a fragment's JSON string lets
``Adapter.translate`` decode that string alone instead of the whole event (see
:data:`RawContinuation`). Sound because a JSON string token can be replaced by any other, an
integer token by any other of as many digits, and letters and digits inside a string by any
others, without changing what the rest of the text means; every other byte of the event
must be exactly the spelling's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeAlias

import orjson

from .._events import CallKey

__all__ = ["RawContinuation", "learned_spelling", "raw_continuation", "spaced_body", "string_end"]

Counter: TypeAlias = tuple[int, int, bytes, int | None]
"""Where a spelling's counter is: ``(counter_at, counter_end, counter_rest, rest_end)``."""
RawContinuation: TypeAlias = tuple[
    bytes, bytes, bytes | None, CallKey, int, int, int, int, int | None, Counter | None
]
"""How the provider spells a bare fragment of the open call ``key`` (build it with
:func:`raw_continuation`; a plain tuple, as ``Adapter.translate`` unpacks it once per run of
events): ``(prefix, suffix, close, key, start, cut, suffix_len, prefix_len, suffix_end,
counter)``, ``counter`` being None or ``(counter_at, counter_end, counter_rest, rest_end)``
(see below). The fragment is one JSON string right
after the prefix, then one of two forms:

* ``close`` is None: the suffix, maybe with spaces between its bytes when it holds no ``"``
  and there is no counter (Anthropic pads ``}  }``; the string then ends at the data's last
  quote).
* padded: the suffix, a padding value of ASCII letters and digits, then the close (Bedrock's
  ``"p"``, OpenAI's ``"obfuscation"``: fields that only hide the event's size).

A spelling may also hold one *counter*: an integer token that changes from event to event
(OpenAI Responses' ``sequence_number``), in the prefix or in the last part (the close when
padded, else the suffix), of a fixed number of digits. It is checked in place: the bytes at
``payload[counter_at:counter_end]`` are ASCII digits not starting with ``0``, and
``payload[counter_end:rest_end] == counter_rest`` (what follows the counter in its part);
``prefix`` (or the suffix or close) then holds only what comes before the counter, compared
as ``payload[:prefix_len]`` (or ``payload[-cut:suffix_end]``). Without a counter
``prefix_len`` is ``start`` and ``suffix_end`` None.

``start`` is where the string starts, ``cut`` the length of the last part (the bytes after
the string, or after the padding, in the spelling without spaces), ``suffix_len`` the
suffix's length.

An adapter sets it for its provider's own spelling, only while ``Adapter._continuation``
would accept every event so spelled with that result (whatever the string, padding and
counter), and clears it before it stops holding. Any other spelling (another key order,
spaces inside the prefix, a counter with more or fewer digits) misses and takes the decoded
route, as does an empty string when ``_raw_empty`` is false."""

_MAX_COUNTER_DIGITS = 18
"""Counters of at most 18 digits (below 2**63): integers that orjson reads as integers, far
from the numbers it refuses (past 1e308, as infinity), so the raw route never takes an event
the decoded route would read otherwise or refuse."""


def raw_continuation(
    prefix: bytes,
    suffix: bytes,
    key: CallKey,
    close: bytes | None = None,
    counter: tuple[int, int] | None = None,
) -> RawContinuation:
    """A :data:`RawContinuation`, its lengths computed once. ``prefix``, ``suffix`` and
    ``close`` are spelled whole (with a sample counter in place); ``counter`` is ``(at,
    digits)``: where the counter starts in an event so spelled (from its start when in the
    prefix, as a negative offset from its end when in the last part) and how many digits it
    has. Raises ``ValueError`` for an empty suffix or close, or a counter that is not wholly
    inside the prefix or the last part, or that ends it."""
    if not suffix or close == b"":
        raise ValueError("a raw spelling needs a suffix (and a close, when padded)")
    last = suffix if close is None else close
    start, cut, suffix_len = len(prefix), len(last), len(suffix)
    if counter is None:
        return (prefix, suffix, close, key, start, cut, suffix_len, start, None, None)
    at, digits = counter
    if not 0 < digits <= _MAX_COUNTER_DIGITS:
        raise ValueError(f"a counter has 1 to {_MAX_COUNTER_DIGITS} digits")
    if at > 0 and at + digits < start:  # in the prefix, before its end
        head, rest = prefix[:at], prefix[at + digits :]
        return (
            head,
            suffix,
            close,
            key,
            start,
            cut,
            suffix_len,
            at,
            None,
            (at, at + digits, rest, start),
        )
    if -cut <= at and at + digits < 0:  # in the last part, before its end
        head, rest = last[: cut + at], last[cut + at + digits :]
        suffix, close = (head, None) if close is None else (suffix, head)
        return (
            prefix,
            suffix,
            close,
            key,
            start,
            cut,
            suffix_len,
            start,
            at,
            (at, at + digits, rest, None),
        )
    raise ValueError("a counter lies in the prefix or in the last part, before its end")


_loads = orjson.loads


def spaced_body(payload: bytes, raw: RawContinuation) -> bytes | None:
    """The fragment's JSON string in ``payload`` when it is spelled as ``raw`` (not padded,
    no counter) says, with spaces in the suffix; else None."""
    # The suffix has no quote, so the fragment's string ends at the last one.
    end = payload.rfind(b'"') + 1
    suffix, close, start, counter = raw[1], raw[2], raw[4], raw[9]
    if close is not None or counter is not None or b'"' in suffix:
        return None
    if payload[end:].replace(b" ", b"") != suffix:
        return None
    return payload[start:end]


_PADDING = b',"obfuscation":"'
"""OpenAI's padding field, in every chunk or event when ``include_obfuscation`` is on (the
default): letters and digits that hide its size. Last in a chat chunk (fixture
openai_chat/long_nested_arguments.sse) and in older Responses events (openai_responses/
two_function_calls.sse); between ``item_id`` and ``output_index`` in newer ones
(openai_responses/function_call_llm_cli.sse)."""
_TOKEN_TRIES = 64
"""Quotes tried as the end of a string token while learning (one per escaped quote)."""
_DIGITS = re.compile(rb"0|[1-9][0-9]*")  # (a JSON integer's digits)


def string_end(payload: bytes, start: int) -> int:
    """Where the JSON string token at ``payload[start:]`` ends (past its closing quote), or
    -1: the first quote after which the text so far decodes as a string."""
    quote = payload.find(b'"', start + 1)
    for _ in range(_TOKEN_TRIES):
        if quote < 0:
            return -1
        try:
            if type(_loads(payload[start : quote + 1])) is str:
                return quote + 1
        except orjson.JSONDecodeError:
            pass
        quote = payload.find(b'"', quote + 1)
    return -1


def _padding(suffix: bytes) -> tuple[bytes, bytes | None]:
    """``(suffix, close)`` of a spelling whose bytes after the string are ``suffix``: split
    around the last OpenAI padding value when there is one (letters and digits, maybe
    none), else ``(suffix, None)``."""
    pad = suffix.rfind(_PADDING)
    if pad < 0:
        return suffix, None
    value_at = pad + len(_PADDING)
    quote = suffix.find(b'"', value_at)
    value = suffix[value_at:quote]
    if quote < 0 or (value and not value.isalnum()):
        return suffix, None
    return suffix[:value_at], suffix[quote:]


def _counter(
    payload: bytes, event: dict[str, Any], field: bytes, name: str, parts: tuple[int, int]
) -> tuple[int, int] | None:
    """``(at, digits)`` of the top-level integer ``name`` (spelled ``field``, e.g.
    ``b'"sequence_number":'``) in ``payload``, which decoded to ``event``, as
    :func:`raw_continuation` takes it; None when there is none such, in the prefix (which
    ends at ``parts[0]``) or in the last part (which starts at ``parts[1]``)."""
    found = payload.rfind(field)
    match = _DIGITS.match(payload, found + len(field)) if found >= 0 else None
    if match is None or event.get(name) != int(match[0]):
        return None
    at, end = match.span()
    if end - at > _MAX_COUNTER_DIGITS or payload[end : end + 1] not in (b",", b"}"):
        return None
    if end <= parts[0]:
        return at, end - at
    if at >= parts[1] and end < len(payload):
        return at - len(payload), end - at
    return None


def learned_spelling(
    payload: bytes,
    key: CallKey,
    field: bytes,
    put: Callable[[dict[str, Any], str], None],
    counter: str | None = None,
) -> RawContinuation | None:
    """The ``RawContinuation`` of events spelled like ``payload``, a fragment of ``key`` whose
    string follows the last ``field`` (e.g. ``b'"arguments":'``), an OpenAI padding value
    after it being a padding value, and the top-level integer ``counter`` (a field's name,
    e.g. ``"sequence_number"``), when given and found, a counter. None unless the same text
    with another string, padding and counter decodes to ``payload``'s event with just those
    values changed (``put`` sets the fragment in a decoded event): proof that the cuts are
    those tokens and nothing else."""
    at = payload.rfind(field)
    end = string_end(payload, at + len(field)) if at >= 0 else -1
    if end < 0:
        return None
    prefix = payload[: at + len(field)]
    suffix, close = _padding(payload[end:])
    try:
        expected = _loads(payload)
    except orjson.JSONDecodeError:  # (read the lenient way: an escaped lone surrogate)
        return None
    parts = (len(prefix), len(payload) - len(suffix if close is None else close))
    hole = None
    if counter is not None and counter in expected:
        # (None when it cannot be placed: a spelling with its value fixed would never match.)
        hole = _counter(payload, expected, b'"%s":' % counter.encode(), counter, parts)
        if hole is None:
            return None
    put(expected, "\x00")
    probe = prefix + b'"\\u0000"' + suffix
    if close is not None:
        expected["obfuscation"] = "Z"
        probe += b"Z" + close
    if hole is not None:
        start, digits = hole
        other = b"1" * digits if payload[start : start + digits] != b"1" * digits else b"2" * digits
        expected[counter] = int(other)
        probe = probe[:start] + other + probe[start + digits :]
    try:
        same = _loads(probe) == expected
    except orjson.JSONDecodeError:
        same = False
    return raw_continuation(prefix, suffix, key, close, hole) if same else None
