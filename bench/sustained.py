"""Sustained: end-to-end occurrences/s at steady state.

J jobs with a per-second cron (`* * * * * *`, seconds first) and a no-op handler, one
`cronwell scheduler` process and W `cronwell worker` processes, for D seconds. Throughput
is counted over the steady window (after a warm-up) from the database: occurrences
finished per second, against occurrences offered (scheduled_for in the window); start lag
of those offered (`started_at`); backlog (due but unstarted) at the end. The target is
every job once a second: finished/s = offered/s, no backlog (issue 18: 10,000/s, p99 <= 1 s).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from bench.common import BenchError, lag_stats, seed, stop_all, worker_argv
from cronwell.store import clock


def check(duration: float, warmup: float) -> None:
    """Settings the section can measure (raises BenchError before anything is seeded)."""
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
) -> dict[str, Any]:
    check(duration, warmup)
    await seed(
        db,
        n_jobs,
        "date_trunc('second', now()) + interval '2 seconds'",
        {"handler": {"name": "bench.noop"}},
        schedule="* * * * * *",
    )
    cw = [sys.executable, "-m", "cronwell"]
    procs = [
        subprocess.Popen(  # noqa: ASYNC220
            [*cw, "scheduler", "--partitions", "16", "--horizon-seconds", "5"],
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
    try:
        await asyncio.sleep(duration)
        t_end = await clock.now(db)
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
            " count(*) FILTER (WHERE state = 'skipped') AS skipped,"
            " extract(epoch FROM %(b)s - (%(a)s + make_interval(secs => %(w)s))) AS window"
            " FROM cronwell_occurrences",
            params,
        )
        r = await cur.fetchone()
        cur = await conn.execute(
            "SELECT extract(epoch FROM started_at - scheduled_for) AS lag"
            " FROM cronwell_occurrences WHERE started_at IS NOT NULL"
            " AND scheduled_for >= %(a)s + make_interval(secs => %(w)s)"
            " AND scheduled_for < %(b)s - interval '5 seconds'",
            params,
        )
        lags = [float(x["lag"]) for x in await cur.fetchall()]
    window = float(r["window"])
    out = {
        "jobs_per_second_cron": n_jobs,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        "duration_s": duration,
        "steady_window_s": round(window, 1),
        "offered_per_second": round(r["offered"] / window),
        "per_second": round(r["finished"] / window),
        "target_per_second": n_jobs,
        "backlog_at_end": r["backlog_at_end"],
        "skipped_overlap": r["skipped"],
    }
    return out | lag_stats(lags)
