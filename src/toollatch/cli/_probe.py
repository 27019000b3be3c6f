"""``toollatch probe --base-url URL --model M``: its arguments and its handler (the battery
and the quirk scan are :mod:`toollatch.cli._probe_battery`, imported only here).

Exit status 0 when every request got an answer to judge, 1 when one did not (a refusal, a
connection error: the report says which), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ._args import Subparsers, positive_seconds
from ._output import fail

NAME = "probe"
_KEY_VARIABLE = "TOOLLATCH_PROBE_API_KEY"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``probe`` and its arguments to ``subparsers``; returns its parser."""
    probe: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="send a battery of tool-calling requests to a server and report its quirks",
        description="How does this OpenAI-compatible server stream tool calls? Sends one "
        "call, parallel calls, a truncation, unicode, nested objects, a required-only "
        "schema, a forced tool choice and a second turn, and reports the quirks (QUIRKS.md "
        "codes), the end signals and whether each call would commit.",
        epilog=f"The API key, if the server needs one: {_KEY_VARIABLE}.",
    )
    probe.add_argument("--base-url", required=True, metavar="URL", help="…/v1")
    probe.add_argument("--model", required=True, help="the model to ask")
    probe.add_argument("--json", action="store_true", help="one JSON document on stdout")
    probe.add_argument(
        "--record", metavar="DIR", help="save each answer as a replayable fixture there"
    )
    probe.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="per request (120)",
    )
    return probe


def command(args: argparse.Namespace) -> int:
    """Probe, print the report; the exit status."""
    try:
        import asyncio  # noqa: PLC0415 (not for the other subcommands)

        import httpx  # noqa: PLC0415

        from ._probe_battery import QUIRKS, report, run_probe  # noqa: PLC0415
    except ImportError as exc:
        return fail(f"toollatch probe needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    if not args.base_url.startswith(("http://", "https://")):
        return fail(f"--base-url must be an http(s) URL, got {args.base_url!r}")

    async def probing() -> list:  # type: ignore[type-arg]
        async with httpx.AsyncClient(timeout=args.timeout) as http:
            return await run_probe(
                http,
                args.base_url,
                args.model,
                api_key=os.environ.get(_KEY_VARIABLE) or None,
                record=Path(args.record) if args.record else None,
            )

    results = asyncio.run(probing())
    if args.json:
        seen = sorted({q for r in results for q in r.quirks}, key=lambda q: int(q[1:]))
        document = {
            "base_url": args.base_url,
            "model": args.model,
            "probes": [r.as_dict() for r in results],
            "quirks": {q: QUIRKS[q] for q in seen},
        }
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(report(results))
    return 1 if any(r.error for r in results) else 0
