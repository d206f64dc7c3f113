"""Forecaster.forecast on a real PostgreSQL: live jobs, p90 durations from history, backlog;
and `cronwell forecast` as users run it."""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from cronwell import dispatch, jobs
from cronwell.fleet_forecast import Forecaster
from cronwell.forecast import (
    DEFAULT_SLO_SECONDS,
    HISTORY_RUNS,
    ForecastJob,
    concurrency_timeline,
    demand,
    plan_replicas,
)
from cronwell.store import gauges
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell.workerpool import WorkerPoolSpec
from tests.conftest import REPO
from tests.integration.helpers import db_now, make_job, scheduler


async def add_history(db: Database, job_id: uuid.UUID, pool: str, durations: list[float]) -> None:
    """Succeeded occurrences in the past, one per duration (seconds)."""
    async with db.connection() as conn:
        for i, d in enumerate(durations):
            await conn.execute(
                "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
                " run_at, state, overlap, delivery, max_attempts, timeout_seconds, started_at,"
                " finished_at) SELECT %(k)s, %(j)s, %(p)s, t, t, %(state)s, 'Skip', "
                "'AtLeastOnce', 3, 60, t, t + make_interval(secs => %(d)s) "
                "FROM (SELECT now() - make_interval(mins => %(i)s + 1) AS t) x",
                {"k": f"{job_id}:h{i}:{d}", "j": job_id, "p": pool, "i": i, "d": d,
                 "state": "succeeded"},
            )  # fmt: skip


async def add_pending(db: Database, job_id: uuid.UUID, pool: str, n: int) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, "
            "run_at, state, overlap, delivery, max_attempts, timeout_seconds) "
            "SELECT %(j)s || ':b' || g, %(j)s::uuid, %(p)s, now() - interval '10 seconds', "
            "now() - interval '10 seconds', 'pending', 'Skip', 'AtLeastOnce', 3, 60 "
            "FROM generate_series(1, %(n)s) g",
            {"j": str(job_id), "p": pool, "n": n},
        )


async def test_forecast_pools_from_the_store(db: Database) -> None:
    every_minute = await make_job(db, "every-minute", schedule="* * * * *", pool="reports")
    await make_job(db, "every-10s", schedule="*/10 * * * * *")
    await make_job(db, "paris", schedule="*/5 * * * *", timeZone="Europe/Paris")
    await make_job(db, "suspended", schedule="* * * * * *", suspend=True)
    gone = await make_job(db, "gone", schedule="* * * * * *", pool="reports")
    async with db.connection() as conn:
        await conn.execute("UPDATE cronwell_jobs SET deleted_at = now() WHERE id = %s", (gone.id,))
    await add_history(db, every_minute.id, "reports", [float(d) for d in range(1, 11)])
    await add_pending(db, every_minute.id, "reports", 5)

    now = await db_now(db)
    pools = {
        "reports": WorkerPoolSpec.model_validate(
            {"scaleTargetRef": {"name": "w"}, "startSLOSeconds": 2, "concurrencyPerReplica": 1}
        )
    }
    out = await Forecaster().forecast(db, 600, pools=pools)
    assert set(out) == {"default", "reports"}
    rep, dflt = out["reports"], out["default"]
    assert abs((rep.start - now).total_seconds()) < 5
    assert len(rep.counts) == 600
    assert sum(rep.counts) == 10  # every minute; deleted and suspended jobs do not count
    assert rep.backlog == 5
    # p90 of 1..10 s (percentile_cont) is 9.1 s
    assert {d for (_, d) in rep.arrivals} == {9.1, 1.0}
    assert sum(dflt.counts) == 60 + 2  # 10 s cron + */5 in Paris
    assert dflt.backlog == 0
    # 5 backlog occurrences of 1 s, SLO 2 s: 3 waves -> 2 slots; every-minute ones need 1
    assert rep.concurrency[0] == 2
    assert max(dflt.concurrency) == 1
    plan = plan_replicas(rep, pools["reports"], now)
    assert plan.replicas == 2 and plan.next_burst is not None and plan.next_burst.size >= 5

    only = await Forecaster().forecast(db, 60, pool="default")
    assert set(only) == {"default"} and math.isclose(only["default"].resolution, 1.0)


async def test_a_materialised_one_shot_burst_still_counts(db: Database) -> None:
    """The scheduler materialises a runAt job's only occurrence a horizon ahead and clears
    its next_run_at: the burst must stay in the forecast until it is due."""
    now = await db_now(db)
    at = (now + timedelta(seconds=40)).replace(microsecond=0)
    for i in range(5):
        await make_job(db, f"once-{i}", runAt=at.isoformat(), pool="burst")
    before = await Forecaster().forecast(db, 120, pool="burst")
    s = await scheduler(db, horizon_seconds=90)  # visited within half of it
    assert await s.materialise_until_idle() == 5
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cronwell_jobs WHERE pool = 'burst' AND next_run_at IS NULL"
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == 5  # nothing left to materialise
    after = await Forecaster().forecast(db, 120, pool="burst")
    assert sum(before["burst"].counts) == sum(after["burst"].counts) == 5
    assert after["burst"].backlog == 0
    # Workers claim ahead of the instant: the burst still counts until it is past (it left
    # the forecast before, so the scaler scaled the pool down at the burst).
    got = await dispatch.claim(
        db, pool="burst", worker_id="w", limit=10, lease_seconds=60, ahead_seconds=60
    )
    assert len(got) == 5
    claimed = await Forecaster().forecast(db, 120, pool="burst")
    assert sum(claimed["burst"].counts) == 5 and claimed["burst"].backlog == 0


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronwell", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


