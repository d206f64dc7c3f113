"""Backfill (`cronwell backfill`): past instants of one job under their real keys, in the
transaction that holds the job's row lock and its claims' lock (claims.lock_jobs)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronwell.store.db import Conn, Database, row_class


@row_class
class BackfillJob:
    """The live job to backfill, locked while the backfill plans and writes."""

    id: uuid.UUID
    spec: dict[str, Any]
    pool: str
    suspended: bool
    suspended_reason: str | None
    next_run_at: datetime | None


@row_class
class RunSettings:
    """How the job's backfilled occurrences run (from its spec)."""

    job_id: uuid.UUID
    pool: str
    overlap: str
    delivery: str
    max_attempts: int
    timeout_seconds: int


@row_class
class _Existing:
    idempotency_key: str
    state: str


@row_class
class _Key:
    idempotency_key: str


async def get_job(db: Database, *, namespace: str, name: str, conn: Conn) -> BackfillJob | None:
    """The live job of a namespace/name, locked (FOR UPDATE) in `conn`'s transaction."""
    return await db.row(BackfillJob, "BackfillJobGet", {"namespace": namespace, "name": name}, conn)


async def existing_states(db: Database, *, keys: Sequence[str], conn: Conn) -> dict[str, str]:
    """{key: state} of the occurrences that exist already among `keys`."""
    rows = await db.rows(_Existing, "BackfillExisting", {"keys": list(keys)}, conn)
    return {r.idempotency_key: r.state for r in rows}


async def reopen(db: Database, run: RunSettings, *, keys: Sequence[str], conn: Conn) -> list[str]:
    """Make the missed occurrences among `keys` runnable again; returns their keys."""
    params = dataclasses.asdict(run) | {"keys": list(keys)}
    return [r.idempotency_key for r in await db.rows(_Key, "BackfillReopen", params, conn)]


async def insert(
    db: Database,
    run: RunSettings,
    *,
    keys: Sequence[str],
    scheduled_for: Sequence[datetime],
    conn: Conn,
) -> list[str]:
    """Create pending occurrences for instants without one; returns the keys created."""
    params = dataclasses.asdict(run) | {"keys": list(keys), "scheduled_for": list(scheduled_for)}
    return [r.idempotency_key for r in await db.rows(_Key, "BackfillInsert", params, conn)]


async def uncount_missed(db: Database, *, job_id: uuid.UUID, n: int, conn: Conn) -> None:
    """Take `n` re-opened instants off the job's missed counter."""
    await db.execute("JobMissedUncount", {"id": job_id, "n": n}, conn=conn)
