"""The built-in example tools (internal; public names in :mod:`toollatch.runtime`).

What ``toollatch run`` offers the scripted model, and what the demo conversation calls:
``get_weather(city, unit)``, ``write_file(path, content)`` and ``add(a, b)``. They need no
network and give the same answer every time, so transcripts of a demo run are reproducible.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Literal

from ..core._errors import ConfigError
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
        parts = _parts(path)
        data = content.encode()
        if len(data) > max_write_bytes:
            raise ValueError(f"content is {len(data)} bytes, over the {max_write_bytes} limit")
        _write_inside(root, parts, path, data)
        written = "/".join(parts)
        return ToolOutcome(
            content={"path": written, "bytes": len(data)},
            ui={"kind": "file_written", "path": str(root.joinpath(*parts)), "bytes": len(data)},
        )

    return [get_weather, write_file, add]


def _parts(path: str) -> tuple[str, ...]:
    """The steps of a relative ``path``, refusing what could leave the workspace by its
    spelling: absolute paths, drives, ``..``, NUL, nothing at all."""
    if not path or "\x00" in path:
        raise ValueError("path must be a non-empty relative path")
    relative = Path(path)
    if relative.is_absolute() or relative.drive or path.startswith(("/", "\\")):
        raise ValueError(f"path {path!r} must be relative to the workspace")
    if ".." in relative.parts or ".." in path.replace("\\", "/").split("/"):
        raise ValueError(f"path {path!r} must not contain '..'")
    parts = tuple(p for p in relative.parts if p != ".")
    if not parts:
        raise ValueError(f"path {path!r} names the workspace itself, not a file in it")
    return parts


def inside(root: Path, path: str) -> Path:
    """``root / path`` after the spelling checks of :func:`_parts` (the relay's per-session
    tools check a path against their own directory with it); the write itself follows no
    link (:func:`_write_inside`)."""
    return root.joinpath(*_parts(path))


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
"""No ``O_TRUNC``: the file is cut only after it is known to be a plain file of one link;
``O_NONBLOCK``: a FIFO planted in the workspace fails at once instead of blocking."""
_LINK_ERRORS = (errno.ELOOP, errno.EMLINK)
"""What ``open`` with ``O_NOFOLLOW`` says of a symbolic link (Linux and macOS: ELOOP;
FreeBSD: EMLINK; with ``O_DIRECTORY``, Linux: ENOTDIR, hence :func:`_is_link`)."""


def _write_inside(root: Path, parts: tuple[str, ...], path: str, data: bytes) -> None:
    """Write ``data`` to ``root/parts...`` without following any symbolic link and never
    through a hard link (the file must have one link).

    Why not resolve-then-write: between a check of the resolved path and the write, a
    directory on the path can be swapped for a symbolic link (the window is the whole
    ``mkdir`` and ``open``). Here every step is opened relative to the directory descriptor
    of the step before, with ``O_NOFOLLOW``, so what is checked is what is written: a link
    anywhere on the path, even one pointing inside the workspace, refuses the write. A file
    with more than one hard link is refused before it is cut (writing it would change the
    other name's file, which may be outside). Where descriptors relative to a directory do
    not exist (Windows), the path is resolved and checked instead."""
    if not _NOFOLLOW or os.open not in os.supports_dir_fd:  # pragma: no cover - not POSIX
        _write_resolved(root, parts, path, data)
        return
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            step = _open_step(part, _DIR_FLAGS, fd, path)
            os.close(fd)
            fd = step
        out = _open_step(parts[-1], _FILE_FLAGS, fd, path)
        try:
            _check_plain(os.fstat(out), path)
            os.ftruncate(out, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _open_step(part: str, flags: int, dir_fd: int, path: str) -> int:
    try:
        return os.open(part, flags, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRORS or _is_link(part, dir_fd):
            raise ValueError(
                f"path {path!r} leaves the workspace through a symbolic link ({part!r}); "
                "write_file follows none"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise ValueError(f"path {path!r}: {part!r} is not a directory") from None
        raise


def _is_link(part: str, dir_fd: int) -> bool:
    """Whether ``part`` is a symbolic link (with ``O_DIRECTORY`` too, Linux says ENOTDIR)."""
    try:
        return stat.S_ISLNK(os.stat(part, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check_plain(st: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"path {path!r} is not a regular file")
    if st.st_nlink > 1:
        raise ValueError(
            f"path {path!r} has {st.st_nlink} hard links; write_file writes only a file "
            "of one name (another name may be outside the workspace)"
        )


def _write_resolved(
    root: Path, parts: tuple[str, ...], path: str, data: bytes
) -> None:  # pragma: no cover - the fallback without O_NOFOLLOW and dir_fd
    target = root.joinpath(*parts).resolve()
    if not target.is_relative_to(root) or target == root:
        raise ValueError(f"path {path!r} leaves the workspace")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        _check_plain(target.stat(), path)
    target.write_bytes(data)


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
