"""Small helpers for integration tests (real PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from cronwell import jobs, partitions
from cronwell.models import ScheduledJobSpec
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store import claims, clock
from cronwell.store.db import Database


async def make_job(db: Database, name: str, **spec: Any) -> jobs.Applied:
    spec.setdefault("target", {"log": {"message": name}})
    return await jobs.apply_job(
        db, namespace="default", name=name, spec=ScheduledJobSpec.model_validate(spec)
    )


async def set_cursor(db: Database, name: str, sql_instant: str) -> None:
    """Move a job's next_run_at (e.g. "now() - interval '3 hours'") to simulate downtime."""
    async with db.connection() as conn:
        await conn.execute(
            f"UPDATE cronwell_jobs SET next_run_at = {sql_instant} WHERE name = %s",  # type: ignore[arg-type]
            (name,),
        )


async def seed_started_runs(db: Database, job_id: uuid.UUID, runs: list[tuple[int, float]]) -> None:
    """Succeeded runs of a job, each (minutes ago it was scheduled, its start lag in s)."""
    async with db.connection() as conn:
        for minutes_ago, lag in runs:
            await conn.execute(
                "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
                " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt,"
                " started_at, finished_at) "
                "SELECT %(key)s, %(job)s, 'default', t, t, 'succeeded', 'Allow', 'AtLeastOnce',"
                " 1, 60, 1, t + make_interval(secs => %(lag)s), t + make_interval(secs => 5)"
                " FROM (SELECT date_trunc('second', now()) - make_interval(mins => %(ago)s) t) s",
                {"key": f"{job_id}:{minutes_ago}", "job": job_id, "lag": lag, "ago": minutes_ago},
            )


async def seed_runs(
    db: Database,
    job_id: uuid.UUID,
    pool: str,
    minutes_ago: list[int],
    *,
    state: str = "succeeded",
    jitter: float = 0.0,
    due_seconds_ago: float | None = None,
) -> list[str]:
    """Occurrences of a job in `pool`, scheduled `minutes_ago` (run_at `jitter` s later, or
    `due_seconds_ago` s ago for pending ones); their keys."""
    keys = [f"{job_id}:{pool}:{m}" for m in minutes_ago]
    for key, m in zip(keys, minutes_ago, strict=True):
        await sql(
            db,
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt,"
            " started_at, finished_at)"
            " SELECT %s, %s, %s, t, r, %s, 'Allow', 'AtLeastOnce', 3, 60, 1,"
            "  CASE WHEN %s = 'succeeded' THEN r + interval '2 seconds' END,"
            "  CASE WHEN %s = 'succeeded' THEN r + interval '5 seconds' END"
            " FROM (SELECT date_trunc('second', now()) - make_interval(mins => %s) AS t) s,"
            " LATERAL (SELECT coalesce(now() - make_interval(secs => %s::float8),"
            "                          t + make_interval(secs => %s)) AS r) x",
            key, job_id, pool, state, state, state, m, due_seconds_ago, jitter,
        )  # fmt: skip
    return keys


async def scheduler(db: Database, *, partition_count: int = 1, **settings: Any) -> Scheduler:
    """A scheduler that owns every partition (the store re-partitioned to P=1 unless
    another P is given)."""
    await partitions.set_count(db, partition_count)
    s = Scheduler(db, SchedulerSettings(**settings))
    await s.balance()
    assert len(s.owned) == partition_count
    return s


async def occurrences(db: Database, name: str | None = None) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT o.*, j.name FROM cronwell_occurrences o JOIN cronwell_jobs j "
            "ON j.id = o.job_id WHERE %(name)s::text IS NULL OR j.name = %(name)s "
            "ORDER BY o.scheduled_for, o.id",
            {"name": name},
        )
        return [dict(r) for r in await cur.fetchall()]


async def sql(db: Database, query: str, *args: Any) -> list[dict[str, Any]]:
    """Ad-hoc SQL of the test itself (user tables, simulated time passing)."""
    async with db.connection() as conn:
        cur = await conn.execute(query, args or None)
        return [dict(r) for r in await cur.fetchall()] if cur.description else []


async def waiting_for_an_advisory_lock(db: Database, lock_class: int) -> bool:
    """Whether a session of this database waits for an advisory lock of `lock_class`
    (claims.JOB_LOCK_CLASS: a job's lock; claims.CLAIM_TURN_CLASS: a pool's turn to claim;
    pg_locks is the whole server's)."""
    rows = await sql(
        db,
        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        lock_class,
    )
    return bool(rows)


async def waiting_for_a_job_lock(db: Database) -> bool:
    """Whether a session of this database waits for a job's lock (claims.lock_jobs)."""
    return await waiting_for_an_advisory_lock(db, claims.JOB_LOCK_CLASS)


async def db_now(db: Database) -> datetime:
    return await clock.now(db)