async def test_forecast_command(db: Database, db_url: str, tmp_path: Path) -> None:
    await make_job(db, "burst", schedule="* * * * * *")
    r = cli("forecast", "--horizon", "5m", url=db_url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("pool default: 300 occurrences in 5m, backlog 0, replicas now 1")
    assert lines[1].split() == ["TIME", "(UTC)", "DUE", "CONCURRENCY", "REPLICAS"]
    rows = [ln.split() for ln in lines[2:]]
    assert len(rows) == 5 and all(row[2:] == ["60", "1", "1"] for row in rows)

    png = tmp_path / "f.png"
    r = cli("forecast", "--horizon", "2m", "--bucket", "30s", "--png", str(png), url=db_url)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(r.stdout.splitlines()) == 2 + 4 + 1

    bad = cli("forecast", "--horizon", "soon", url=db_url)
    assert bad.returncode == 2 and "invalid duration 'soon': use e.g. 90s" in bad.stderr


async def from_scratch(db: Database, start: Any, horizon: float) -> dict[str, Any]:
    """The forecast as it was computed before it was incremental: every job with its spec
    and p90 read again (ForecastJobList), every spec derived again."""
    jobs = [
        ForecastJob(str(r.id), r.pool, r.spec, r.p90_seconds)
        for r in await store_jobs.forecast_list(db, pool=None, history=HISTORY_RUNS)
    ]
    backlog = {r.pool: r.n for r in await gauges.queue_depth(db)}
    out = demand(jobs, start, horizon, backlog=backlog)
    for pf in out.values():
        concurrency_timeline(pf, DEFAULT_SLO_SECONDS)
    return {p: (pf.counts, pf.backlog, pf.arrivals, pf.concurrency) for p, pf in out.items()}


async def equals_from_scratch(f: Forecaster, db: Database) -> None:
    """`f`'s next forecast (300 s) is the one computed from scratch."""
    inc = await f.forecast(db, 300)
    want = await from_scratch(db, next(iter(inc.values())).start, 300)
    got = {p: (pf.counts, pf.backlog, pf.arrivals, pf.concurrency) for p, pf in inc.items()}
    assert got == want


async def test_incremental_forecast_equals_a_forecast_from_scratch(db: Database) -> None:
    """A Forecaster keeps each job's demand between ticks: after adds, spec changes,
    history, suspends and deletes its forecast is the one computed from scratch."""
    f = Forecaster()

    async def check() -> None:
        await equals_from_scratch(f, db)

    a = await make_job(db, "a", schedule="*/10 * * * * *", jitterSeconds=7)
    await make_job(db, "b", schedule="*/10 * * * * *", jitterSeconds=7)
    await make_job(db, "h", schedule="H/15 * * * * *", pool="other")
    await check()
    for i in range(5):  # same spec: one hash, one derivation
        await make_job(db, f"same-{i}", schedule="*/30 * * * * *")
    await make_job(db, "b", schedule="*/20 * * * * *", jitterSeconds=3)  # spec change
    await add_history(db, a.id, "default", [4.0, 6.0])
    await add_pending(db, a.id, "default", 3)
    await check()
    # only the specs and jobs with jitter or H are kept one by one
    assert (len(f.cache.specs), len(f.cache.jobs)) == (3, 3)
    await make_job(db, "h", schedule="H/15 * * * * *", pool="default")  # moves pool
    await jobs.delete_job(db, namespace="default", name="same-0")
    await jobs.set_suspended(db, namespace="default", name="same-1", suspended=True)
    await add_history(db, a.id, "default", [30.0] * 5)  # a's p90 changes after the tick
    await check()
    assert (len(f.cache.specs), len(f.cache.jobs)) == (3, 3)
    await make_job(db, "b", schedule="*/10 * * * * *", jitterSeconds=7)  # back to its first spec
    await check()


async def test_a_change_between_two_forecasts_shows_in_the_second(db: Database) -> None:
    """The Forecaster reuses its count of the jobs while none changed: each single change
    made after a forecast that reused it (a job added, re-specced, suspended or deleted, a
    p90 changed) shows in the next forecast, as computed from scratch."""
    f = Forecaster()

    async def check() -> None:
        await equals_from_scratch(f, db)

    a = await make_job(db, "a", schedule="*/10 * * * * *")
    await make_job(db, "b", schedule="*/20 * * * * *", jitterSeconds=3)
    await add_history(db, a.id, "default", [2.0])
    await check()
    await check()  # nothing changed: the counted jobs are reused
    await make_job(db, "c", schedule="*/15 * * * * *")  # added
    await check()
    await make_job(db, "c", schedule="*/5 * * * * *")  # re-specced
    await check()
    await jobs.set_suspended(db, namespace="default", name="b", suspended=True)
    await check()
    await jobs.delete_job(db, namespace="default", name="c")
    await check()
    await add_history(db, a.id, "default", [9.0] * 5)  # a's p90: 2 s -> 9 s
    await check()
