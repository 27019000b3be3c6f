"""Project contract: README commands and code blocks, CI script, public API, pure core, linters."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import toollatch
import toollatch.errors
import toollatch.events

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def shell_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def test_readme_starts_with_the_two_quick_start_commands():
    first, second = (b.strip() for b in shell_blocks()[:2])
    assert first.startswith("pip install . && toollatch replay")
    assert "pytest" in second and "install" in second


def test_ci_runs_exactly_the_readme_test_command():
    command = shell_blocks()[1].strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines  # verbatim, as a line of its own


def test_readme_python_blocks_run():
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        exec(compile(block, "README.md", "exec"), {})  # noqa: S102


def test_readme_first_command_output_matches(tmp_path):
    from toollatch.cli import main

    examples = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "examples").iterdir() if p.suffix in {".sse", ".jsonl"}
    )
    out = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--tools", "examples/tools.json", *examples],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    shown = re.search(r"```\n(examples/.*?)```", README, re.S).group(1)
    for line in shown.splitlines():
        assert line in out.splitlines(), line
    assert main is not None


PUBLIC = sorted(toollatch.__all__)


def test_public_surface_is_pinned():
    assert PUBLIC == [
        "Allow", "AnomalyKind", "Assembler", "CallFailed", "CallKey", "CallRecord", "CallState",
        "Choice", "CommittedCall", "ConfigError", "Deny", "ErrorCode",
        "EventStreamDecoder", "Frame", "Gate", "InvariantBroken", "JSONLinesDecoder", "Limits",
        "Notice", "PartialJSON", "PathDelta", "Policy", "PolicyDecision", "PreviewPolicy",
        "PreviewUpdated", "Rejection", "Round", "RoundEnd", "RunBudget", "SSEDecoder",
        "Segment", "StreamDecodeError", "StreamParser", "TextSegment", "ToolLatchError",
        "ToolPreview", "ToolResult", "ToolSpec", "UsageError", "adapter_class", "detect", "load_tools",
        "providers",
    ]
    assert toollatch.__all__ == sorted(toollatch.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_documented(name):
    obj = getattr(toollatch, name)
    if name in {"Policy", "PolicyDecision", "Segment", "Notice"}:
        return  # type aliases: documented where defined
    assert (obj.__doc__ or "").strip(), name


PURE = [
    "_events.py", "_errors.py", "_limits.py", "_specs.py", "_sse.py", "_eventstream.py",
    "_lines.py", "_state.py", "_buffer.py", "_assembler.py", "_gate.py", "_round.py",
    "_pipeline.py", "_registry.py", "_adapters", "_messages",
]
FORBIDDEN = {"asyncio", "time", "random", "logging", "httpx", "socket", "threading", "datetime"}


def test_the_core_is_pure():
    src = ROOT / "src" / "toollatch"
    bad = []
    for entry in PURE:
        for path in [src / entry] if entry.endswith(".py") else sorted((src / entry).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert bad == []


def test_core_imports_with_only_required_dependencies():
    code = (
        "import sys; import toollatch, toollatch.cli, toollatch.testing;"
        "bad = [m for m in ('openai', 'anthropic', 'httpx', 'asyncio') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "src"], ["ruff", "format", "--check", "src"], ["mypy"]],
    ids=["ruff", "ruff-format", "mypy"],
)
def test_static_checks(command):
    exe = shutil.which(command[0])
    if exe is None:
        pytest.fail(f"{command[0]} is not installed; install the [test] extra")
    result = subprocess.run([exe, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
