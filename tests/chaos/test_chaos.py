"""The short chaos run: one of each fault type, deterministically spaced, against real
scheduler and worker processes, a real PostgreSQL (crashed and restarted), a TCP proxy and
an HTTP ledger. Asserts the runner found no violation (see runner.py for the checks)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_short_chaos_run_has_exactly_once_effect(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos.runner",
            "--seed",
            "7",
            "--jobs",
            "200",
            "--duration",
            "65",
            "--faults",
            "each",
            "--drain",
            "30",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
        cwd=ROOT,
    )
    assert out.exists(), res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["violations"] == [], res.stdout[-6000:]
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    occ = report["occurrences"]
    assert occ["expected"] > 0
    assert occ["lost"] == 0
    assert occ["succeeded"] + occ["skipped"] + occ["missed"] + occ["dead"] == occ["expected"]
    assert report["all_keys"]["keys_with_multiple_successes"] == 0
    # Every fault type fired; clock skew needs `faketime` (apt-get install faketime), and
    # without it the runner says so instead of pretending.
    cov = report["fault_coverage"]
    for kind, status in cov.items():
        if kind == "operator":
            continue
        if kind == "clock_skew" and shutil.which("faketime") is None:
            assert status == "inconclusive: faketime unavailable", status
            continue
        assert status == "fired", (kind, status)
    assert all(f["recovery_s"] is not None for f in report["faults"])
