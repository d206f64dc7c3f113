"""The jobs (cronwell_jobs): apply, suspend, pause, tombstone and trigger; the reads of the
operator (drift, admission) and of the forecast."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cronwell.store.db import Conn, Database, row_class


@row_class
class LiveJob:
    """A live job locked for an upsert, a delete or a trigger."""

    id: uuid.UUID
    spec: dict[str, Any]
    spec_hash: str
    generation: int
    suspended: bool
    next_run_at: datetime | None
    labels: dict[str, str]


@row_class
class StoredJob:
    """A job by uid, live or tombstoned (`deleted_at`), locked for an upsert."""

    id: uuid.UUID
    namespace: str
    name: str
    spec: dict[str, Any]
    spec_hash: str
    generation: int
    suspended: bool
    next_run_at: datetime | None
    deleted_at: datetime | None
    labels: dict[str, str]


@row_class
class JobSummary:
    """A live job with its counters, as `cronwell jobs` lists it."""

    id: uuid.UUID
    namespace: str
    name: str
    pool: str
    spec: dict[str, Any]
    next_run_at: datetime | None
    suspended: bool
    suspended_reason: str | None
    consecutive_failures: int
    missed_total: int


@row_class
class JobName:
    """A job changed by pause or resume."""

    namespace: str
    name: str


@row_class
class JobRef:
    """A live job's uid and name (drift repair)."""

    id: uuid.UUID
    namespace: str
    name: str


@row_class
class ScheduleUse:
    """A cron (None: one-shots) and how many live jobs of a namespace keep running it."""

    schedule: str | None
    jobs: int


@row_class
class JobDuration:
    """A live job of a pool with the p90 duration of its last successful runs."""

    id: uuid.UUID
    pool: str
    spec: dict[str, Any]
    next_run_at: datetime | None
    p90_seconds: float | None
    runs: int


async def lock_name(db: Database, *, namespace: str, name: str, conn: Conn) -> None:
    """Serialise upserts of one namespace/name until `conn`'s transaction ends."""
    await db.execute("JobNameLock", {"namespace": namespace, "name": name}, conn=conn)


async def get_live(
    db: Database, *, namespace: str, name: str, conn: Conn | None = None
) -> LiveJob | None:
    """The live job of a namespace/name, locked (FOR UPDATE) in `conn`'s transaction."""
    return await db.row(LiveJob, "JobGetLive", {"namespace": namespace, "name": name}, conn)


async def get_by_id(
    db: Database, *, job_id: uuid.UUID, conn: Conn | None = None
) -> StoredJob | None:
    """A job by uid, live or tombstoned, locked (FOR UPDATE) in `conn`'s transaction."""
    return await db.row(StoredJob, "JobGetById", {"id": job_id}, conn)


async def insert(
    db: Database,
    *,
    job_id: uuid.UUID,
    namespace: str,
    name: str,
    spec: dict[str, Any],
    spec_hash: str,
    generation: int,
    pool: str,
    partition: int,
    next_run_at: datetime | None,
    suspended: bool,
    labels: Mapping[str, str] | None = None,
    conn: Conn | None = None,
) -> None:
    """Create a job (`spec` is its stored document, `labels` its CR's)."""
    await db.execute(
        "JobInsert",
        {
            "id": job_id,
            "namespace": namespace,
            "name": name,
            "spec": json.dumps(spec),
            "spec_hash": spec_hash,
            "generation": generation,
            "pool": pool,
            "partition": partition,
            "next_run_at": next_run_at,
            "suspended": suspended,
            "labels": json.dumps(dict(labels or {}), sort_keys=True),
        },
        conn=conn,
    )


async def set_labels(
    db: Database, *, job_id: uuid.UUID, labels: Mapping[str, str], conn: Conn | None = None
) -> None:
    """Record a job's changed labels; the dashboard filters on them."""
    await db.execute(
        "JobLabelsSet",
        {"id": job_id, "labels": json.dumps(dict(labels), sort_keys=True)},
        conn=conn,
    )


async def update(
    db: Database,
    *,
    job_id: uuid.UUID,
    spec: dict[str, Any],
    spec_hash: str,
    generation: int,
    pool: str,
    next_run_at: datetime | None,
    suspended: bool,
    conn: Conn | None = None,
) -> None:
    """Store a changed spec with its recomputed cursor; a resume records its instant."""
    await db.execute(
        "JobUpdate",
        {
            "id": job_id,
            "spec": json.dumps(spec),
            "spec_hash": spec_hash,
            "generation": generation,
            "pool": pool,
            "next_run_at": next_run_at,
            "suspended": suspended,
        },
        conn=conn,
    )


async def delete_future_occurrences(
    db: Database, *, job_id: uuid.UUID, conn: Conn | None = None
) -> datetime | None:
    """Drop a job's unstarted future scheduled occurrences; returns the earliest dropped."""
    earliest: datetime | None = await db.scalar("JobFutureOccurrencesDelete", {"id": job_id}, conn)
    return earliest


