"""The forecast of every worker pool from the store (live jobs, their p90 durations, each
pool's backlog): the I/O around the pure arithmetic of `forecast.py`, shared by the
operator's WorkerPool loop and `cronwell forecast`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

from cronwell.forecast import (
    DEFAULT_SLO_SECONDS,
    HISTORY_RUNS,
    DemandCache,
    PoolForecast,
    concurrency_timeline,
)
from cronwell.store import clock, gauges
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell.workerpool import WorkerPoolSpec

FULL_REFRESH_SECONDS = 600.0
"""How often a `Forecaster` reads every job's p90 again (between, only of jobs that finished
a run): bounds how long a p90 changed otherwise (history pruned) goes unseen."""
FINISH_SLACK = timedelta(minutes=5)
"""Runs finished this long before the previous read are read again: a run's finished_at is
its transaction's clock, which may commit after a read that started later."""


class Forecaster:
    """The scaler's forecast loop, incremental: each tick reads the live jobs' (id, pool,
    spec hash) only, fetches the specs of hashes it does not know, reads p90 durations only
    of jobs that finished a run since its previous tick, and keeps each job's derived demand
    (`DemandCache`) until its spec hash changes. Same result as a from-scratch forecast."""

    def __init__(self, full_refresh_seconds: float = FULL_REFRESH_SECONDS) -> None:
        self.cache = DemandCache()
        self.full_refresh = timedelta(seconds=full_refresh_seconds)
        self.durations: dict[str, float] = {}
        """job id -> p90 of its last runs (jobs with history only)."""
        self._since: datetime | None = None
        self._full_at: datetime | None = None
        self._history: int | None = None

    async def forecast(
        self,
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
        exact = await clock.now(db)
        now = exact.replace(microsecond=0)
        keys = [(k.pool, k.ids, k.hashes) for k in await store_jobs.forecast_keys(db, pool=pool)]
        unknown = self.cache.unknown(keys)
        if unknown:
            ids = [uuid.UUID(j) for j in unknown.values()]
            for s in await store_jobs.forecast_specs(db, ids):
                self.cache.specs[s.spec_hash] = s.spec
        full = (
            self._since is None
            or self._full_at is None
            or history != self._history
            or exact - self._full_at >= self.full_refresh
        )
        since = None if full else self._since
        got = await store_jobs.forecast_durations(db, since=since, history=history)
        if full:
            self.durations = {r.id: r.p90_seconds for r in got if r.p90_seconds is not None}
            self._full_at, self._history = exact, history
        else:
            for r in got:
                if r.p90_seconds is None:
                    self.durations.pop(r.id, None)
                else:
                    self.durations[r.id] = r.p90_seconds
        self._since = exact - FINISH_SLACK
        live = sum(len(ids) for _, ids, _ in keys)
        if len(self.durations) > 2 * live + 1000:  # forget deleted jobs now and then
            alive = {j for _, ids, _ in keys for j in ids}
            self.durations = {k: v for k, v in self.durations.items() if k in alive}
        backlog = {
            r.pool: r.n for r in await gauges.queue_depth(db) if pool is None or r.pool == pool
        }
        defaults = {p: s.default_duration_seconds for p, s in pools.items()}
        out = self.cache.demand(
            keys,
            self.durations,
            now,
            horizon_seconds,
            resolution,
            backlog=backlog,
            default_duration=defaults,
        )
        for p, pf in out.items():
            spec = pools.get(p)
            slo = spec.start_slo_seconds if spec else slo_seconds
            concurrency_timeline(pf, slo, self.cache.memo)
        return out
