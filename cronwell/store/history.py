"""Pruning (cronwell/maintenance.py): history limits and retention in bounded batches, each
statement its own short transaction over finished rows only."""

from __future__ import annotations

import uuid
from datetime import datetime

from cronwell.store.db import Database, row_class


@row_class
class LimitPruned:
    """One HistoryLimitPrune batch: the last job examined (None: the sweep is over) and the
    occurrences deleted."""

    last_job: uuid.UUID | None
    deleted: int


async def limit_prune(
    db: Database, *, after: uuid.UUID, jobs: int, limit: int, until: datetime
) -> LimitPruned:
    """Apply the history limits of the `jobs` jobs after `after` (uid order), deleting at
    most `limit` occurrences beyond them; `until`: ranking only instants before it (see
    the query)."""
    row = await db.row(
        LimitPruned,
        "HistoryLimitPrune",
        {"after": after, "jobs": jobs, "limit": limit, "until": until},
    )
    return row or LimitPruned(None, 0)


async def retention_prune(db: Database, *, retention_seconds: float, limit: int) -> int:
    """Delete up to `limit` finished occurrences of deleted and one-shot jobs older than the
    retention; returns how many."""
    return await db.execute(
        "HistoryRetentionPrune", {"retention": retention_seconds, "limit": limit}
    )


async def tombstones_purge(db: Database, *, retention_seconds: float, limit: int) -> int:
    """Forget up to `limit` jobs deleted longer than the retention ago with no history left."""
    n: int | None = await db.scalar(
        "JobTombstonePurge", {"retention": retention_seconds, "limit": limit}
    )
    return int(n or 0)


async def status_changes_prune(db: Database, *, retention_seconds: float, limit: int) -> int:
    """Delete up to `limit` status change rows older than the retention."""
    return await db.execute("StatusChangesPrune", {"retention": retention_seconds, "limit": limit})


async def outbox_published_prune(db: Database, *, retention_seconds: float, limit: int) -> int:
    """Delete up to `limit` outbox messages published longer than the retention ago."""
    return await db.execute(
        "OutboxPublishedPrune", {"retention": retention_seconds, "limit": limit}
    )
