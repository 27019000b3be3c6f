"""The README's Python examples run as they are shown, and each one asserts what it shows
(issue 35 item 6): every ```python block of README.md is run on its own, as a script, in a
fresh interpreter (working folder: the repository, for ``examples/``), and must contain an
``assert`` (a block that only defines functions shows nothing a reader can trust)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_each_readme_python_block_runs_and_asserts(number, tmp_path):
    block = BLOCKS[number]
    first = block.strip().splitlines()[0]
    assert re.search(r"^\s*assert\b", block, re.M), f"block {number} ({first}) asserts nothing"
    script = tmp_path / f"readme_block_{number}.py"
    script.write_text(block)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"block {number} ({first}):\n{done.stderr[-3000:]}"
