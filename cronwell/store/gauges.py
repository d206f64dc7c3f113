"""Whole-table counts for the metrics gauges and `cronwell status` (read-only)."""

from __future__ import annotations

from datetime import datetime

from cronwell.store.db import Database, row_class


@row_class
class PoolDepth:
    """Due occurrences not yet started in one pool."""

    pool: str
    n: int


@row_class
class StateCount:
    """Occurrences in one state."""

    state: str
    n: int


@row_class
class Backlog:
    """Status changes not yet written back, and the database clock they were counted at."""

    n: int
    now: datetime


async def queue_depth(db: Database) -> list[PoolDepth]:
    """Due pending occurrences per pool (the leading indicator of an SLA miss)."""
    return await db.rows(PoolDepth, "QueueDepthByPool")


async def jobs_behind(db: Database) -> int:
    """Live jobs whose next instant is over 5 s past and not materialised."""
    n: int = await db.scalar("JobsBehindCount")
    return n


async def dead_count(db: Database) -> int:
    """Dead-lettered occurrences (the DLQ's size)."""
    n: int = await db.scalar("DeadCount")
    return n


async def status_backlog(db: Database) -> Backlog | None:
    """The operator's status write-back backlog, with the database clock."""
    return await db.row(Backlog, "StatusBacklogCount")


async def occurrence_counts(db: Database) -> list[StateCount]:
    """Occurrences by state (`cronwell status`, tests)."""
    return await db.rows(StateCount, "OccurrenceCounts")
