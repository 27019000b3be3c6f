"""Project contract: README commands and code blocks, CI script, public API, pure core, linters."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import itertools
import json as json_module
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import toollatch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def shell_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def test_readme_starts_with_the_two_quick_start_commands():
    first, second = (b.strip() for b in shell_blocks()[:2])
    assert first == 'pip install ".[run]" && toollatch run'
    assert "pytest" in second and "install" in second


def test_ci_runs_exactly_the_readme_test_command():
    command = shell_blocks()[1].strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines  # verbatim, as a line of its own


def readme_namespaces() -> list[dict]:
    spaces = []
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        spaces.append(namespace)
    return spaces


def test_readme_python_blocks_run():
    assert len(readme_namespaces()) >= 3


RECORDED = ROOT / "examples" / "openai_parallel_calls.sse"


class _Response:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def iter_bytes(self):
        data = RECORDED.read_bytes()
        return (data[i : i + 7] for i in range(0, len(data), 7))  # reads cut anywhere


class _HttpxClient:
    def stream(self, method, url, *, json, headers):
        assert method == "POST" and json["stream"] is True
        return _Response()


class _SDKClient:
    """Stands in for ``openai.OpenAI()``: ``create(stream=True)`` yields the recorded chunks."""

    def __init__(self):
        self.chat = self.completions = self

    def create(self, *, stream, **request):
        assert stream is True
        return (
            json_module.loads(line[6:])
            for line in RECORDED.read_text().splitlines()
            if line.startswith("data: {")
        )


def test_readme_three_ways_in_run_against_a_recorded_stream():
    (ways,) = [n for n in readme_namespaces() if "from_httpx" in n]
    by_bytes = ways["from_httpx"](_HttpxClient(), "http://model", {"model": "m"}, {})
    by_events = ways["from_sdk_iterator"](_SDKClient(), model="m")
    for round_ in (by_bytes, by_events):
        assert [c.name for c in round_.committed()] == ["get_weather", "write_file"]
    assert by_bytes == by_events
    assert callable(ways["from_sdk_stream_helper"])  # needs the SDK's helper: see test_sdk_*


def test_readme_run_output_matches():
    """The call lines the README shows for ``toollatch run`` (the timings left out)."""
    out = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    shown = re.search(r"```\n(Let me check.*?)```", README, re.S).group(1).splitlines()
    got = out.splitlines()
    for line in shown:
        cells = re.split(r"\s{2,}", line.strip())
        if not line.startswith("call_"):
            assert line in got, line
            continue
        found = next(re.split(r"\s{2,}", g.strip()) for g in got if g.startswith(cells[0] + " "))
        assert found[:2] == cells[:2], line
        assert found[2].startswith(cells[2].rstrip("…")), line
        assert found[3] == cells[3], line


def test_readme_first_command_output_matches(tmp_path):
    from toollatch.cli import main

    examples = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "examples").iterdir()
        if p.suffix in {".sse", ".jsonl"}
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "toollatch.cli",
            "replay",
            "--tools",
            "examples/tools.json",
            *examples,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shown = re.search(r"```\n(examples/.*?)```", README, re.S).group(1)
    for line in shown.splitlines():
        assert line in out.splitlines(), line
    assert main is not None


SURFACES = {
    "toollatch": [
        "Agent",
        "AgentEvent",
        "AgentRun",
        "Allow",
        "ApprovalPolicy",
        "CallCommittedEvent",
        "CallFailed",
        "CallFailedEvent",
        "CallOpenedEvent",
        "CallRecord",
        "CallState",
        "ClientLimits",
        "CommittedCall",
        "ConfigError",
        "Deny",
        "ErrorCode",
        "InvariantBroken",
        "Limits",
        "ModelClient",
        "ModelConnectError",
        "ModelError",
        "ModelHTTPError",
        "ModelResponseError",
        "Policy",
        "PolicyDecision",
        "PreviewPolicy",
        "PreviewUpdated",
        "RelayLimits",
        "ResultLimits",
        "RetryPolicy",
        "Round",
        "RoundEnd",
        "RoundEndedEvent",
        "RunBudget",
        "RunEndedEvent",
        "RunLimits",
        "StreamDecodeError",
        "StreamInterrupted",
        "StreamParser",
        "StreamTimeout",
        "StreamTooLarge",
        "TextEvent",
        "Tool",
        "ToolFinishedEvent",
        "ToolLatchError",
        "ToolOutcome",
        "ToolPreview",
        "ToolResult",
        "ToolSource",
        "ToolSpec",
        "ToolStartedEvent",
        "UsageError",
        "load_tools",
        "model_client",
        "open_audit",
        "open_history",
        "open_ledger",
        "schema_tool",
        "tool",
        "user_message",
    ],
    "toollatch.stages": [
        "Adapter",
        "Anomaly",
        "AnomalyKind",
        "AnthropicAdapter",
        "ArgsDelta",
        "ArgsMeasured",
        "ArgsReceived",
        "Assembler",
        "BedrockAdapter",
        "CallAnnounced",
        "CallClosed",
        "CallComplete",
        "CallIdentified",
        "CallKey",
        "CallOpened",
        "CallReady",
        "CallSettled",
        "CallUpdate",
        "Choice",
        "ContentItem",
        "DecodedArguments",
        "EventStreamDecoder",
        "Frame",
        "Gate",
        "GeminiAdapter",
        "JSONLinesDecoder",
        "OpenAIChatAdapter",
        "OpenAIResponsesAdapter",
        "PartialJSON",
        "PathDelta",
        "ReasoningBlock",
        "Rejection",
        "RoundEnded",
        "RoundOver",
        "SSEDecoder",
        "ServerToolBlock",
        "StreamEvent",
        "StreamFailed",
        "TextDelta",
        "TextReceived",
        "TextRun",
        "UsageReported",
        "adapter_class",
        "assistant_messages",
        "detect",
        "drop_failed_calls",
        "error_result",
        "error_results",
        "providers",
        "repaired_history",
        "tool_results_messages",
    ],
    "toollatch.runtime": [
        "CONFIG_EXAMPLE",
        "DEFAULT_MAX_RESULT_BYTES",
        "MIN_RESULT_BYTES",
        "AgentObserver",
        "ApprovalAnsweredEvent",
        "ApprovalContext",
        "ApprovalRequestedEvent",
        "Config",
        "DispatchRound",
        "Dispatcher",
        "DurableRuns",
        "IdleDeadline",
        "JsonFormatter",
        "Metrics",
        "ModelStream",
        "Recorder",
        "RedactedLog",
        "Tracing",
        "configure_logging",
        "example_tools",
        "load_config",
        "redact_result",
        "truncate_result",
    ],
    "toollatch.ledger": [
        "AlreadyAnswered",
        "AlwaysStore",
        "ApprovalError",
        "ArgumentAudit",
        "AuditPolicy",
        "AuditRecord",
        "AuditStore",
        "CallContext",
        "Claim",
        "Decision",
        "EditRejected",
        "Found",
        "History",
        "HistoryConflict",
        "LeaseLost",
        "Ledger",
        "LedgerError",
        "LedgerKey",
        "LedgerRecord",
        "LedgerState",
        "LockBusy",
        "LockLost",
        "NotAsked",
        "OtherSession",
        "Question",
        "QuestionKind",
        "QuestionStore",
        "SessionLocks",
        "StaleArguments",
        "TooManyAlways",
        "Won",
        "WrongKind",
        "approval_token",
        "audit_record",
        "current_call",
        "default_ledger_url",
        "digest_of",
        "sqlite_file",
        "verify_approval_token",
    ],
    "toollatch.ledger.redis": ["redis_session_locks"],
    "toollatch.mcp": ["McpServer", "McpToolSource", "parse_server_spec", "source_from_config"],
    "toollatch.relay.protocols": [],
    "toollatch.relay.store": [],
    "toollatch.relay": [
        "ProxyServer",
        "Relay",
        "RelayRun",
        "RelayServer",
        "default_previews",
        "preview_json",
        "redact_secrets",
        "shown_arguments",
    ],
    "toollatch.scripted": [
        "DONE_TURN",
        "PROVIDERS",
        "Call",
        "Faults",
        "Reasoning",
        "RecordedRequest",
        "Script",
        "ScriptedServer",
        "Text",
        "Turn",
        "demo_script",
    ],
    "toollatch.testing": [
        "ConformanceError",
        "byte_chunks",
        "check_adapter",
        "chunkings",
        "jsonl",
        "replay",
        "split_at",
        "sse",
        "summary",
    ],
}
"""Every public namespace and its names, exactly (sorted: ruff's RUF022, constants first).
Each name has one home: ``toollatch`` for what a user needs (the parser and its result types,
the agent loop, its events, errors, every ``*Limits``, the ledger openers), ``toollatch.stages``
for callers who own the loop, and the feature packages (docs/ARCHITECTURE.md, "The public
surface")."""
ALIASES = {
    "AgentEvent": "AgentEvent",
    "CallUpdate": "CallUpdate",
    "Claim": "Claim",
    "Decision": "Decision",
    "ContentItem": "ContentItem",
    "LedgerState": "LedgerState",
    "Policy": "Policy",
    "PolicyDecision": "PolicyDecision",
    "QuestionKind": "QuestionKind",
    "SessionLocks": "SessionLocks",
    "StreamEvent": "StreamEvent",
    "CONFIG_EXAMPLE": "EXAMPLE",
    "DEFAULT_MAX_RESULT_BYTES": "DEFAULT_MAX_RESULT_BYTES",
    "DONE_TURN": "DONE_TURN",
    "MIN_RESULT_BYTES": "MIN_RESULT_BYTES",
    "PROVIDERS": "PROVIDERS",
}
"""Type aliases and constants (public name: name in its module): an alias or a constant has no
``__doc__`` of its own, so its docstring is the string literal right after its assignment in
its module (checked below)."""

NO_SURFACE = {"toollatch.cli", "toollatch.core", "toollatch.tools", "toollatch.mcp.example_server"}
"""Modules and packages without a Python surface of their own: the command line (its surface
is the command), the rooms whose names other namespaces export (docs/ARCHITECTURE.md), and
the example MCP server (a script: ``python -m toollatch.mcp.example_server``)."""


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_public_surface_is_pinned(module):
    assert importlib.import_module(module).__all__ == SURFACES[module]  # exactly these


def test_every_public_module_is_pinned():
    package = ROOT / "src" / "toollatch"
    found = set()
    for path in package.rglob("*.py"):
        parts = ["toollatch", *path.relative_to(package).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if any(p.startswith("_") for p in parts):
            continue  # a private module, or inside a private package
        name = ".".join(parts)
        if not any(name == n or name.startswith(n + ".") for n in NO_SURFACE):
            found.add(name)
    assert found == set(SURFACES)


def test_every_public_name_has_one_home():
    homes: dict[str, list[str]] = {}
    for module in SURFACES:  # the modules' own lists, not the expected ones above
        for name in importlib.import_module(module).__all__:
            homes.setdefault(name, []).append(module)
    assert {n: ms for n, ms in homes.items() if len(ms) > 1} == {}
    limits = {n: ms for n, ms in homes.items() if n.endswith("Limits")}
    assert set(limits) == {"ClientLimits", "Limits", "RelayLimits", "ResultLimits", "RunLimits"}
    assert {m for ms in limits.values() for m in ms} == {"toollatch"}  # one home for budgets


def test_the_top_level_is_what_a_user_needs():
    assert len(toollatch.__all__) <= 60  # (the runtime's names are imported lazily: see below)
    for name in ("SSEDecoder", "Frame", "PartialJSON", "Assembler", "Gate", "detect", "Choice"):
        assert not hasattr(toollatch, name), name  # the stages' names are in toollatch.stages


def test_the_ledger_stores_are_built_by_url_only():
    import toollatch.ledger
    import toollatch.ledger.redis

    for module in (toollatch.ledger, toollatch.ledger.redis):
        stores = [n for n in module.__all__ if n.startswith(("Memory", "SQLite", "Redis"))]
        assert stores == [], module.__name__
    assert {"open_ledger", "open_history", "open_audit"} <= set(toollatch.__all__)


@functools.cache
def _alias_docstrings() -> set[str]:
    """Names assigned at the top of a src module with a string literal right after them."""
    found = set()
    for path in (ROOT / "src" / "toollatch").rglob("*.py"):
        body = ast.parse(path.read_text()).body
        for node, after in itertools.pairwise(body):
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if isinstance(target, ast.Name) and documented and isinstance(after.value.value, str):
                found.add(target.id)
    return found


@pytest.mark.parametrize(
    ("module", "name"), [(m, n) for m, names in sorted(SURFACES.items()) for n in names]
)
def test_every_public_name_is_documented(module, name):
    obj = getattr(importlib.import_module(module), name)
    if name in ALIASES:
        assert ALIASES[name] in _alias_docstrings(), f"{module}.{name}: no docstring"
    else:
        doc = (obj.__doc__ or "").strip()
        assert doc, f"{module}.{name}"
        if not callable(obj):  # a constant's __doc__ is its type's: it needs an ALIASES entry
            assert doc != (type(obj).__doc__ or "").strip(), f"{module}.{name}"


def test_the_history_builders_do_not_import_the_adapters():
    for path in sorted((ROOT / "src" / "toollatch" / "core/_messages").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in modules if "_adapters" in m], path.name
    round_source = (ROOT / "src" / "toollatch" / "core/_round.py").read_text()
    assert "_messages" not in round_source  # the Round is data: no cycle with its builders


PURE = [
    "core/_events.py",
    "core/_errors.py",
    "core/_limits.py",
    "core/_specs.py",
    "core/_sse.py",
    "core/_eventstream.py",
    "core/_lines.py",
    "core/_state.py",
    "core/_buffer.py",
    "core/_assembler.py",
    "core/_gate.py",
    "core/_round.py",
    "core/_pipeline.py",
    "core/_registry.py",
    "core/_adapters/",
    "core/_messages/",
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


def test_the_runtime_names_are_at_the_top_level_without_importing_the_runtime():
    code = (
        "import sys, toollatch;"
        "assert 'pydantic' not in sys.modules and 'httpx' not in sys.modules;"
        "from toollatch import Agent, tool; from toollatch.tools._tools import tool as defined;"
        "assert tool is defined and 'httpx' in sys.modules and 'Agent' in dir(toollatch)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_imports_with_only_required_dependencies():
    code = (
        "import sys; import toollatch, toollatch.cli, toollatch.testing;"
        "bad = [m for m in ('openai', 'anthropic', 'httpx', 'asyncio') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "src", "tests", "benchmarks"],
        ["ruff", "format", "--check", "src", "tests", "benchmarks"],
        ["mypy"],
    ],
    ids=["ruff", "ruff-format", "mypy"],
)
def test_static_checks(command, mypy_lock):
    exe = shutil.which(command[0])
    if exe is None:
        pytest.fail(f"{command[0]} is not installed; install the [test] extra")
    with mypy_lock() if command[0] == "mypy" else contextlib.nullcontext():
        result = subprocess.run([exe, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
