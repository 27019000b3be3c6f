"""The built-in example tools (internal; public names in :mod:`toollatch.runtime`).

What ``toollatch run`` offers the scripted model, and what the demo conversation calls:
``get_weather(city, unit)``, ``write_file(path, content)`` and ``add(a, b)``. They need no
network and give the same answer every time, so transcripts of a demo run are reproducible.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from .._errors import ConfigError
from ._tools import Tool, ToolOutcome, tool

_CONDITIONS = ("sunny", "cloudy", "rain", "snow", "fog", "wind")

MAX_WRITE_BYTES = 1 << 20
"""Default limit of one ``write_file`` (1 MiB): a demo writes notes, not disk images."""


def example_tools(
    workspace: Path, *, max_write_bytes: int = MAX_WRITE_BYTES
) -> list[Tool[..., Any]]:
    """``[get_weather, write_file, add]``; ``write_file`` writes only inside ``workspace``
    (created if missing). Raises ``ConfigError`` when ``workspace`` is not a directory."""
    root = Path(workspace)
    try:
        root.mkdir(parents=True, exist_ok=True)
        root = root.resolve(strict=True)
    except OSError as exc:
        raise ConfigError(f"workspace {workspace}: {exc}") from None
    if not root.is_dir():
        raise ConfigError(f"workspace {workspace} is not a directory")
    if not isinstance(max_write_bytes, int) or max_write_bytes < 1:
        raise ConfigError("max_write_bytes must be a positive integer")

    @tool(group="fs", name="write_file")
    def write_file(path: str, content: str) -> ToolOutcome:
        """Write a UTF-8 text file in the workspace, replacing it if it exists.

        Args:
            path: Relative path inside the workspace, e.g. ``notes/today.md``.
            content: The whole text of the file.
        """
        target = _inside(root, path)
        data = content.encode()
        if len(data) > max_write_bytes:
            raise ValueError(f"content is {len(data)} bytes, over the {max_write_bytes} limit")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written = target.relative_to(root).as_posix()
        return ToolOutcome(
            content={"path": written, "bytes": len(data)},
            ui={"kind": "file_written", "path": str(target), "bytes": len(data)},
        )

    return [get_weather, write_file, add]


def _inside(root: Path, path: str) -> Path:
    """``root / path``, refusing what could leave ``root``: absolute paths, ``..``, and
    symlinks that resolve outside (checked after resolving)."""
    if not path or "\x00" in path:
        raise ValueError("path must be a non-empty relative path")
    relative = Path(path)
    if relative.is_absolute() or relative.drive or path.startswith(("/", "\\")):
        raise ValueError(f"path {path!r} must be relative to the workspace")
    if ".." in relative.parts or ".." in path.replace("\\", "/").split("/"):
        raise ValueError(f"path {path!r} must not contain '..'")
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or target == root:
        raise ValueError(f"path {path!r} leaves the workspace")
    return target


@tool(eager=True, side_effects="read", idempotent=True)
async def get_weather(city: str, unit: Literal["c", "f"] = "c") -> dict[str, object]:
    """Current weather for a city (demo data: made up from the city's name, no network).

    Args:
        city: City name, e.g. ``Oslo``.
        unit: ``c`` for Celsius, ``f`` for Fahrenheit.
    """
    digest = hashlib.sha256(city.strip().casefold().encode()).digest()
    celsius = digest[0] % 40 - 5
    temperature = celsius if unit == "c" else round(celsius * 9 / 5 + 32)
    return {
        "city": city,
        "unit": unit,
        "temperature": temperature,
        "conditions": _CONDITIONS[digest[1] % len(_CONDITIONS)],
    }


@tool(eager=True, side_effects="read", idempotent=True)
async def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b
