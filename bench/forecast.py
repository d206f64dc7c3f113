"""Forecast tick time at fleet scale: the scaler's forecast of every pool (900 s horizon,
its default) over S live jobs, S in `--forecast-sizes` (10k and 100k by default; 1M on
request: seeding it takes minutes and the old path takes minutes per tick).

Each size is seeded in bulk SQL: every job's spec distinct (its own log message, so one
hash per job: the worst case for a cold tick), schedules mixed (60 % every minute, 25 %
every 5 minutes, 10 % hourly, 4 % every 10 s, 1 % `H * * * *`: one group per job), 10 %
with 30 s of jitter, 10 % with a few successful runs (p90 history). Figures per size:

- before: the path the scaler ran until issue 18 (`ForecastJobList`: every job's spec and
  p90 read, every spec decoded and derived, each tick), first and second tick;
- after: `fleet_forecast.Forecaster`, the first tick (cold: every spec fetched once), the
  next one with nothing changed (steady), and one after 1 % of the specs changed;
- and that before and after agree (same counts, arrivals and concurrency per pool).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

from cronwell import jobs
from cronwell.fleet_forecast import Forecaster
from cronwell.forecast import (
    DEFAULT_SLO_SECONDS,
    HISTORY_RUNS,
    ForecastJob,
    PoolForecast,
    concurrency_timeline,
    demand,
)
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, gauges
from cronwell.store import jobs as store_jobs

HORIZON = 900.0

SEED_JOBS = """
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition, next_run_at)
SELECT gen_random_uuid(), 'bench', 'f' || i, s.spec, md5(s.spec::text), 'default', i %% 16,
       now() + interval '1 hour'
FROM generate_series(1, %(n)s) i,
LATERAL (SELECT jsonb_set(jsonb_set(jsonb_set(%(base)s::jsonb,
            '{target,log,message}', to_jsonb('job ' || i)),
            '{schedule}', to_jsonb(CASE WHEN i %% 100 < 60 THEN '* * * * *'
                                        WHEN i %% 100 < 85 THEN '*/5 * * * *'
                                        WHEN i %% 100 < 95 THEN '0 * * * *'
                                        WHEN i %% 100 < 99 THEN '*/10 * * * * *'
                                        ELSE 'H * * * *' END)),
            '{jitterSeconds}', to_jsonb(CASE WHEN i %% 10 = 0 THEN 30 ELSE 0 END)) AS spec) s
"""
SEED_HISTORY = """
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    overlap, delivery, max_attempts, timeout_seconds, attempt, fence, worker_id, started_at,
    finished_at)
SELECT j.id || ':' || h, j.id, 'default', ts, ts, 'succeeded', 'Skip', 'AtLeastOnce', 3, 3600,
       1, nextval('cronwell_fence'), 'w', ts, ts + make_interval(secs => h * 2)
FROM cronwell_jobs j, generate_series(1, 3) h,
     LATERAL (SELECT now() - make_interval(mins => h + 10) AS ts) t
WHERE substr(j.name, 2)::int % 10 = 1
"""
CHANGE_SPECS = """
UPDATE cronwell_jobs SET spec = s.spec, spec_hash = md5(s.spec::text)
FROM (SELECT id, jsonb_set(spec, '{target,log,message}', to_jsonb('changed ' || name)) AS spec
      FROM cronwell_jobs WHERE substr(name, 2)::int % 100 = 7) s
WHERE cronwell_jobs.id = s.id
"""


async def seed(db: Database, size: int) -> float:
    base = jobs.spec_document(
        ScheduledJobSpec.model_validate({"schedule": "* * * * *", "target": {"log": {}}})
    )
    t0 = time.perf_counter()
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_status_changes,"
            " cronwell_jobs CASCADE"
        )
        await conn.execute(SEED_JOBS, {"n": size, "base": json.dumps(base)})
        await conn.execute(SEED_HISTORY)
        await conn.execute("TRUNCATE cronwell_status_changes")
        await conn.execute("VACUUM ANALYZE cronwell_jobs")
        await conn.execute("VACUUM ANALYZE cronwell_occurrences")
    return time.perf_counter() - t0


async def old_path(db: Database, start: datetime) -> dict[str, PoolForecast]:
    """The forecast as `fleet_forecast` computed it before issue 18 (its clock read aside:
    `start` is given so both paths forecast the same buckets)."""
    js = [
        ForecastJob(str(r.id), r.pool, r.spec, r.p90_seconds)
        for r in await store_jobs.forecast_list(db, pool=None, history=HISTORY_RUNS)
    ]
    backlog = {r.pool: r.n for r in await gauges.queue_depth(db)}
    out = demand(js, start, HORIZON, backlog=backlog)
    for pf in out.values():
        concurrency_timeline(pf, DEFAULT_SLO_SECONDS)
    return out


def _facts(out: dict[str, PoolForecast]) -> dict[str, Any]:
    return {p: (pf.counts, pf.backlog, dict(pf.arrivals), pf.concurrency) for p, pf in out.items()}


async def measure(db: Database, size: int) -> dict[str, Any]:
    seeded = await seed(db, size)
    f = Forecaster()

    async def tick() -> tuple[float, dict[str, PoolForecast]]:
        t0 = time.perf_counter()
        out = await f.forecast(db, HORIZON)
        return time.perf_counter() - t0, out

    cold, out = await tick()
    warm, out = await tick()
    start = next(iter(out.values())).start
    t0 = time.perf_counter()
    old = await old_path(db, start)
    before_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    old = await old_path(db, start)
    before_second = time.perf_counter() - t0
    same = _facts(old) == _facts(out) if out and out[next(iter(out))].start == start else None
    async with db.connection() as conn:
        await conn.execute(CHANGE_SPECS)
    changed, _ = await tick()
    return {
        "jobs": size,
        "seed_s": round(seeded, 1),
        "before_first_s": round(before_first, 3),
        "before_second_s": round(before_second, 3),
        "after_cold_s": round(cold, 3),
        "after_steady_s": round(warm, 3),
        "after_1pct_changed_s": round(changed, 3),
        "steady_speedup": round(before_second / warm, 1) if warm else None,
        "same_result": same,
        "occurrences_forecast": sum(sum(pf.counts) for pf in out.values()),
    }


async def forecast_bench(db: Database, sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"horizon_s": HORIZON, "loadavg_before": os.getloadavg()}
    for size in sizes:
        figs = await measure(db, size)
        print(f"forecast {size}: {json.dumps(figs)}", flush=True)
        out[str(size)] = figs
    out["loadavg_after"] = os.getloadavg()
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_jobs CASCADE"
        )
    return out
