"""The pre-scaler's history (cronwell_prescales, migration 0012): each scale-up ahead of a
burst and, once seen, when its pods were Ready. A WorkerPool's status.lastPreScale keeps
only the latest; the dashboard's forecast shows these, after the fact."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

import psycopg

from cronwell.errors import DatabaseError
from cronwell.store.db import Database, row_class


@row_class
class PreScaleRecord:
    """One pre-scale of a WorkerPool, as its status.lastPreScale reports it."""

    namespace: str
    workerpool: str
    pool: str
    scaled_at: datetime
    replicas: int
    burst_at: datetime | None
    ready_at: datetime | None
    """When the planned replicas were first seen Ready (None: not yet, or never)."""
    landed_before_burst: bool | None
    """Ready before the burst (None: not known yet)."""


@row_class
class RecentPreScale(PreScaleRecord):
    """A recorded pre-scale with the lead it achieved: burst - Ready in seconds, negative
    when late (None while either is unknown)."""

    lead_seconds: float | None


async def record(db: Database, pre: PreScaleRecord) -> None:
    """Insert the pre-scale, or update what became known of it (idempotent: a leader
    writing it again, or a new one reading it back from status, changes nothing else).
    Any refusal (a role without INSERT on the table, a trigger) is a DatabaseError: the
    history is the scaler's side line, which it logs and retries, never a bug to stop on."""
    try:
        await db.execute("PreScaleRecord", asdict(pre))
    except psycopg.Error as e:
        raise DatabaseError(f"pre-scale not recorded: {e}") from e


async def recent(
    db: Database, *, within_seconds: float, per_pool: int, pool: str | None = None
) -> list[RecentPreScale]:
    """The newest `per_pool` pre-scales of each pool (or only `pool`'s) made in the last
    `within_seconds`, by pool then newest first."""
    return await db.rows(
        RecentPreScale,
        "PreScaleRecent",
        {"within": within_seconds, "per_pool": per_pool, "pool": pool},
    )


async def prune(db: Database, *, retention_seconds: float, limit: int) -> int:
    """Delete up to `limit` pre-scales made longer than the retention ago; returns how many."""
    return await db.execute("PreScalePrune", {"retention": retention_seconds, "limit": limit})
