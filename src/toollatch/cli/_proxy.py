"""``toollatch proxy --upstream URL``: its arguments and its handler (the server is
:class:`toollatch.relay.ProxyServer`, imported only here: it needs the ``[run]`` extra).

Serves an OpenAI-compatible ``/v1/chat/completions`` in front of ``URL`` until SIGTERM or
Ctrl-C; exit status 0 then, 2 for a usage or configuration error (a bad URL, a port that
cannot be bound, a host beyond loopback without ``--token``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ._args import Subparsers, positive, positive_seconds
from ._output import fail

NAME = "proxy"
_KEY_VARIABLE = "TOOLLATCH_PROXY_UPSTREAM_KEY"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``proxy`` and its arguments to ``subparsers``; returns its parser."""
    proxy: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="serve an OpenAI-compatible endpoint that sends a tool call only once committed",
        description="Put toollatch's gate in front of an OpenAI-compatible model server: any "
        "client (the openai SDK, LangChain, the AI SDK) gets one index per call, complete "
        "arguments, and never a call the gate refused.",
    )
    proxy.add_argument(
        "--upstream", required=True, metavar="URL", help="the model server's base URL (…/v1)"
    )
    _upstream_provider(proxy)
    proxy.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    proxy.add_argument("--port", type=int, default=8080, help="port to listen on (8080; 0: any)")
    _options(proxy)
    proxy.epilog = (
        f"The upstream's API key, if the proxy holds it: {_KEY_VARIABLE} (then the clients' "
        "Authorization is not forwarded)."
    )
    return proxy


def _upstream_provider(proxy: argparse.ArgumentParser) -> None:
    """The upstream's wire (the list is :data:`toollatch.relay._proxy_upstreams`' own)."""
    proxy.add_argument(
        "--upstream-provider",
        choices=["openai_chat", "anthropic", "gemini", "openai_responses", "bedrock"],
        default="openai_chat",
        help="the upstream's wire: openai_chat (the default: forwarded as is), or anthropic, "
        "gemini, openai_responses, bedrock (the client's chat request translated, the answer "
        "given back in OpenAI chat's format); URL is then the base URL that provider's SDK "
        "takes (bedrock: https://bedrock-runtime.REGION.amazonaws.com)",
    )


def _options(proxy: argparse.ArgumentParser) -> None:
    """The calls' mode, the token, the recording and the bounds."""
    proxy.add_argument(
        "--calls",
        choices=["hold"],
        default="hold",
        help="hold: a call is sent once the gate committed it, whole (the default)",
    )
    proxy.add_argument(
        "--token",
        help="the token clients must send ('auto' makes one; required beyond loopback): as "
        "X-Toollatch-Token, or as the API key when the upstream key is configured",
    )
    proxy.add_argument(
        "--record",
        metavar="DIR",
        help="save each upstream answer there as a fixture `toollatch replay` reads "
        "(credentials masked)",
    )
    proxy.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="fail a round whose upstream sends nothing for this long (60)",
    )
    proxy.add_argument(
        "--max-request-bytes",
        type=positive,
        default=16 * 1024 * 1024,
        metavar="N",
        help="refuse a larger request body (16 MiB)",
    )


def command(args: argparse.Namespace) -> int:
    """Serve until a signal; the exit status."""
    try:
        import asyncio  # noqa: PLC0415 (not for the other subcommands)

        from ..core._errors import ConfigError  # noqa: PLC0415
        from ..relay import ProxyServer  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return fail(f"toollatch proxy needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    try:
        server = ProxyServer(
            args.upstream,
            host=args.host,
            port=args.port,
            token=args.token,
            upstream_key=os.environ.get(_KEY_VARIABLE) or None,
            calls=args.calls,
            record=args.record,
            idle_timeout_s=args.idle_timeout,
            max_request_bytes=args.max_request_bytes,
            upstream_provider=args.upstream_provider,
        )
        return asyncio.run(_serve(server))
    except ConfigError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 0


async def _serve(server: Any) -> int:
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415

    async with server:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        token = f" (token {server.token})" if server.token else ""
        sys.stderr.write(f"toollatch proxy on {server.url} -> {server.upstream}{token}\n")
        sys.stderr.flush()
        await server.serve_forever()
    return 0
