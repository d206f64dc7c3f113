"""bench/results/latest.json keeps the figures of the sections a run did not run."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.common import merge_latest
from bench.profile import name_of, shape
from cronwell.store._queries import queries


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


def test_the_statements_section_knows_every_named_query_as_the_server_shows_it() -> None:
    """pg_stat_statements shows each parameter as $n: a named query's shape must not keep
    its placeholders, text (`%(x)s`) or binary (`%(x)b`); when `%(x)b` was new, the shapes
    kept it and the section counted almost no named statement (0.02 rows an occurrence
    for 3.03)."""
    named = {shape(sql): name for name, sql in queries().items()}
    n = iter(range(1, 1000))
    for name, sql in queries().items():
        shown = re.sub(r"%\(\w+\)[sb]", lambda _: f"${next(n)}", sql.split("\n", 1)[-1])
        assert name_of(shown, named) is not None, name
