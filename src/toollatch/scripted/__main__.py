"""``python -m toollatch.scripted``: serve the scripted model server until Ctrl-C.

Prints one line ``toollatch scripted model server: http://<host>:<port>`` (then the base
URLs per provider) and serves the demo as model ``scripted``, plus any ``--script
NAME=FILE.json`` given, on ``--host`` (default 127.0.0.1) and ``--port`` (default 0: any free
port). Exit status 0 on Ctrl-C, 2 for bad arguments, a bad script or an address that cannot
be bound.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from ..core._errors import ConfigError
from ._quirks import PROFILES
from ._script import Script
from ._server import PROVIDERS, ScriptedServer


def main(argv: list[str] | None = None) -> int:
    """Run the server in the foreground; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m toollatch.scripted")
    parser.add_argument("--script", action="append", default=[], metavar="NAME=FILE.json")
    parser.add_argument("--delay-scale", type=float, default=1.0)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: 0, any free port)"
    )
    parser.add_argument(
        "--quirks",
        choices=["none", *PROFILES],
        default="none",
        help="send the OpenAI chat stream as a quirky server family does (default: none)",
    )
    args = parser.parse_args(argv)
    try:
        scripts = dict(_load(spec) for spec in args.script)
        server = ScriptedServer(
            scripts=scripts,
            delay_scale=args.delay_scale,
            host=args.host,
            port=args.port,
            quirks=args.quirks,
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Ctrl-C (or SIGTERM) is how it is stopped: the handlers are in place before the server
    # starts, so a signal at any point ends the wait and the server stops cleanly (status 0),
    # never a KeyboardInterrupt raised in the middle of starting or stopping it.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server.__enter__()
    except ConfigError as exc:  # the address is taken or cannot be bound
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"toollatch scripted model server: {server.url}", flush=True)
        for provider in PROVIDERS:
            print(f"  {provider}: {server.base_url(provider)}", flush=True)
        stop.wait()
    finally:
        server.__exit__(None, None, None)
    return 0


def _load(spec: str) -> tuple[str, Script]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ConfigError(f"--script takes NAME=FILE.json, not {spec!r}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read script {path!r}: {exc.strerror}") from None
    return name, Script.from_json(text)


if __name__ == "__main__":
    sys.exit(main())
