"""Materialisation, the scheduler's hot path: one transaction per batch claims the due jobs of
an owned partition, inserts their occurrences and advances their cursors (three statements,
the batches as array parameters)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from cronwell.store.db import Conn, Database, row_class


@row_class
class DueJob:
    """A due job claimed (locked) for this batch; `db_now` is the transaction's clock."""

    id: uuid.UUID
    spec_hash: str
    """Its spec's content hash: equal hashes are equal specs (claims.specs reads one)."""
    pool: str
    next_run_at: datetime
    resumed_at: datetime | None
    db_now: datetime


@dataclass(slots=True)
class NewOccurrences:
    """The occurrences a batch materialises, one list per column (one array parameter each)."""

    keys: list[str] = field(default_factory=list)
    job_ids: list[uuid.UUID] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    scheduled_for: list[datetime] = field(default_factory=list)
    run_at: list[datetime] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    reasons: list[str | None] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    deliveries: list[str] = field(default_factory=list)
    max_attempts: list[int] = field(default_factory=list)
    timeouts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Advances:
    """Each processed job's new cursor (None: nothing left) and its missed instants."""

    ids: list[uuid.UUID] = field(default_factory=list)
    next_run_at: list[datetime | None] = field(default_factory=list)
    missed: list[int] = field(default_factory=list)


async def claim_due(
    db: Database,
    *,
    holder: str,
    partition: int,
    epoch: int,
    horizon_seconds: float,
    limit: int,
    conn: Conn,
) -> list[DueJob]:
    """Lock up to `limit` jobs of `partition` due within the horizon, oldest first, while
    `holder` owns the partition at `epoch` (none otherwise)."""
    return await db.rows(
        DueJob,
        "JobDueClaim",
        {
            "holder": holder,
            "partition": partition,
            "epoch": epoch,
            "horizon": horizon_seconds,
            "limit": limit,
        },
        conn,
    )


async def insert_occurrences(db: Database, occ: NewOccurrences, *, conn: Conn) -> None:
    """Insert a batch's occurrences; keys that exist already are left alone."""
    await db.execute("OccurrenceInsertBatch", _columns(occ), conn=conn)


async def advance(db: Database, adv: Advances, *, conn: Conn) -> None:
    """Move each job's cursor and add its missed instants to its counter."""
    await db.execute("JobAdvanceBatch", _columns(adv), conn=conn)


def _columns(batch: NewOccurrences | Advances) -> dict[str, list[Any]]:
    """The batch's lists as the query's array parameters (named like the fields)."""
    return {f.name: getattr(batch, f.name) for f in fields(batch)}
