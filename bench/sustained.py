"""Sustained: end-to-end occurrences/s at steady state.

J jobs with a per-second cron (`* * * * * *`, seconds first) and a no-op handler, one
`cronwell scheduler` process and W `cronwell worker` processes, for D seconds. Throughput
is counted over the steady window (after a warm-up) from the database: occurrences
finished per second, against occurrences offered (scheduled_for in the window); start lag
of those offered (`started_at`); backlog (due but unstarted) at the end, and of it those due
over 1 s before the end (already later than the target: the rest is the lag at that instant,
10,000 a second of it at 10,000 jobs and a 1 s lag). The target is
every job once a second: finished/s = offered/s, no backlog (issue 18: 10,000/s, p99 <= 1 s).

Where the ceiling is: CPU seconds of the scheduler, the workers and PostgreSQL over the
same steady window, per occurrence handled in it (finished or skipped), and the rate those
costs allow on this machine's cores with nothing else running (`cpu_bound_per_second`):
when it is below the target, no scheduling order holds the target here. Jobs are seeded
with concurrencyPolicy Skip (cronwell's default): once behind, a job's next occurrence is
skipped while the last one waits (`skipped_overlap`), so a box past its ceiling sheds load
rather than queueing it without end; the section runs once more with Allow (no overlap
decision: no job lock, no wait for the previous run's completion), side by side.

`claimed_after_instant_share`: of the occurrences started in the window, those claimed only
after their instant (not claimed ahead). A serialised job's occurrence can be claimed ahead
only once its previous run's completion is recorded; one claimed late finishes late, so its
successor is claimed late too (bench/README.md, "Serialised per-second jobs").
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

from bench.common import (
    BenchError,
    cpu_seconds,
    enable_statements,
    lag_stats,
    per_occurrence,
    postgres_cpu_seconds,
    seed,
    statements,
    stop_all,
    worker_argv,
)
from bench.soak import Tables
from cronwell.models import ConcurrencyPolicy
from cronwell.store import Database, clock

POLICIES = (ConcurrencyPolicy.SKIP.value, ConcurrencyPolicy.ALLOW.value)
"""The overlap policies the section runs with, by default: cronwell's default, and none."""
SERIES_SECONDS = 10.0
"""The width of each slice of instants in the p99 series (start_lag_p99_s_by_10s)."""


HISTORY = ("cronwell_occurrences", "cronwell_attempts")
"""The history tables, whose partitions `Tables` sums into them."""


async def write_load(db: Database, tables: Tables) -> dict[str, float]:
    """What the server's writes leave behind, cumulative: WAL bytes and full-page images,
    checkpoints, and the history tables' autovacuum runs, dead rows and size (`tables`: the
    soak's reader, one for both readings). Two readings a window apart say whether a run's
    second minute pays for its first: dead row versions until autovacuum comes (a minute
    apart by default), a vacuum of a grown partition, and full-page images after each
    checkpoint that the WAL volume forces."""
    stats = await tables.read(db)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT wal_bytes::float8 AS wal_bytes, wal_fpi::float8 AS wal_fpi,"
            " (SELECT num_timed + num_requested FROM pg_stat_checkpointer)::float8"
            "   AS checkpoints FROM pg_stat_wal"
        )
        row = await cur.fetchone()
    assert row is not None  # one row, always
    history = [stats.get(t, {}) for t in HISTORY]
    return {k: float(v) for k, v in row.items()} | {
        "autovacuums": float(sum(h.get("autovacuum", 0) for h in history)),
        "dead_rows": float(sum(h.get("dead", 0) for h in history)),
        "bytes": float(sum(h.get("bytes", 0) for h in history)),
    }


def write_load_figures(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, Any]:
    """`write_load` readings at a window's ends as figures, per occurrence where it fits."""
    d = {k: after[k] - before[k] for k in after}
    return {
        "wal_kb_per_occurrence": round(d["wal_bytes"] / 1024 / max(1, n), 2),
        "wal_full_page_images_per_occurrence": round(d["wal_fpi"] / max(1, n), 3),
        "checkpoints_in_window": int(d["checkpoints"]),
        "history_autovacuums_in_window": int(d["autovacuums"]),
        "history_dead_rows_at_end": int(after["dead_rows"]),
        "history_mb_at_end": round(after["bytes"] / 2**20),
    }


def check(duration: float, warmup: float, policies: list[str]) -> None:
    """Settings the section can measure (raises BenchError before anything is seeded)."""
    known = {p.value for p in ConcurrencyPolicy}
    if not policies or set(policies) - known:
        raise BenchError(
            f"--sustained-policies: unknown {', '.join(sorted(set(policies) - known)) or '(none)'};"
            f" any of {','.join(sorted(known))}"
        )
    if duration <= warmup:
        raise BenchError(
            f"sustained counts after its warm-up: --sustained-seconds ({duration:g}) must"
            f" exceed --sustained-warmup ({warmup:g})"
        )


