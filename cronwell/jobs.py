"""Jobs in the store: create, update, suspend, delete and trigger. Shared by the standalone
CLI (`cronwell apply`) and the operator, so both keep the same guarantees: re-applying the
same spec is a no-op, and a spec change neither loses nor duplicates an occurrence."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cronwell import dispatch, schedule
from cronwell.errors import CronwellError, JobNotFound
from cronwell.models import ScheduledJobSpec
from cronwell.store import clock
from cronwell.store import jobs as store_jobs
from cronwell.store import partitions as store_partitions
from cronwell.store.db import Conn, Database

log = logging.getLogger(__name__)
_EPS = timedelta(microseconds=1)


def spec_document(spec: ScheduledJobSpec) -> dict[str, Any]:
    """The stored form of a spec: camelCase JSON with defaults filled in."""
    doc: dict[str, Any] = spec.model_dump(mode="json", by_alias=True)
    return doc


def spec_hash(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Applied:
    id: uuid.UUID
    namespace: str
    name: str
    action: str  # created | updated | unchanged
    next_run_at: datetime | None


async def apply_job(
    db: Database,
    *,
    namespace: str,
    name: str,
    spec: ScheduledJobSpec,
    uid: str | uuid.UUID | None = None,
    generation: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> Applied:
    """Upsert one job. `uid` is the CR's uid in cluster mode; standalone jobs get a fresh
    uuid when first applied (a deleted and re-applied job is a new job, as in Kubernetes).
    Its partition is `hash(uid) % P` with the store's P (see cronwell.partitions).
    `labels` (the CR's metadata labels) are recorded for the dashboard; None keeps them."""
    doc = spec_document(spec)
    digest = spec_hash(doc)
    async with db.transaction() as conn:
        # Two applies of one new name: the second waits here, then sees the first's row.
        await store_jobs.lock_name(db, namespace=namespace, name=name, conn=conn)
        now = await clock.now(db, conn)
        row: store_jobs.StoredJob | store_jobs.LiveJob | None
        if uid is not None:
            row = await store_jobs.get_by_id(db, job_id=uuid.UUID(str(uid)), conn=conn)
            if row is not None and row.deleted_at is not None:
                return Applied(row.id, namespace, name, "deleted", None)
        else:
            row = await store_jobs.get_live(db, namespace=namespace, name=name, conn=conn)
        if row is None:
            partitions = await store_partitions.count_shared(db, conn)
            if partitions is None:
                raise CronwellError("the store has no partition count: run `cronwell migrate`")
            job_id = uuid.UUID(str(uid)) if uid is not None else uuid.uuid4()
            sched = schedule.JobSchedule.from_spec(job_id, spec)
            nxt = spec.run_at if spec.run_at is not None else sched.first_at_or_after(now)
            await store_jobs.insert(
                db,
                job_id=job_id,
                namespace=namespace,
                name=name,
                spec=doc,
                spec_hash=digest,
                generation=generation or 1,
                pool=spec.pool,
                partition=schedule.partition_of(job_id, partitions),
                next_run_at=nxt,
                suspended=spec.suspend,
                labels=labels,
                conn=conn,
            )
            log.info(
                "job created",
                extra={
                    "action": "job_created",
                    "job": str(job_id),
                    "job_name": f"{namespace}/{name}",
                },
            )
            return Applied(job_id, namespace, name, "created", nxt)
        job_id = row.id
        if labels is not None and dict(labels) != row.labels:
            await store_jobs.set_labels(db, job_id=job_id, labels=labels, conn=conn)
        if row.spec_hash == digest:
            return Applied(job_id, namespace, name, "unchanged", row.next_run_at)
        nxt = await _reschedule(db, conn, job_id, spec, row.next_run_at, now)
        await store_jobs.update(
            db,
            job_id=job_id,
            spec=doc,
            spec_hash=digest,
            generation=generation or row.generation + 1,
            pool=spec.pool,
            next_run_at=nxt,
            suspended=spec.suspend,
            conn=conn,
        )
        log.info(
            "job updated",
            extra={"action": "job_updated", "job": str(job_id), "job_name": f"{namespace}/{name}"},
        )
        return Applied(job_id, namespace, name, "updated", nxt)


async def _reschedule(
    db: Database,
    conn: Conn,
    job_id: uuid.UUID,
    spec: ScheduledJobSpec,
    old_next: datetime | None,
    now: datetime,
) -> datetime | None:
    """Drop unstarted future occurrences (no fence was issued, so no effect happened) and
    restart the cursor where handling stopped, so no instant is lost or repeated."""
    earliest_gone = await store_jobs.delete_future_occurrences(db, job_id=job_id, conn=conn)
    latest = await store_jobs.latest_scheduled(db, job_id=job_id, conn=conn)
    if spec.run_at is not None:
        return spec.run_at if latest is None or spec.run_at > latest else None
    candidates = [t for t in (old_next, earliest_gone) if t is not None]
    base = min(candidates) if candidates else now
    if latest is not None and base <= latest:
        base = latest + _EPS
    return schedule.JobSchedule.from_spec(job_id, spec).first_at_or_after(base)


async def _find(db: Database, conn: Conn, namespace: str, name: str) -> store_jobs.LiveJob:
    row = await store_jobs.get_live(db, namespace=namespace, name=name, conn=conn)
    if row is None:
        raise JobNotFound(
            f"no ScheduledJob {namespace}/{name} in the store "
            "(apply it first: cronwell apply -f FILE)"
        )
    return row


async def delete_job(db: Database, *, namespace: str, name: str) -> uuid.UUID:
    """Tombstone a job: history is kept, unstarted occurrences are dropped."""
    async with db.transaction() as conn:
        row = await _find(db, conn, namespace, name)
        await store_jobs.tombstone(db, job_id=row.id, conn=conn)
    log.info("job deleted", extra={"action": "job_deleted", "job": str(row.id)})
    return row.id


async def delete_job_by_uid(db: Database, uid: str | uuid.UUID) -> None:
    await store_jobs.tombstone(db, job_id=uuid.UUID(str(uid)))


#: suspended_reason of jobs paused by `cronwell pause` (CamelCase like the other reasons,
#: Manual and SuspendedAfterFailures, so it can be a condition reason as it is).
PAUSE_REASON = "Paused"


@dataclass(frozen=True)
class Paused:
    """What `cronwell pause`/`resume --all` did: the jobs changed, and the jobs of the
    selection left as they were because they are suspended for another reason."""

    changed: list[tuple[str, str]]
    untouched: list[tuple[str, str, str]]  # namespace, name, reason


async def _suspended_others(
    db: Database, namespace: str | None, name: str | None
) -> list[tuple[str, str, str]]:
    rows = await store_jobs.list_live(db, namespace=namespace)
    return [
        (r.namespace, r.name, r.suspended_reason or "spec.suspend")
        for r in rows
        if r.suspended and r.suspended_reason != PAUSE_REASON and (name is None or r.name == name)
    ]


async def pause(db: Database, *, namespace: str | None, name: str | None = None) -> Paused:
    """Suspend the selected live jobs with reason Paused (the incident button). Jobs already
    suspended keep their reason, so `resume --all` does not resume them by mistake."""
    rows = await store_jobs.pause(db, namespace=namespace, name=name, reason=PAUSE_REASON)
    changed = [(r.namespace, r.name) for r in rows]
    if name is not None and not changed:
        async with db.transaction() as conn:
            await _find(db, conn, namespace or "default", name)
    if changed:
        log.warning(
            "jobs paused",
            extra={"action": "jobs_paused", "jobs": len(changed), "namespace": namespace},
        )
    return Paused(changed, await _suspended_others(db, namespace, name))


async def resume_paused(db: Database, *, namespace: str | None) -> Paused:
    """Resume the jobs `pause` suspended (in one namespace, or all); jobs suspended by their
    spec, by `cronwell suspend` or after failures stay suspended and are listed."""
    rows = await store_jobs.resume_paused(db, namespace=namespace, reason=PAUSE_REASON)
    changed = [(r.namespace, r.name) for r in rows]
    if changed:
        log.info(
            "jobs resumed",
            extra={"action": "jobs_resumed", "jobs": len(changed), "namespace": namespace},
        )
    return Paused(changed, await _suspended_others(db, namespace, None))


async def set_suspended(
    db: Database, *, namespace: str, name: str, suspended: bool, reason: str | None = None
) -> None:
    async with db.transaction() as conn:
        row = await _find(db, conn, namespace, name)
        await store_jobs.set_suspended(
            db, job_id=row.id, suspended=suspended, reason=reason, conn=conn
        )


async def trigger_job(
    db: Database, *, namespace: str, name: str, trigger_id: str | None = None
) -> tuple[str, bool]:
    """Run a job now, once per trigger id. Returns (key, created)."""
    trigger_id = trigger_id or uuid.uuid4().hex
    async with db.transaction() as conn:
        row = await _find(db, conn, namespace, name)
        spec = ScheduledJobSpec.model_validate(row.spec)
        key = schedule.trigger_key(row.id, trigger_id)
        created = await store_jobs.insert_trigger(
            db,
            key=key,
            job_id=row.id,
            pool=spec.pool,
            overlap=spec.concurrency_policy,
            delivery=spec.delivery,
            max_attempts=spec.retry.max_attempts,
            timeout_seconds=spec.timeout_seconds,
            conn=conn,
        )
        now = await clock.now(db, conn)
        await dispatch.notify_due(db, conn, [(spec.pool, now)])
    return key, created
