"""The relay: agent runs streamed to a browser as SSE, with a live page (needs ``[run]``).

``toollatch serve`` (:func:`serve_command`) or ``async with RelayServer() as relay`` serves
the page and the API (:class:`Relay`) on the scripted model by default; ``toollatch proxy``
(:class:`ProxyServer`) serves an OpenAI-compatible endpoint through the gate. See :mod:`._app` for
the endpoints, :mod:`._runs` for the event log and resume, :mod:`._config` for the limits
and the redaction of what reaches the browser.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import Relay
    from ._config import RelayLimits, default_previews, redact_secrets, shown_arguments
    from ._proxy import ProxyServer
    from ._runs import RelayRun, preview_json
    from ._server import RelayServer

_WHERE = {
    "Relay": "._app",
    "RelayLimits": "._config",
    "default_previews": "._config",
    "redact_secrets": "._config",
    "shown_arguments": "._config",
    "RelayRun": "._runs",
    "preview_json": "._runs",
    "RelayServer": "._server",
    "ProxyServer": "._proxy",
}

__all__ = [
    "ProxyServer",
    "Relay",
    "RelayLimits",
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
