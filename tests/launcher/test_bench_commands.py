"""bench/bench_commands.py end to end on its two quickest commands: it builds its tiny data-preparation config
with main.py, runs each command in a fresh process and prints one row per command."""

from __future__ import annotations

import subprocess
import sys

from launcher_helpers import REPO


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_commands.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_one_row_per_command_with_runs_median_and_min():
    out = bench("--runs", "2", "--warmup", "0", "--only", "stack,dataprep-checks")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("command"))
    assert lines[header].split() == ["command", "runs", "median", "s", "min", "s"]
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [r[:2] for r in rows] == [["stack", "2"], ["dataprep-checks", "2"]]
    for row in rows:
        median, least = float(row[2]), float(row[3])
        assert 0 < least <= median


def test_an_unknown_command_is_one_line():
    out = bench("--runs", "1", "--warmup", "0", "--only", "stack,nonesuch")
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--only: unknown command nonesuch; choose from stack, dataprep-checks, dataprep-run, dry-run, sweep, "
            "help-main, help-report, help-data-prep, help-stack, help-export, help-import-fetch, help-hub-fetch"
        )
    )
