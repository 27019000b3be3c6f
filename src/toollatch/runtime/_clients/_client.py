"""Model clients over httpx: one streaming request per round, raw body bytes out.

Theory of operation. :meth:`ModelClient.stream` builds the provider's request (see
:mod:`._wire`) and returns a :class:`ModelStream`. Entering it sends the request and waits
for the first body chunk, all under one first-byte deadline; a retryable failure at that
stage (HTTP 408/409/429/5xx unless the server says ``x-should-retry: false``, a transport
error) is retried with exponential backoff and jitter, honouring ``Retry-After``, within a
bounded number of attempts and of total wait.
A 2xx response must be an event stream: its first bytes are looked at (the content-type
alone is not trusted either way, see :func:`_is_event_stream`), and a body that is not one
(a JSON error sent with 200, an HTML page, an empty body) raises :class:`ModelResponseError`
carrying the provider's message, without a retry.
Once entered, iterating yields the body's chunks as read (content-decoded; a gzip or deflate
body is inflated here in bounded pieces, so a small compressed read never becomes a huge
chunk), each under the idle deadline, all of them under ``ClientLimits.max_body_bytes``
(:class:`StreamTooLarge`); from the first chunk on nothing is retried, because the caller has
seen bytes: a new request is a new attempt, the loop's call (after
:meth:`ModelClient.pause_before_retry`).

Foreign exceptions (httpx, asyncio timeouts) are translated here and only here into the
typed errors of :mod:`._errors`.

Use, once per round (the caller owns the parser)::

    async with model_client("anthropic", model="claude-x") as client:
        parser = StreamParser(client.provider, tools=tools)
        async with client.stream(history, tools=tools, system="...") as s:
            async for chunk in s:
                parser.feed(chunk)
        round_ = parser.finish()
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
import orjson

from ...core._errors import ConfigError, UsageError
from ...core._registry import Framing
from ...core._specs import ToolSpec, load_tools
from .._recorder import Recorder
from . import _bedrock as bedrock
from ._deadline import IdleDeadline
from ._errors import (
    ModelConnectError,
    ModelError,
    ModelHTTPError,
    ModelResponseError,
    StreamInterrupted,
    StreamTimeout,
    StreamTooLarge,
    endpoint_hint,
    error_message,
    shown_url,
)
from ._http import StreamClient
from ._policy import ClientLimits, RetryPolicy, retry_after_s
from ._pool import SharedHTTP, shared_http
from ._wire import DIALECTS, Dialect, Request

Sleep = Callable[[float], Awaitable[None]]

_log = logging.getLogger("toollatch.client")

_TRANSPORT = (httpx.TransportError, httpx.DecodingError)
"""httpx's errors of the connection or of the bytes on it (timeouts included)."""


