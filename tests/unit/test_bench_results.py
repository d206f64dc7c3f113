"""bench/results/latest.json keeps the figures of the sections a run did not run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import merge_latest


def test_a_partial_run_keeps_the_other_sections_with_their_origin(tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    first = {
        "run": {"started_utc": "2026-12-01T00:00:00Z"},
        "machine": {"git_commit": "aaa"},
        "forecast": {"x": 1},
        "ui": {"old": True},
    }
    latest.write_text(json.dumps(first))
    second = {"run": {"started_utc": "2026-12-04T00:00:00Z"}, "machine": {}, "ui": {"new": 1}}
    merged = merge_latest(latest, second)
    assert merged["ui"] == {"new": 1} and merged["run"] == second["run"]
    assert merged["forecast"] == {"x": 1}
    origin = {"started_utc": "2026-12-01T00:00:00Z", "git_commit": "aaa"}
    assert merged["merged_from"] == {"forecast": origin}
    latest.write_text(json.dumps(merged))  # a third run keeps the first origin
    third = {"run": {"started_utc": "2026-12-05T00:00:00Z"}, "machine": {}, "ui": {}}
    assert merge_latest(latest, third)["merged_from"] == {"forecast": origin}


def test_no_previous_results_is_this_run(tmp_path: Path) -> None:
    run = {"run": {}, "machine": {}, "ui": {}}
    assert merge_latest(tmp_path / "latest.json", run) == run
