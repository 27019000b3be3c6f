"""Running the committed JavaScript clients (tests/js/) with node: the pinned packages come from
``npm ci`` (package-lock.json). Without node, or without node_modules and npm, a test skips with
the reason, except under CI=true, where it fails (as the fixture corpus does)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js"


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def node_command(script: str, package: str) -> list[str]:
    """``[node, tests/js/<script>]`` once ``node_modules/<package>`` is there (``npm ci`` is
    run, under a lock shared by parallel test workers, when it is not)."""
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed")
    if not (ROOT / "node_modules" / package).is_dir():
        npm = shutil.which("npm")
        if npm is None:
            _missing("node_modules is missing and npm is not installed (npm ci)")
        with (ROOT / ".npm-ci.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (ROOT / "node_modules" / package).is_dir():
                done = subprocess.run(
                    [str(npm), "ci", "--no-audit", "--no-fund"],
                    cwd=ROOT,
                    capture_output=True,
                    timeout=600,
                    check=False,
                )
                if done.returncode != 0:
                    _missing(f"npm ci failed: {done.stderr.decode()[-300:]}")
    return [str(node), str(JS / script)]


async def run_node(command: list[str], config: dict[str, Any], timeout: float = 120) -> Any:
    """Run ``command`` with ``config`` as its JSON argument; its stdout as JSON."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        json.dumps(config),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)