class _Retryable(Exception):  # an internal signal: never escapes this module
    """An attempt failed in a way worth retrying; ``error`` is raised if it is the last."""

    def __init__(
        self, error: ModelHTTPError | ModelConnectError, retry_after_s: float | None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


class ModelClient:
    """Streams one provider's responses; one instance per provider/model/base URL.

    Make one with :func:`model_client`. ``async with client.stream(history, tools=...) as s``
    then ``async for chunk in s`` gives the raw body for a :class:`toollatch.StreamParser`
    of :attr:`provider`. Without an httpx client passed in, requests go out on the running
    event loop's shared connections (:mod:`._pool`: kept alive across the model clients of
    a loop, closed when the loop shuts down; each body read by aiohttp's parser behind
    httpx's API, :mod:`._http`); use the client itself as an async context
    manager (or call :meth:`aclose`) to give them back. A client passed in is left open.
    """

    def __init__(
        self,
        dialect: Dialect,
        *,
        model: str,
        base_url: str,
        api_key: str | None,
        http: httpx.AsyncClient | None,
        limits: ClientLimits,
        retry: RetryPolicy,
        headers: Mapping[str, str],
        sleep: Sleep,
        random_unit: Callable[[], float],
        record: Path | None = None,
        signer: bedrock.Signer | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self._dialect = dialect
        self._signer = signer
        self._secrets = secrets  # the signer's keys: masked in recordings like the API key
        self.record = record
        """A folder where each response is saved as a replayable fixture (None: none;
        :class:`toollatch.runtime.Recorder`: credentials masked, the API key among them)."""
        self._api_key = api_key
        self.model = model
        """The model name sent with each request."""
        self.base_url = base_url
        """The base URL requests go under (no trailing slash)."""
        self.limits = limits
        self.retry = retry
        self._given_http = http
        self._shared: SharedHTTP | None = None  # the loop's, while this client holds it
        self._headers = httpx.Headers(
            {
                "accept": "text/event-stream",
                # only what _body inflates in bounded pieces (httpx would also offer br, zstd)
                "accept-encoding": "gzip, deflate",
                "content-type": "application/json",
                **dialect.fixed_headers,
                **(dialect.auth(api_key) if api_key else {}),
            }
        )
        self._headers.update(headers)  # the caller's win, whatever their case
        self._sleep = sleep
        self._random_unit = random_unit
        # parsed once (again only if model or base_url is changed): parsing the URL was most
        # of build_request's cost
        self._url = (self.url, _parsed_url(self.url))
        self._timeout = httpx.Timeout(None, connect=limits.connect_s, pool=limits.connect_s)

    @property
    def provider(self) -> str:
        """The toollatch provider name: pass it to :class:`toollatch.StreamParser`."""
        return self._dialect.provider

    @property
    def framing(self) -> Framing:
        """How the answer's body is framed: pass it to :class:`toollatch.StreamParser`
        (``sse``; ``eventstream`` for Bedrock)."""
        return self._dialect.framing

    @property
    def url(self) -> str:
        """The full URL each request of this client is sent to."""
        return self.base_url + self._dialect.path(self.model)

    def request_body(
        self,
        history: Sequence[Mapping[str, Any]],
        *,
        tools: Iterable[ToolSpec | Mapping[str, Any]] = (),
        system: str | None = None,
        max_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The JSON body :meth:`stream` sends for these arguments (see there)."""
        if isinstance(history, str | bytes) or not isinstance(history, Sequence):
            raise UsageError("history must be a list of messages in the provider's format")
        if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens > 0):
            raise UsageError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        specs = load_tools(list(tools))
        request = Request(
            history=history, tools=specs, system=system, max_tokens=max_tokens, extra=extra or {}
        )
        body = self._dialect.body(self.model, request)
        for key, value in request.extra.items():
            built = body.get(key)
            extends = key in self._dialect.extended and isinstance(value, dict)
            if extends and isinstance(built, dict):
                body[key] = {**built, **value}
            else:
                body[key] = value
        return body

    def stream(
        self,
        history: Sequence[Mapping[str, Any]],
        *,
        tools: Iterable[ToolSpec | Mapping[str, Any]] = (),
        system: str | None = None,
        max_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ModelStream:
        """One round's streaming request, as an async context manager (nothing is sent
        until it is entered).

        ``history``: the messages (chat, Anthropic), input items (Responses) or contents
        (Gemini) so far, in the provider's format. ``tools``: specs or definitions (as
        :func:`toollatch.load_tools` takes them). ``system``: the provider's system field.
        ``max_tokens``: the output cap (Anthropic requires one: 4096 when None). ``extra``:
        top-level body keys merged last. Raises ``UsageError``/``ConfigError`` for bad
        arguments now; entering raises :class:`ModelHTTPError`, :class:`ModelConnectError`
        or :class:`StreamTimeout` (``first_byte``); iterating raises :class:`StreamTimeout`
        (``idle``) or :class:`StreamInterrupted`.
        """
        body = self.request_body(
            history, tools=tools, system=system, max_tokens=max_tokens, extra=extra
        )
        try:
            content = orjson.dumps(body)
        except orjson.JSONEncodeError as exc:
            raise UsageError(f"the request is not JSON data ({exc}): pass plain dicts") from None
        return ModelStream(self, content)

    async def pause_before_retry(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1-based) of a request whose stream broke:
        :meth:`RetryPolicy.backoff_s` with jitter, made with the client's ``sleep``. Returns
        the wait made, in seconds."""
        delay = self.retry.backoff_s(retry, self._random_unit())
        await self._sleep(delay)
        return delay

    async def aclose(self) -> None:
        """Give back the loop's shared connections (a client passed in is left open).
        Idempotent; a request made after it takes them again."""
        if self._shared is not None:
            self._shared.release()
            self._shared = None

    def _http(self) -> httpx.AsyncClient:
        """The httpx client a request goes out on: the one passed in, or the running
        loop's shared one (:mod:`._pool`), taken on first use."""
        if self._given_http is not None:
            return self._given_http
        shared = self._shared
        if shared is None or shared.loop is not asyncio.get_running_loop():
            if shared is not None:  # used in a loop before this one
                shared.release()
            shared = self._shared = shared_http()
            shared.acquire()
        return shared.client

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _open(
        self, content: bytes, deadline: IdleDeadline
    ) -> tuple[httpx.Response, AsyncIterator[bytes], bytes, int]:
        """Send with retries until a first chunk (b"" for an empty body) is in hand, each
        attempt under the first-byte deadline (timed by ``deadline``, the stream's)."""
        waited = 0.0
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return (*await self._attempt(content, attempt, deadline), attempt)
            except _Retryable as failure:
                delay = failure.retry_after_s
                if delay is None:
                    delay = self.retry.backoff_s(attempt, self._random_unit())
                if attempt == self.retry.attempts or waited + delay > self.retry.max_total_wait_s:
                    raise failure.error from None
                await self._sleep(delay)
                waited += delay
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    async def _attempt(
        self, content: bytes, attempt: int, deadline: IdleDeadline
    ) -> tuple[httpx.Response, AsyncIterator[bytes], bytes]:
        provider, limits = self.provider, self.limits
        if self._url[0] != self.url:
            self._url = (self.url, _parsed_url(self.url))
        headers = self._headers
        if self._signer is not None:  # (per attempt: a signature holds its time)
            headers = headers.copy()
            headers.update(self._signer(self._url[0], content))
        http = self._http()
        request = http.build_request(
            "POST", self._url[1], content=content, headers=headers, timeout=self._timeout
        )
        # (the stream's idle deadline times the first byte: one timer for both)
        deadline.reading(limits.first_byte_s)
        try:
            if isinstance(http, StreamClient):  # (the shared pool, the relay's: the short way)
                response = await http.send_stream(request)
            else:
                response = await http.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    raise await self._http_error(response, attempt)
                chunks = _body(response)
                first = await self._stream_start(response, chunks, attempt)
            except BaseException:
                await response.aclose()  # also on cancellation: never leak the connection
                raise
        except asyncio.CancelledError:
            if not deadline.expired_for():
                raise
            raise StreamTimeout(provider, kind="first_byte", seconds=limits.first_byte_s) from None
        except _TRANSPORT as exc:
            # nothing reached the caller yet: a failed connect or a response that broke
            # before its first byte is as safe to retry as a 503
            error = ModelConnectError(
                provider, cause=exc, attempts=attempt, url=shown_url(self.url)
            )
            _log.debug("%s: attempt %d to %s failed: %r", provider, attempt, error.url, exc)
            raise _Retryable(error, None) from exc
        finally:
            deadline.done()
        return response, chunks, first

    async def _stream_start(
        self, response: httpx.Response, chunks: AsyncIterator[bytes], attempt: int
    ) -> bytes:
        """The body's first chunk (a few joined when the first are tiny: enough to judge);
        raises :class:`ModelResponseError` (the response closed) when it is not an event
        stream."""
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        head = b""
        while True:
            chunk = await anext(chunks, None)
            ended = chunk is None
            head += chunk or b""
            verdict = _is_event_stream(head, ended, content_type)
            if verdict is None and len(head) >= self.limits.error_body_bytes:
                verdict = True  # only blank lines so far: the parser and the idle deadline judge
            if verdict is not None:
                break
        if verdict:
            return head
        raw = head if ended else await _read_some(chunks, self.limits.error_body_bytes, head)
        await response.aclose()
        raise ModelResponseError(
            self.provider,
            status=response.status_code,
            content_type=content_type,
            body=raw[: self.limits.error_body_bytes],
            attempts=attempt,
            url=shown_url(self.url),
        )

    async def _http_error(self, response: httpx.Response, attempt: int) -> Exception:
        """The error for an error response (closed here): retryable or final."""
        try:
            raw = await _read_some(_body(response), self.limits.error_body_bytes)
        finally:
            await response.aclose()
        wait = retry_after_s(response.headers, time.time())
        error = ModelHTTPError(
            self.provider,
            status=response.status_code,
            message=error_message(raw),
            body=raw,
            retry_after_s=wait,
            attempts=attempt,
            url=shown_url(self.url),
            hint=endpoint_hint(
                response.status_code,
                self.base_url,
                self._dialect.default_base_url,
                self._dialect.path(self.model),
            ),
        )
        # OpenAI's and Anthropic's servers may say so themselves (their SDKs obey it)
        hint = response.headers.get("x-should-retry")
        if hint == "true" or (hint != "false" and response.status_code in self.retry.statuses):
            return _Retryable(error, wait)
        return error


class ModelStream:
    """One request's body as it arrives (see :meth:`ModelClient.stream`).

    ``async with`` sends the request and waits for the first chunk; ``async for chunk``
    yields ``bytes`` chunks exactly as read (after HTTP content decoding), never empty.
    Leaving the ``async with`` closes the response, also mid-stream. Iterate once.
    """

    def __init__(self, client: ModelClient, content: bytes) -> None:
        self._client = client
        self._content = content
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._idle: IdleDeadline | None = None
        self._first = b""
        self._done = False
        self._closed = False
        self._max_bytes = client.limits.max_body_bytes
        self._recorder: Recorder | None = None
        self.attempts = 0
        """Requests it took to get the response (1 when nothing was retried)."""
        self.bytes_received = 0
        """Body bytes yielded so far."""

    @property
    def status(self) -> int:
        """The response's HTTP status (after entering)."""
        return self._opened().status_code

    @property
    def headers(self) -> httpx.Headers:
        """The response's headers (after entering), e.g. a provider's request id."""
        return self._opened().headers

    def _opened(self) -> httpx.Response:
        if self._response is None:
            raise UsageError("enter the stream (async with) before using it")
        return self._response

    async def __aenter__(self) -> Self:
        if self._response is not None or self._done:
            raise UsageError("a ModelStream is entered once; call client.stream() again")
        deadline = IdleDeadline(self._client.limits.idle_s)
        try:
            opened = await self._client._open(self._content, deadline)
        except BaseException:
            deadline.close()
            raise
        self._response, self._chunks, self._first, self.attempts = opened
        self._idle = deadline
        client = self._client
        if client.record is not None:
            body = orjson.loads(self._content)
            known = [client._api_key or "", *client._secrets]
            self._recorder = Recorder(client.record, body, known=known, provider=client.provider)
            self._recorder.begin(self._response.status_code, client.base_url)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        self._done = True
        if self._closed:  # at the body's end, then again on leaving the block
            return
        if self._recorder is not None:
            self._recorder.close()
        if self._idle is not None:
            self._idle.close()
        close_chunks = getattr(self._chunks, "aclose", None)
        if close_chunks is not None:
            await close_chunks()  # httpx's generator, so that it is not left to the GC
        if self._response is not None:
            await self._response.aclose()  # back to the pool (idempotent)
        self._closed = True  # (only once all is closed: a cancelled close is done again)

    def __aiter__(self) -> Self:
        self._opened()
        return self

    async def __anext__(self) -> bytes:
        # The hot path of a round: one call per body chunk, so it does no more than it
        # must per chunk (the idle deadline moves a float; see _deadline).
        chunks, idle = self._chunks, self._idle
        if self._done or chunks is None or idle is None:
            raise StopAsyncIteration
        if self._first:
            chunk, self._first = self._first, b""
            self.bytes_received += len(chunk)
            if self.bytes_received > self._max_bytes:
                raise self._too_large()
            if self._recorder is not None:
                self._recorder.write(chunk)
            return chunk
        while True:
            idle.reading()
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                await self._close()  # the connection goes back to the pool at once
                raise
            except BaseException as exc:
                error = self._failed(exc, idle)
                if error is None:
                    raise
                raise error from (exc if isinstance(error, StreamInterrupted) else None)
            finally:
                idle.done()
            if chunk:
                self.bytes_received += len(chunk)
                if self.bytes_received > self._max_bytes:
                    raise self._too_large()
                if self._recorder is not None:
                    self._recorder.write(chunk)
                return chunk

    def _too_large(self) -> StreamTooLarge:
        self._done = True
        wire = self._response.num_bytes_downloaded if self._response is not None else 0
        return StreamTooLarge(
            self._client.provider,
            limit=self._max_bytes,
            bytes_received=self.bytes_received,
            wire_bytes=wire,
        )

    def _failed(self, exc: BaseException, idle: IdleDeadline) -> ModelError | None:
        """The typed error a read's exception becomes; None to re-raise it as it is (a
        cancellation that is not the idle deadline's, anything unexpected)."""
        provider, idle_s = self._client.provider, self._client.limits.idle_s
        if isinstance(exc, asyncio.CancelledError):
            if not idle.expired_for():
                return None
        elif not isinstance(exc, _TRANSPORT):
            return None
        self._done = True
        if isinstance(exc, asyncio.CancelledError | httpx.TimeoutException):
            return StreamTimeout(provider, kind="idle", seconds=idle_s)
        return StreamInterrupted(provider, cause=exc, bytes_received=self.bytes_received)


_BLANK = b"\xef\xbb\xbf \t\r\n"  # (a UTF-8 BOM's bytes too: lstrip takes them as a set)
_SSE_FIELDS = (b"data", b"event", b"id", b"retry")
_NOT_A_STREAM = (b"{", b"[", b"<")
_STREAM_TYPES = ("", "text/event-stream", "application/vnd.amazon.eventstream")


def _is_event_stream(head: bytes, ended: bool, content_type: str) -> bool | None:
    """Whether a 2xx body starting with ``head`` (``ended``: that is all of it) is an event
    stream; None when more bytes are needed to tell (blank lines, a field name cut short).
    Its first bytes decide first: an SSE line (``data:``, ``event:``, ``id:``,
    ``retry:``, a ``:`` comment) is one whatever the label (some servers send SSE as
    ``application/json`` or ``text/plain``); a JSON document or markup (``{`` ``[`` ``<``:
    an error body, an HTML page, Gemini's non-SSE array) or an empty body is not, whatever
    the label (some proxies send an error page as ``text/event-stream``). Anything else
    is left to the stream parser when labelled ``text/event-stream`` or not labelled at
    all, and is not a stream under any other label (``text/plain`` "Internal error")."""
    text = head.lstrip(_BLANK)
    if not text:
        return None if not ended else False
    if text.startswith(b":"):
        return True
    if text.startswith(_NOT_A_STREAM):
        return False
    for name in _SSE_FIELDS:
        if len(text) <= len(name):
            if name.startswith(text) and not ended:
                return None
        elif text.startswith(name) and text[len(name)] in b":\r\n":
            return True
    return content_type in _STREAM_TYPES


async def _read_some(chunks: AsyncIterator[bytes], limit: int, head: bytes = b"") -> bytes:
    """At most ``limit`` bytes of what is left of a body, after ``head`` (for an error's
    message): a body cut short by the connection gives what it has."""
    body = bytearray(head)
    try:
        while len(body) < limit:
            chunk = await anext(chunks, None)
            if chunk is None:
                break
            body += chunk
    except _TRANSPORT:
        pass  # the status is the news; a body cut short still gives what it has
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
    return bytes(body[:limit])


_PIECE_BYTES = 256 * 1024
"""The most a compressed read becomes per chunk: zlib makes up to ~1,000x of its input, so a
64 KiB read of a gzip bomb would otherwise be one 64 MiB chunk."""
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 0}


