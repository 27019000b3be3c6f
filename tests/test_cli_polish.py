"""Issue 35 item 6: the small things a newcomer meets first. Piped output is not cut at 80
columns; ``run --help`` lists the key variables; a YAML error names the file; ``run
--config`` lists config problems one per line (as ``config check`` does); ``serve``'s start
line names the ledger file it resolved. Run as a user runs them: subprocesses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "toollatch.cli"]


def toollatch(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        env={**environ, **env},
    )  # fmt: skip


def test_piped_output_is_not_cut_at_80_columns(tmp_path):
    done = toollatch("run", "--workspace", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("call_demo_weather")]
    assert [row.split()[0] for row in rows] == [
        "call_demo_weather_oslo", "call_demo_weather_zurich"]  # fmt: skip
    assert all(len(row.rstrip()) > 80 for row in rows)
    assert all(re.search(r"waited \d+ ms, ran \d+ ms$", row.rstrip()) for row in rows)
    assert "the example tools write in" in done.stdout.splitlines()[0]  # one line, not wrapped
    narrow = toollatch("run", "--workspace", str(tmp_path), COLUMNS="80")  # (COLUMNS: kept)
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_run_help_lists_the_key_variables():
    text = toollatch("run", "--help").stdout
    for name in ("TOOLLATCH_MODEL__BASE_URL", "TOOLLATCH_MODEL__MODEL", "TOOLLATCH_MODEL__PROVIDER",
                 "TOOLLATCH_MODEL__API_KEY_ENV", "TOOLLATCH_LEDGER__URL", "OPENAI_API_KEY",
                 "TOOLLATCH_<SECTION>__<KEY>"):  # fmt: skip
        assert name in text


@pytest.mark.parametrize("command", [["run", "--config"], ["config", "check"]])
def test_a_yaml_error_names_the_file(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  provider: [unclosed\n")
    done = toollatch(*command, str(bad))
    assert done.returncode == 2
    assert "<unicode string>" not in done.stderr
    assert f"in {bad}, line 2, column 13" in done.stderr


def test_run_config_lists_its_problems_one_per_line_like_config_check(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  provider: nope\n  connect_s: -1\ndispatcher:\n  bogus: 1\n")
    ran = toollatch("run", "--config", str(bad))
    checked = toollatch("config", "check", str(bad))
    assert ran.returncode == checked.returncode == 2
    lines = ran.stderr.splitlines()
    assert lines[0] == f"toollatch: error: --config {bad}: invalid configuration:"
    assert lines[1:] == checked.stderr.splitlines()[1:]
    assert len(lines) == 4
    assert all(line.startswith("  ") and line.endswith(f"({bad})") for line in lines[1:])


def test_serve_names_the_ledger_file_it_resolved(tmp_path):
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--ledger", "sqlite:///runs/ledger.db"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
        if proc.stderr is not None:
            proc.stderr.close()
    assert f"(ledger {tmp_path / 'runs' / 'ledger.db'}; Ctrl-C to stop)" in line
