"""A round-robin load balancer for the relay's scale-out tests, and ``toollatch serve``
workers whose stderr is drained (a worker that logs a Redis outage never blocks on a full
pipe).

:class:`Balancer` is a TCP proxy on ``127.0.0.1`` port 0, in a thread of its own (its own
event loop: a test's blocking calls never stall it). Each new client connection goes to the
next backend in turn; a backend that refuses the connection (a killed worker) is skipped for
the next one, as a load balancer's passive health check does (nginx's ``proxy_next_upstream
error``, https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_next_upstream).
Nothing is sticky: no cookie, no client address, no hash picks the backend. The first
request of a connection gets ``Connection: close`` (the client opens a new connection, to
the next backend, for its next request: keep-alive cannot pin a client to one worker), and
its request line is logged with the backend it went to (:attr:`Balancer.routes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from relay_helpers import CLI

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 65536


@dataclass
class Route:
    """One client connection: where it went and the request it carried."""

    backend: int
    method: str
    path: str
    last_event_id: int | None
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)


def _rewrite(head: bytes) -> tuple[bytes, str, str, int | None]:
    """The request head with ``Connection: close`` in place of any Connection header; its
    method, path and Last-Event-ID."""
    lines = head.removesuffix(_HEAD_END).split(b"\r\n")
    method, path, _version = lines[0].decode("latin-1").split(" ", 2)
    kept = [lines[0]]
    last_id = None
    for line in lines[1:]:
        name = line.split(b":", 1)[0].strip().lower()
        if name == b"connection":
            continue
        if name == b"last-event-id":
            last_id = int(line.split(b":", 1)[1].strip())
        kept.append(line)
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + _HEAD_END, method, path, last_id


class Balancer:
    """Round-robin over ``backends`` (``http://127.0.0.1:PORT`` each); ``url`` is its own."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = [_address(url) for url in backends]
        self.routes: list[Route] = []
        self.url = ""
        self._next = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="balancer", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> Balancer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the balancer did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        self._loop.close()

    def routed(self, method: str, path: str) -> list[Route]:
        """The connections that carried ``method path`` (oldest first)."""
        with self._lock:
            return [r for r in self.routes if (r.method, r.path) == (method, path)]

    def cut(self, route: Route) -> None:
        """Close ``route``'s client connection (as a balancer restart does)."""
        writer = route.writer
        if writer is not None:
            self._loop.call_soon_threadsafe(writer.transport.abort)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # (a client or backend that went away: both sides are closed below)
        except asyncio.CancelledError:
            pass  # (the balancer stops; asyncio's callback would log a cancelled task)
        finally:
            writer.transport.abort()
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(_HEAD_END)
        if len(head) > _MAX_HEAD:
            return
        head, method, path, last_id = _rewrite(head)
        backend, upstream = await self._connect()
        route = Route(backend, method, path, last_id, writer)
        with self._lock:
            self.routes.append(route)
        up_reader, up_writer = upstream
        try:
            up_writer.write(head)
            async with asyncio.TaskGroup() as group:
                group.create_task(_pipe(reader, up_writer))
                group.create_task(_pipe(up_reader, writer))
        finally:
            up_writer.transport.abort()

    async def _connect(self) -> tuple[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        """The next backend that accepts a connection (each is tried once)."""
        with self._lock:
            first = self._next
            self._next = (self._next + 1) % len(self.backends)
        for step in range(len(self.backends)):
            backend = (first + step) % len(self.backends)
            try:
                return backend, await asyncio.open_connection(*self.backends[backend])
            except OSError:
                continue
        raise OSError("no backend accepts connections")


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends; then end ``sink`` (and so the whole connection)."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:
        sink.transport.abort()


def _address(url: str) -> tuple[str, int]:
    match = re.fullmatch(r"http://([\d.]+):(\d+)", url)
    assert match is not None, url
    return match.group(1), int(match.group(2))


@dataclass
class Worker:
    """One ``toollatch serve`` process; what it wrote to stderr is in ``log``."""

    proc: subprocess.Popen[str]
    url: str
    log: list[str] = field(default_factory=list)
    _drain: threading.Thread | None = None

    def start_draining(self) -> None:
        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()

    def kill(self) -> None:
        """SIGKILL: no clean-up at all."""
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=15) == -signal.SIGKILL

    def stop(self) -> None:
        """Ctrl-C, if it still runs; the pipe closed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._drain is not None:
            self._drain.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def start_workers(n: int, *args: str) -> list[Worker]:
    """``n`` ``toollatch serve --port 0 *args`` started side by side (their imports overlap)."""
    procs = [
        subprocess.Popen([*CLI, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    workers: list[Worker] = []
    for proc in procs:
        assert proc.stderr is not None
        log: list[str] = []
        match = None
        while match is None and (line := proc.stderr.readline()):  # (DBOS may log first)
            log.append(line)
            match = re.search(r"http://127\.0\.0\.1:\d+", line)
        worker = Worker(proc, match.group(0) if match else "", log)
        worker.start_draining()
        workers.append(worker)
    if not all(w.url for w in workers):
        for worker in workers:
            worker.stop()
        raise AssertionError(f"serve did not start: {[''.join(w.log) for w in workers]}")
    return workers


@contextlib.contextmanager
def balanced_workers(n: int, *args: str) -> Iterator[tuple[Balancer, list[Worker]]]:
    """``n`` ``toollatch serve *args`` workers behind a :class:`Balancer`; every worker
    still alive stopped at the end."""
    workers = start_workers(n, *args)
    try:
        with Balancer([w.url for w in workers]) as balancer:
            yield balancer, workers
    finally:
        for worker in workers:
            worker.stop()
