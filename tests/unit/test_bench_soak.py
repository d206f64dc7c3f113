"""The soak's criteria (bench/soak.py: evaluate) from made-up sample series: a flat run
holds, each kind of drift fails its own criterion and `holds`."""

from __future__ import annotations

from typing import Any

import pytest

from bench import soak
from bench.common import BenchError

MB = 2**20
EXPECTED = {"cronwell_occurrences": 1000.0}


def run(
    minutes: int = 60,
    rss: float = 0.0,
    table: float = 0.0,
    p99: float = 0.0,
    pruned: float = 1.0,
) -> dict[str, Any]:
    """A soak of `minutes` sampled every 10 s (warm-up 5 min) whose worker memory grows
    `rss` and whose table grows `table` (fractions over the whole run), whose burst p99
    grows `p99`, and that prunes `pruned` of the rows written."""
    n = minutes * 6 + 1
    samples = []
    for i in range(n):
        f = i / (n - 1)
        written = 100_000 * f
        samples.append(
            {
                "t": i * 10.0,
                "processes": {
                    "worker-1": {"memory": int(100 * MB * (1 + rss * f)), "connections": 4},
                    "scheduler": {"memory": 90 * MB, "connections": 3},
                    "postgres backends of worker-1": {
                        "memory": (2 + (f > 0.75)) * 6 * MB,
                        "connections": 2 + (f > 0.75),
                    },
                    # autovacuum workers come and go: sampled, never judged
                    "postgres autovacuum and parallel workers": {"memory": (i % 2) * 10 * MB},
                },
                "tables": {
                    "cronwell_occurrences": {
                        "bytes": int(50 * MB * (1 + table * f)),
                        "ins": int(written),
                        "del": int(written * pruned),
                    }
                },
            }
        )
    bursts = [
        {"at_s": at, "p99_s": 0.5 * (1 + p99 * at / (60 * minutes))}
        for at in range(150, 60 * minutes, 150)
    ]
    return soak.evaluate(samples, bursts, warmup_s=300, expected_rows=EXPECTED)


def test_a_flat_run_holds() -> None:
    figs = run()
    assert figs["holds"] is True
    assert figs["rss_growth_last_30min_pct"] == 0.0
    assert figs["rss_growth_window_s"] == [1800.0, 3600.0]
    judged = {"worker-1", "scheduler", "postgres backends of worker-1"}
    assert set(figs["criteria"]["rss"]["growth_pct"]) == judged


@pytest.mark.parametrize(
    ("drift", "criterion"),
    [
        ({"rss": 0.2}, "rss"),
        ({"table": 0.3}, "plateau"),
        ({"p99": 0.5}, "p99"),
        ({"pruned": 0.5}, "pruning"),
    ],
)
def test_each_drift_fails_its_criterion(drift: dict[str, float], criterion: str) -> None:
    figs = run(**drift)
    failed = {k for k, c in figs["criteria"].items() if not c["holds"]}
    assert failed == {criterion}
    assert figs["holds"] is False


def test_a_short_run_judges_memory_over_its_last_half_after_the_warm_up() -> None:
    assert run(minutes=20)["rss_growth_window_s"] == [600.0, 1200.0]
    # warm-up 5 min of 8: the window starts at its end, not at half the run
    figs = run(minutes=8, rss=0.2)
    assert figs["rss_growth_window_s"] == [300.0, 480.0]
    assert figs["rss_growth_last_30min_pct"] > 5
    assert figs["criteria"]["rss"]["holds"] is False


def test_backends_are_judged_per_connection() -> None:
    """The pool opened a third connection in the last half hour: its backends' memory grew
    by half, their memory per connection did not: not a leak."""
    figs = run()
    assert figs["criteria"]["rss"]["growth_pct"]["postgres backends of worker-1"] == 0.0
    assert figs["holds"] is True


def test_pruning_counts_only_what_exceeds_the_retained_window() -> None:
    figs = run(pruned=0.99)  # 1,000 rows behind: exactly the expected window
    assert figs["criteria"]["pruning"]["tables"]["cronwell_occurrences"]["holds"] is True


def test_settings_it_cannot_measure_are_one_line_errors() -> None:
    with pytest.raises(BenchError, match="must exceed --soak-warmup-minutes"):
        soak.check(5, 5, 50_000, 150, 0.5)
    with pytest.raises(BenchError, match="fewer than two bursts"):
        soak.check(6, 2, 50_000, 150, 0.5)
    with pytest.raises(BenchError, match="--soak-scale"):
        soak.check(60, 5, 50_000, 150, 0)


def test_partition_width_fits_the_soak_retention() -> None:
    assert soak.partition_seconds(60) == 300  # retention 600 s
    assert soak.partition_seconds(12) == 60  # retention 120 s
    assert soak.partition_seconds(1) == 60  # never under a minute
    assert all(86400 % soak.partition_seconds(m) == 0 for m in (7, 13, 60, 95, 1440))


def test_tables_sum_partitions_and_keep_a_dropped_ones_rows_as_pruned() -> None:
    def row(ins: int, dele: int, size: int) -> dict[str, int]:
        return {"bytes": size, "index_bytes": 0, "live": ins - dele, "dead": 0,
                "autovacuum": 1, "autoanalyze": 1, "ins": ins, "del": dele}  # fmt: skip

    t = soak.Tables()
    first = t.fold(
        {
            "cronwell_occurrences_p1": ("cronwell_occurrences", row(100, 40, 10)),
            "cronwell_occurrences_p2": ("cronwell_occurrences", row(50, 0, 5)),
            "cronwell_jobs": ("cronwell_jobs", row(3, 0, 1)),
        }
    )
    occ = first["cronwell_occurrences"]
    assert (occ["ins"], occ["del"], occ["bytes"], occ["partitions"]) == (150, 40, 15, 2)
    # p1 dropped with its 60 remaining rows; p3 created.
    second = t.fold(
        {
            "cronwell_occurrences_p2": ("cronwell_occurrences", row(80, 10, 8)),
            "cronwell_occurrences_p3": ("cronwell_occurrences", row(5, 0, 1)),
            "cronwell_jobs": ("cronwell_jobs", row(3, 0, 1)),
        }
    )
    occ = second["cronwell_occurrences"]
    assert (occ["ins"], occ["del"], occ["dropped"]) == (185, 110, 60)
    assert (occ["bytes"], occ["partitions"], occ["autovacuum"]) == (9, 2, 3)
    assert second["cronwell_jobs"]["ins"] == 3


def test_a_sawtooth_of_partition_drops_is_a_plateau_and_growing_peaks_are_not() -> None:
    """Sampled every 10 s: a table that fills for 5 minutes and loses a partition's worth at
    each drop. Measured at a trough and at a peak (as the soak's hour was: +21.8 % by its
    ends' levels) it is flat by its peaks; the same sawtooth on a rising base is not."""
    saw = [(10.0 * i, 700 + (i % 30) * 10.0) for i in range(361)]
    since = 2500.0  # the hour's last third after a 5-minute warm-up began in a trough
    assert (soak.growth_pct(saw, since) or 0) > 5  # the old criterion: a false growth
    assert soak.peak_growth_pct(saw, since) == 0.0
    rising = [(t, v * (1 + t / 3600)) for t, v in saw]
    assert (soak.peak_growth_pct(rising, since) or 0) > 5