@functools.lru_cache(maxsize=64)
def _parsed_url(url: str) -> httpx.URL:
    """``url`` parsed by httpx, once per process for the few URLs an application calls: a
    conversation written as ``async with model_client(...)`` makes a client each time, and
    parsing was half of making one. (An ``httpx.URL`` is immutable: it is safe to share.)"""
    return httpx.URL(url)


def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The response body's chunks as read. An unencoded body is read from the response's
    own stream: ``aiter_bytes`` adds two generators and a decoder and a chunker call per
    chunk, which pass an identity body through unchanged. A gzip or deflate body is inflated
    here in pieces of at most ``_PIECE_BYTES`` (httpx's decoder inflates each read whole);
    another encoding is left to httpx."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    stream = response.stream
    if encoding == "identity" and isinstance(stream, httpx.AsyncByteStream):
        return aiter(stream)
    wbits = _INFLATE_WBITS.get(encoding)
    if wbits is not None:
        return _inflated(response.aiter_raw(), wbits)
    return aiter(response.aiter_bytes())


async def _inflated(raw: AsyncIterator[bytes], wbits: int) -> AsyncIterator[bytes]:
    """``raw`` inflated in bounded pieces. ``wbits`` 0 is deflate: the zlib format, or raw
    deflate when the first bytes are not a zlib header (servers send both, and httpx reads
    both: httpx/_decoders.py DeflateDecoder). A corrupt body raises ``httpx.DecodingError``
    (a broken stream, as httpx's own decoders do)."""
    inflate = zlib.decompressobj(wbits or zlib.MAX_WBITS)
    started = False
    try:
        async for read in raw:
            data = read
            while data:
                try:
                    piece = inflate.decompress(data, _PIECE_BYTES)
                except zlib.error as exc:
                    if wbits or started:
                        raise httpx.DecodingError(f"cannot inflate the body: {exc}") from None
                    inflate = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, once
                    started = True
                    continue
                started = True
                data = inflate.unconsumed_tail
                if piece:
                    yield piece
                # a full piece with all input taken may leave output pending: ask again
                while not data and len(piece) == _PIECE_BYTES:
                    piece = inflate.decompress(b"", _PIECE_BYTES)
                    if piece:
                        yield piece
    finally:
        close = getattr(raw, "aclose", None)
        if close is not None:
            await close()


def model_client(
    provider: str,
    *,
    model: str,
    base_url: str | None = None,
    api_key: str | None = None,
    http: httpx.AsyncClient | None = None,
    limits: ClientLimits | None = None,
    retry: RetryPolicy | None = None,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    sleep: Sleep | None = None,
    random_unit: Callable[[], float] | None = None,
    record: str | Path | None = None,
) -> ModelClient:
    """A :class:`ModelClient` for ``provider`` (``openai_chat``, ``openai_responses``,
    ``anthropic``, ``gemini``, ``bedrock``).

    ``base_url`` defaults to the provider's variable (``OPENAI_BASE_URL``,
    ``ANTHROPIC_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL``), then its official URL;
    ``api_key`` to ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``GEMINI_API_KEY`` (or
    ``GOOGLE_API_KEY``), read from ``env`` (default ``os.environ``). A key is required only
    when the requests go to the provider's own host: its absence then raises
    ``ConfigError`` naming the variable. ``http``: an httpx client to use (left open; default: the
    running loop's shared one, see :class:`ModelClient`).
    ``headers`` are added to every request. ``record``: a folder where each response is
    saved as a fixture ``toollatch replay`` reads (credentials masked, see
    :class:`toollatch.runtime.Recorder`). ``sleep`` and ``random_unit`` (a float in [0, 1))
    are for tests. Raises ``UsageError`` for an unknown provider.

    ``bedrock`` (ConverseStream) reads AWS's variables instead: a Bedrock API key
    (``api_key`` or ``AWS_BEARER_TOKEN_BEDROCK``, sent as a bearer), else
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` with each request
    signed (SigV4, the ``[bedrock]`` extra: botocore) for the region of the endpoint's host
    or ``AWS_REGION``; the endpoint is ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` or the region's
    (see :mod:`._bedrock`). Its answers are recorded as ``.eventstream`` files, the AWS keys
    masked with the API key.
    """
    dialect = DIALECTS.get(provider)
    if dialect is None:
        known = ", ".join(DIALECTS)
        raise UsageError(f"no model client for provider {provider!r}; known: {known}")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{provider}: model must be a non-empty string, got {model!r}")
    environ = os.environ if env is None else env
    signer: bedrock.Signer | None = None
    secrets: tuple[str, ...] = ()
    if provider == "bedrock":
        given = base_url
        if not given and not environ.get(bedrock.ENDPOINT_VARIABLE):
            given = bedrock.default_base_url(environ)
        base = _base_url(dialect, given, environ)
        key, signer = bedrock.auth(base, api_key, environ)
        if signer is not None:
            secrets = tuple(environ.get(v, "") for v in bedrock.SIGNING_VARIABLES)
    else:
        base = _base_url(dialect, base_url, environ)
        key = api_key or next((environ[v] for v in dialect.key_variables if environ.get(v)), None)
        own_host = urlsplit(base).hostname == urlsplit(dialect.default_base_url).hostname
        if key is None and own_host:
            variable = dialect.key_variables[0]
            raise ConfigError(f"{provider}: no API key for {base}: set {variable} or pass api_key")
    return ModelClient(
        dialect,
        model=model,
        base_url=base,
        api_key=key,
        http=http,
        limits=limits or ClientLimits(),
        retry=retry or RetryPolicy(),
        headers=dict(headers or {}),
        sleep=sleep or asyncio.sleep,
        random_unit=random_unit or random.random,
        record=None if record is None else Path(record),
        signer=signer,
        secrets=secrets,
    )


def _base_url(dialect: Dialect, given: str | None, env: Mapping[str, str]) -> str:
    variable = dialect.base_url_variable
    base = given or (env.get(variable) if variable else None) or dialect.default_base_url
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        source = "base_url" if given else (variable or "base_url")
        raise ConfigError(f"{dialect.provider}: {source} must be an http(s) URL, got {base!r}")
    return base.rstrip("/")
