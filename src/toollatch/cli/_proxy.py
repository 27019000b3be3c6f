"""``toollatch proxy --upstream URL``: its arguments and its handler (the server is
:class:`toollatch.relay.ProxyServer`, imported only here: it needs the ``[run]`` extra).

Serves an OpenAI-compatible ``/v1/chat/completions`` in front of ``URL`` until SIGTERM or
Ctrl-C; exit status 0 then, 2 for a usage or configuration error (a bad URL, a port that
cannot be bound, a host beyond loopback without ``--token``). Every setting is also in the
whole-app configuration's ``proxy:`` section: a flag wins over ``TOOLLATCH_PROXY__<KEY>``,
which wins over ``--config FILE``, which wins over the defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from ._args import Subparsers, positive, positive_seconds
from ._output import fail

if TYPE_CHECKING:
    from ..relay import ProxyServer

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
        "--upstream",
        metavar="URL",
        help="the model server's base URL (…/v1; required, here or as proxy.upstream)",
    )
    _upstream_provider(proxy)
    proxy.add_argument("--host", help="address to listen on (127.0.0.1)")
    proxy.add_argument("--port", type=int, help="port to listen on (8080; 0: any)")
    _options(proxy)
    proxy.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (its proxy: section; flags win over it, and "
        "TOOLLATCH_PROXY__<KEY> variables over the file)",
    )
    proxy.epilog = (
        f"The upstream's API key, if the proxy holds it: {_KEY_VARIABLE} (or the variable "
        "proxy.upstream_key_env names; then the clients' Authorization is not forwarded)."
    )
    return proxy


def _upstream_provider(proxy: argparse.ArgumentParser) -> None:
    """The upstream's wire (the list is :data:`toollatch.relay._proxy_upstreams`' own)."""
    proxy.add_argument(
        "--upstream-provider",
        choices=["openai_chat", "anthropic", "gemini", "openai_responses", "bedrock"],
        help="the upstream's wire: openai_chat (the default: forwarded as is), or anthropic, "
        "gemini, openai_responses, bedrock (the client's chat request translated, the answer "
        "given back in OpenAI chat's format); URL is then the base URL that provider's SDK "
        "takes (bedrock: https://bedrock-runtime.REGION.amazonaws.com)",
    )


def _options(proxy: argparse.ArgumentParser) -> None:
    """The calls' mode, the token, the recording and the bounds."""
    proxy.add_argument(
        "--calls",
        choices=["hold", "stream"],
        help="hold: a call is sent once the gate committed it, whole (the default); stream: "
        "its argument text as it streams, for UIs, the verdicts in the last chunk (a client "
        "may then see part of a call that is refused at the end)",
    )
    proxy.add_argument(
        "--token",
        help="the token clients must send ('auto' makes one; required beyond loopback): as "
        "X-Toollatch-Token, or as the API key when the upstream key is configured",
    )
    proxy.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a Host name to accept besides loopback's and the bound one (repeatable)",
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
        metavar="SECONDS",
        help="fail a round whose upstream sends nothing for this long (60)",
    )
    proxy.add_argument(
        "--max-request-bytes",
        type=positive,
        metavar="N",
        help="refuse a larger request body (16 MiB)",
    )


def command(args: argparse.Namespace) -> int:
    """Serve until a signal; the exit status."""
    try:
        import asyncio  # noqa: PLC0415 (not for the other subcommands)

        from ..core._errors import ConfigError  # noqa: PLC0415
    except ImportError as exc:
        return fail(f"toollatch proxy needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    try:
        server = proxy_server(args)
        return asyncio.run(_serve(server))
    except ConfigError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 0


def proxy_server(args: argparse.Namespace, env: dict[str, str] | None = None) -> ProxyServer:
    """The proxy of the flags over ``TOOLLATCH_PROXY__*`` over ``--config`` over the defaults
    (``env``: default ``os.environ``). Raises ConfigError (an invalid setting, no upstream)
    and ImportError (no ``[run]`` extra)."""
    from ..core._errors import ConfigError  # noqa: PLC0415
    from ..relay import ProxyServer  # noqa: PLC0415 (the [run] extra, lazily)
    from ..relay._config import RelayLimits  # noqa: PLC0415
    from ._app_config import load_config  # noqa: PLC0415

    environ = os.environ if env is None else env
    c = load_config(args.config, env=environ)
    p = c.proxy
    upstream = args.upstream or p.upstream
    if upstream is None:
        raise ConfigError("the upstream is required: --upstream URL or proxy.upstream")
    connections = RelayLimits(
        max_connections=p.max_connections,
        max_header_bytes=p.max_header_bytes,
        header_timeout_s=p.header_timeout_s,
        idle_timeout_s=p.keepalive_timeout_s,
        body_timeout_s=p.body_timeout_s,
    )
    return ProxyServer(
        upstream,
        host=args.host or p.host,
        port=args.port if args.port is not None else p.port,
        token=args.token or p.token,
        allowed_hosts=[*p.allowed_hosts, *(args.allow_host or ())],
        upstream_key=environ.get(p.upstream_key_env) or None,
        calls=args.calls or p.calls,
        limits=c.limits(),
        record=args.record or p.record,
        idle_timeout_s=args.idle_timeout or p.idle_timeout_s,
        max_request_bytes=args.max_request_bytes or p.max_request_bytes,
        connections=connections,
        upstream_provider=args.upstream_provider or p.upstream_provider,
    )


async def _serve(server: Any) -> int:
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from ..relay._server import settle_heap  # noqa: PLC0415

    async with server:
        # as `toollatch serve` does: a full collection walked the 63,000 objects the start
        # made (imports, app) and paused every stream for 30-66 ms, a few times a minute
        # at 50 streams: most of the proxy's p99 added latency (benchmarks/README.md)
        settle_heap()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        token = f" (token {server.token})" if server.token else ""
        sys.stderr.write(f"toollatch proxy on {server.url} -> {server.upstream}{token}\n")
        sys.stderr.flush()
        await server.serve_forever()
    return 0