async def sustained(
    db: Any,
    env: dict[str, str],
    n_jobs: int,
    workers: int,
    concurrency: int,
    duration: float,
    warmup: float,
    horizon: float,
    policy: str = POLICIES[0],
) -> dict[str, Any]:
    check(duration, warmup, [policy])
    await enable_statements(db, planning=True)
    await seed(
        db,
        n_jobs,
        "date_trunc('second', now()) + interval '2 seconds'",
        {"handler": {"name": "bench.noop"}},
        schedule="* * * * * *",
        policy=policy,
    )
    cw = [sys.executable, "-m", "cronwell"]
    procs = [
        subprocess.Popen(  # noqa: ASYNC220
            [*cw, "scheduler", "--partitions", "16", "--horizon-seconds", f"{horizon:g}"],
            env=env,
            start_new_session=True,
        )
    ] + [
        subprocess.Popen(  # noqa: ASYNC220
            worker_argv(concurrency, "cronwell_bench_noop"),
            env=env,
            start_new_session=True,
        )
        for _ in range(workers)
    ]
    t_start = await clock.now(db)

    def cpu() -> tuple[float, float, float]:  # scheduler, workers, PostgreSQL
        return (
            cpu_seconds(procs[0].pid),
            sum(cpu_seconds(p.pid) for p in procs[1:]),
            postgres_cpu_seconds(),
        )

    try:
        await asyncio.sleep(warmup)
        # Read before the window opens (and after it closes, below): the readings' queries
        # count in neither the window's CPU nor its statements.
        tables = Tables()
        load0 = await write_load(db, tables)
        async with db.connection() as conn:
            await conn.execute("SELECT pg_stat_statements_reset()")
        cpu0 = cpu()
        await asyncio.sleep(duration - warmup)
        cpu1 = cpu()
        t_end = await clock.now(db)
        per_statement = await statements(db)  # before the bench's counts
        load1 = await write_load(db, tables)  # after the window, as the first before it
    finally:
        stop_all(procs)
    async with db.connection() as conn:
        params = {"a": t_start, "w": warmup, "b": t_end}
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE finished_at >= %(a)s + make_interval(secs => %(w)s)"
            "   AND finished_at < %(b)s AND state = 'succeeded') AS finished,"
            " count(*) FILTER (WHERE scheduled_for >= %(a)s + make_interval(secs => %(w)s)"
            "   AND scheduled_for < %(b)s) AS offered,"
            " count(*) FILTER (WHERE state = 'pending' AND run_at < %(b)s) AS backlog_at_end,"
            " count(*) FILTER (WHERE state = 'pending' AND run_at < %(b)s - interval '1 second')"
            "   AS backlog_over_1s_at_end,"
            " count(*) FILTER (WHERE state = 'skipped') AS skipped,"
            " count(*) FILTER (WHERE state = 'skipped' AND finished_at >= %(a)s"
            "   + make_interval(secs => %(w)s) AND finished_at < %(b)s) AS skipped_in_window,"
            " extract(epoch FROM %(b)s - (%(a)s + make_interval(secs => %(w)s))) AS window"
            " FROM cronwell_occurrences",
            params,
        )
        r = await cur.fetchone()
        cur = await conn.execute(
            "SELECT extract(epoch FROM started_at - scheduled_for) AS lag,"
            " extract(epoch FROM scheduled_for - %(a)s) AS at,"
            " claimed_at > scheduled_for AS late"
            " FROM cronwell_occurrences WHERE started_at IS NOT NULL"
            " AND scheduled_for >= %(a)s + make_interval(secs => %(w)s)"
            " AND scheduled_for < %(b)s - interval '5 seconds'",
            params,
        )
        started = await cur.fetchall()
        lags = [float(x["lag"]) for x in started]
        by_slice: dict[int, list[float]] = {}
        for x in started:
            by_slice.setdefault(int(float(x["at"]) // SERIES_SECONDS), []).append(float(x["lag"]))
        late = sum(1 for x in started if x["late"])
    window = float(r["window"])
    handled = max(1, r["finished"] + r["skipped_in_window"])
    sched_ms, worker_ms, pg_ms = (1000 * (b - a) / handled for a, b in zip(cpu0, cpu1, strict=True))
    cpu_ms = sched_ms + worker_ms + pg_ms
    out = {
        "jobs_per_second_cron": n_jobs,
        "concurrency_policy": policy,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        "duration_s": duration,
        "scheduler_horizon_s": horizon,
        "steady_window_s": round(window, 1),
        "offered_per_second": round(r["offered"] / window),
        "per_second": round(r["finished"] / window),
        "target_per_second": n_jobs,
        "backlog_at_end": r["backlog_at_end"],
        "backlog_over_1s_at_end": r["backlog_over_1s_at_end"],
        "skipped_overlap": r["skipped"],
        "skipped_per_second": round(r["skipped_in_window"] / window),
        "claimed_after_instant_share": round(late / max(1, len(started)), 3),
        "scheduler_cpu_ms_per_occurrence": round(sched_ms, 3),
        "worker_cpu_ms_per_occurrence": round(worker_ms, 3),
        "postgres_cpu_ms_per_occurrence": round(pg_ms, 3),
        "cpu_bound_per_second": round((os.cpu_count() or 1) * 1000 / cpu_ms),
        "statements_after_warmup": per_occurrence(per_statement, handled),
        **write_load_figures(load0, load1, handled),
        # Does a backlog persist or drain? The p99 of each 10 s of instants, in order.
        "start_lag_p99_s_by_10s": [
            lag_stats(by_slice[k])["start_lag_p99_s"] for k in sorted(by_slice)
        ],
    }
    return out | lag_stats(lags)
