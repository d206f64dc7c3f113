"""The status change log (cronwell_status_changes) and what a job's status shows: the
operator's status writer drains the one into the other."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from cronwell.store.db import Database, row_class

#: How often a writer declared after a gap looks whether the transactions that logged
#: nothing have ended (they are short: a claim or a completion batch).
GAP_POLL_SECONDS = 0.05


@row_class
class StatusChange:
    """A logged change of an occurrence (or of the job row itself: no occurrence_id)."""

    id: int
    job_id: uuid.UUID
    occurrence_id: int | None
    scheduled_for: datetime | None
    state: str | None
    reason: str | None
    attempt: int | None
    error: str | None
    changed_at: datetime


@row_class
class JobStatus:
    """Everything the status of one job shows: totals from its counters, the rest from its
    newest occurrences."""

    id: uuid.UUID
    namespace: str
    name: str
    generation: int
    suspended: bool
    suspended_reason: str | None
    consecutive_failures: int
    missed_total: int
    deleted_at: datetime | None
    next_schedule_time: datetime | None
    schedule_done: bool
    last_schedule_time: datetime | None
    active: int | None
    active_jobs: list[str] | None
    """Names of the Jobs (job targets) the running occurrences run: the newest 10."""
    succeeded: int
    dead: int
    skipped: int
    last_successful_time: datetime | None
    failed: int
    last_failure_time: datetime | None
    last_error: str | None
    last_state: str | None
    last_reason: str | None
    last_key: str | None
    last_state_error: str | None
    last_duration_seconds: Decimal | None


async def read(db: Database, *, limit: int, skip: Sequence[uuid.UUID]) -> list[StatusChange]:
    """The oldest `limit` logged changes, failures first, leaving out jobs in `skip`."""
    return await db.rows(StatusChange, "StatusChangesRead", {"limit": limit, "skip": skip})


async def read_failures(
    db: Database, *, limit: int, skip: Sequence[uuid.UUID], seen: Sequence[int]
) -> list[StatusChange]:
    """Failures (dead letters, failed attempts) logged that are not in `seen`."""
    return await db.rows(
        StatusChange,
        "StatusChangesReadFailures",
        {"limit": limit, "skip": skip, "seen": list(seen)},
    )


async def delete(db: Database, ids: Sequence[int]) -> None:
    """Forget logged changes once the status they led to is written (or its CR is gone)."""
    await db.execute("StatusChangesDelete", {"ids": ids})


async def job_status(db: Database, job_ids: Sequence[uuid.UUID]) -> list[JobStatus]:
    """The status facts of these jobs (one row per job found)."""
    return await db.rows(JobStatus, "JobStatusBatch", {"ids": job_ids})


async def declare_writer(
    db: Database,
    *,
    identity: str,
    ttl_seconds: float,
    after_gap: bool,
    wait_seconds: float | None = None,
) -> tuple[datetime, list[str]]:
    """Declare a status writer until the returned instant: the store logs status changes
    only while one is declared. `after_gap`: logging may have been off, so then wait for
    every transaction that had logged nothing to end (the writer resyncs what they changed),
    at most `wait_seconds` (default: the declaration's ttl): a transaction held open by a
    paused process must not stall the writer for good. Returns the ones still open then
    (`gap_holders` says when they end: the writer resyncs again)."""
    until: datetime = await db.scalar(
        "StatusWriterDeclare", {"identity": identity, "ttl": ttl_seconds}
    )
    if not after_gap:
        return until, []
    deadline = time.monotonic() + (ttl_seconds if wait_seconds is None else wait_seconds)
    holders = await gap_holders(db)
    while holders and time.monotonic() < deadline:
        await asyncio.sleep(GAP_POLL_SECONDS)
        holders = await gap_holders(db, holders)
    return until, holders


async def gap_holders(db: Database, among: list[str] | None = None) -> list[str]:
    """The transactions (of `among`, or all) still holding the no-writer lock: each logged
    nothing and has not ended."""
    holders: list[str] = await db.scalar("StatusWriterGapHolders", {"among": among})
    return holders


async def retire_writer(db: Database, *, identity: str) -> None:
    """Withdraw a writer's declaration (clean stop): nothing is logged for it any more."""
    await db.execute("StatusWriterRetire", {"identity": identity})
