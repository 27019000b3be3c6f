"""The example tools per session, without rebuilding them (internal).

Building :func:`~toollatch.runtime.example_tools` costs about 7 ms (pydantic models and JSON
schemas for three tools), on the event loop, for every new session: 200 sessions starting
at once blocked the loop for 1.4 s (measured with ``benchmarks/bench_relay.py --profile``).
:class:`SessionTools` builds them once over the relay's workspace and gives each session a
copy whose ``write_file`` writes in the session's own directory: the same checks
(``inside`` against the session's directory, so an absolute or ``..`` path is refused with
the same message), then the shared tool with the path under the session's directory, and
the answer's ``path`` relative to the session's directory again, as the model wrote it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core._errors import ConfigError
from ..tools._examples import example_tools, inside
from ..tools._tools import Tool, ToolOutcome


class SessionTools:
    """The example tools of each session (``workspace/<name>``), the last ``keep`` kept."""

    def __init__(self, workspace: Path, keep: int) -> None:
        self._root = Path(workspace)
        self._template = tuple(example_tools(self._root))
        self._root = self._root.resolve(strict=True)
        self._keep = keep
        self._cache: OrderedDict[str, tuple[Tool[..., Any], ...]] = OrderedDict()

    @property
    def names(self) -> list[str]:
        """The example tools' names."""
        return [t.name for t in self._template]

    def get(self, name: str) -> tuple[Tool[..., Any], ...]:
        """The tools of the session directory ``name`` (a plain file name, created if
        missing). Raises ``ConfigError`` when the directory cannot be made."""
        tools = self._cache.pop(name, None)
        if tools is None:
            tools = tuple(self._bound(t, name) for t in self._template)
        self._cache[name] = tools
        while len(self._cache) > self._keep:
            self._cache.popitem(last=False)
        return tools

    def _bound(self, template: Tool[..., Any], name: str) -> Tool[..., Any]:
        if template.name != "write_file":
            return template  # the others touch no file: shared as they are
        directory = self._root / name
        try:
            directory.mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"workspace {directory}: {exc}") from None
        bound = copy.copy(template)  # spec, pydantic model, options: shared, not rebuilt
        bound.__wrapped__ = _write_in(template.__wrapped__, directory, name)
        return bound


def _write_in(write: Callable[..., Any], directory: Path, name: str) -> Callable[..., Any]:
    """``write_file(path, content)`` confined to ``directory`` (``root/name``)."""

    def write_file(path: str, content: str) -> ToolOutcome:
        inside(directory, path)  # the example's checks, against the session's directory
        outcome = write(f"{name}/{path}", content)
        assert isinstance(outcome, ToolOutcome)
        shown = dict(outcome.content)
        shown["path"] = str(shown["path"]).removeprefix(f"{name}/")
        # the UI payload too: the browser sees the path as the model wrote it, never the
        # server's directories
        ui = dict(outcome.ui) if isinstance(outcome.ui, dict) else outcome.ui
        if isinstance(ui, dict) and "path" in ui:
            ui["path"] = shown["path"]
        return dataclasses.replace(outcome, content=shown, ui=ui)

    return write_file
