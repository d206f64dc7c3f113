"""forecast_pools on a real PostgreSQL: live jobs, p90 durations from history, backlog;
and `cronwell forecast` as users run it."""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from cronwell.fleet_forecast import forecast_pools
from cronwell.forecast import plan_replicas
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
                {"k": f"{job_id}:h{i}", "j": job_id, "p": pool, "i": i, "d": d,
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
    out = await forecast_pools(db, 600, pools=pools)
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

    only = await forecast_pools(db, 60, pool="default")
    assert set(only) == {"default"} and math.isclose(only["default"].resolution, 1.0)


async def test_a_materialised_one_shot_burst_still_counts(db: Database) -> None:
    """The scheduler materialises a runAt job's only occurrence a horizon ahead and clears
    its next_run_at: the burst must stay in the forecast until it is due."""
    now = await db_now(db)
    at = (now + timedelta(seconds=40)).replace(microsecond=0)
    for i in range(5):
        await make_job(db, f"once-{i}", runAt=at.isoformat(), pool="burst")
    before = await forecast_pools(db, 120, pool="burst")
    s = await scheduler(db, horizon_seconds=60)
    assert await s.materialise_until_idle() == 5
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cronwell_jobs WHERE pool = 'burst' AND next_run_at IS NULL"
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == 5  # nothing left to materialise
    after = await forecast_pools(db, 120, pool="burst")
    assert sum(before["burst"].counts) == sum(after["burst"].counts) == 5
    assert after["burst"].backlog == 0


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
