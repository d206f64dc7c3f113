"""The forecast of every worker pool from the store (live jobs, their p90 durations, each
pool's backlog): the I/O around the pure arithmetic of `forecast.py`, shared by the
operator's WorkerPool loop and `cronwell forecast`."""

from __future__ import annotations

from collections.abc import Mapping

from cronwell.forecast import (
    DEFAULT_SLO_SECONDS,
    HISTORY_RUNS,
    ForecastJob,
    PoolForecast,
    concurrency_timeline,
    demand,
)
from cronwell.store import clock, gauges
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell.workerpool import WorkerPoolSpec


async def forecast_pools(
    db: Database,
    horizon_seconds: float,
    *,
    pool: str | None = None,
    resolution: float = 1.0,
    pools: Mapping[str, WorkerPoolSpec] | None = None,
    history: int = HISTORY_RUNS,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
) -> dict[str, PoolForecast]:
    """Forecast every pool (or `pool`) from the store, starting at the database's now
    truncated to the second (so buckets, and burst times, fall on whole seconds and stay
    the same from one forecast to the next): live jobs with their p90 durations, plus each
    pool's backlog of due pending occurrences; concurrency per bucket uses each pool's SLO
    and default duration from `pools` (WorkerPool specs); other pools use `slo_seconds` and
    the default duration."""
    pools = pools or {}
    now = (await clock.now(db)).replace(microsecond=0)
    jobs = [
        ForecastJob(str(r.id), r.pool, r.spec, r.p90_seconds)
        for r in await store_jobs.forecast_list(db, pool=pool, history=history)
    ]
    backlog = {r.pool: r.n for r in await gauges.queue_depth(db) if pool is None or r.pool == pool}
    defaults = {p: s.default_duration_seconds for p, s in pools.items()}
    out = demand(jobs, now, horizon_seconds, resolution, backlog=backlog, default_duration=defaults)
    for p, pf in out.items():
        spec = pools.get(p)
        concurrency_timeline(pf, spec.start_slo_seconds if spec else slo_seconds)
    return out