async def latest_scheduled(
    db: Database, *, job_id: uuid.UUID, conn: Conn | None = None
) -> datetime | None:
    """The latest nominal instant materialised for a job (its cursor must not go back)."""
    latest: datetime | None = await db.scalar("JobLatestScheduled", {"id": job_id}, conn)
    return latest


async def tombstone(db: Database, *, job_id: uuid.UUID, conn: Conn | None = None) -> None:
    """Delete a job: keep its history, drop its unstarted occurrences."""
    await db.execute("JobTombstone", {"id": job_id}, conn=conn)


async def set_suspended(
    db: Database,
    *,
    job_id: uuid.UUID,
    suspended: bool,
    reason: str | None,
    conn: Conn | None = None,
) -> None:
    """Suspend or resume a live job (a resume records its instant)."""
    await db.execute(
        "JobSuspendSet", {"id": job_id, "suspended": suspended, "reason": reason}, conn=conn
    )


async def list_live(db: Database, *, namespace: str | None) -> list[JobSummary]:
    """Live jobs of a namespace (all when None) with their counters, by namespace and name."""
    return await db.rows(JobSummary, "JobList", {"namespace": namespace})


async def pause(
    db: Database, *, namespace: str | None, name: str | None, reason: str
) -> list[JobName]:
    """Suspend the selected live jobs that run their schedule, with `reason`."""
    return await db.rows(
        JobName, "JobPauseBatch", {"namespace": namespace, "name": name, "reason": reason}
    )


async def resume_paused(db: Database, *, namespace: str | None, reason: str) -> list[JobName]:
    """Resume the selected jobs suspended with `reason` (and only those)."""
    return await db.rows(
        JobName, "JobResumePausedBatch", {"namespace": namespace, "reason": reason}
    )


async def insert_trigger(
    db: Database,
    *,
    key: str,
    job_id: uuid.UUID,
    pool: str,
    overlap: str,
    delivery: str,
    max_attempts: int,
    timeout_seconds: int,
    conn: Conn | None = None,
) -> bool:
    """A manual trigger's occurrence, due now; False when `key` already has one (the lookup
    under a lock on the key: no unique index on the key alone in a partitioned history)."""
    params = {
        "key": key,
        "job_id": job_id,
        "pool": pool,
        "overlap": overlap,
        "delivery": delivery,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout_seconds,
    }
    async with db.within(conn) as c:
        await db.fetch("OccurrenceTriggerLock", {"key": key}, c)
        created = await db.scalar("OccurrenceTriggerInsert", params, c)
    return created is not None


async def list_live_refs(db: Database, *, namespaces: Sequence[str] | None) -> list[JobRef]:
    """Live jobs of some namespaces (all when None or empty), for drift repair."""
    return await db.rows(JobRef, "JobLiveIdsList", {"namespaces": list(namespaces or []) or None})


async def observe_generation(db: Database, *, job_id: uuid.UUID, generation: int) -> None:
    """Record a newer CR generation whose spec means the same as the stored one."""
    await db.execute("JobGenerationObserve", {"id": job_id, "generation": generation})


async def namespace_schedules(
    db: Database, *, namespace: str, other_than: str
) -> list[ScheduleUse]:
    """The schedules a namespace's live jobs other than `other_than` keep running."""
    return await db.rows(
        ScheduleUse, "WebhookNamespaceSchedules", {"namespace": namespace, "name": other_than}
    )


async def forecast_list(db: Database, *, pool: str | None, history: int) -> list[JobDuration]:
    """Live jobs to forecast (of `pool`, all when None) with their p90 of `history` runs."""
    return await db.rows(JobDuration, "ForecastJobList", {"pool": pool, "history": history})


@row_class
class PoolJobKeys:
    """A pool's live jobs to forecast: ids (text) and their spec hashes, in the same order."""

    pool: str
    ids: list[str]
    hashes: list[str]


@row_class
class HashedSpec:
    spec_hash: str
    spec: dict[str, Any]


@row_class
class JobP90:
    id: str
    p90_seconds: float | None


async def forecast_keys(db: Database, *, pool: str | None) -> list[PoolJobKeys]:
    """The jobs `forecast_list` returns (of `pool`, all when None), without their specs."""
    return await db.rows(PoolJobKeys, "ForecastJobKeys", {"pool": pool})


async def forecast_specs(db: Database, ids: Sequence[uuid.UUID]) -> list[HashedSpec]:
    """The specs of the given jobs, with their hashes."""
    return await db.rows(HashedSpec, "ForecastSpecs", {"ids": list(ids)})


async def forecast_durations(db: Database, *, since: datetime | None, history: int) -> list[JobP90]:
    """p90 of `history` runs of the live jobs that finished a run since `since` (all: None)."""
    if since is None:
        return await db.rows(JobP90, "ForecastDurations", {"history": history})
    return await db.rows(JobP90, "ForecastDurationsSince", {"since": since, "history": history})
