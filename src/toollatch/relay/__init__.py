"""The relay: agent runs streamed to a browser as SSE, with a live page (needs ``[run]``).

``toollatch serve`` (:func:`serve_command`) or ``async with RelayServer() as relay`` serves
the page and the API (:class:`Relay`) on the scripted model by default; its bounds are
:class:`toollatch.RelayLimits` (every ``*Limits`` type is in :mod:`toollatch`). One run's
event log and resume is a :class:`RelayRun`; :func:`default_previews`,
:func:`shown_arguments`, :func:`redact_secrets` and :func:`preview_json` are the redaction of
what reaches the browser. ``toollatch proxy`` is :class:`ProxyServer`: an OpenAI-compatible
endpoint in front of a model server, through the gate.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import Relay
    from ._config import default_previews, redact_secrets, shown_arguments
    from ._proxy import ProxyServer
    from ._runs import RelayRun, preview_json
    from ._server import RelayServer

_WHERE = {
    "ProxyServer": "._proxy",
    "Relay": "._app",
    "default_previews": "._config",
    "redact_secrets": "._config",
    "shown_arguments": "._config",
    "RelayRun": "._runs",
    "preview_json": "._runs",
    "RelayServer": "._server",
}

__all__ = [
    "ProxyServer",
    "Relay",
    "RelayRun",
    "RelayServer",
    "default_previews",
    "preview_json",
    "redact_secrets",
    "shown_arguments",
]


def __getattr__(name: str) -> Any:
    """Import lazily: ``toollatch serve``'s parser loads :mod:`._command` on every CLI call."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
