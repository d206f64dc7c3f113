"""Running attempts, fenced per (id, fence) pair (the worker holds the ids from its claims),
or per (idempotency key, fence) for a failure and a re-assertion: heartbeats, starts,
completions, failures, releases, and the reaping of expired leases. Each ending writes its
cronwell_attempts row, which carries its occurrence's instant. Every write is bounded by
`within`, the earliest and latest instant of its rows, so a partitioned history is pruned
to their partitions (ALL_TIME: unknown, prunes nothing)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from cronwell.store.db import Conn, Database, row_class

Within = tuple[datetime, datetime]
"""The earliest and latest instant (scheduled_for) of a write's rows."""

ALL_TIME: Within = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))
"""Bounds of a write whose rows' instants are unknown: pruning nothing."""


@row_class
class Keyed:
    idempotency_key: str


@row_class
class Restored:
    """A claim a re-assertion restored: its row's id and instant now (the row may have been
    materialised again: another id and, for a trigger, another instant)."""

    idempotency_key: str
    id: int
    scheduled_for: datetime


@row_class
class Succeeded:
    """What a fenced completion ended: the keys, and the jobs among them of buffered
    policies."""

    keys: list[str]
    buffered_jobs: list[uuid.UUID]


@row_class
class Failed:
    """An occurrence a fenced failure sent back to pending, or dead."""

    idempotency_key: str
    job_id: uuid.UUID
    overlap: str
    state: str


@row_class
class Reaped:
    """An occurrence whose lease expired: pending again (AtLeastOnce) or dead."""

    idempotency_key: str
    job_id: uuid.UUID
    state: str
    reason: str
    pool: str
    overlap: str
    run_at: datetime


def _pairs(held: Sequence[tuple[int, int]], within: Within) -> dict[str, object]:
    """The (id, fence) pairs as two arrays, and the bounds of their instants."""
    return {
        "ids": [i for i, _ in held],
        "fences": [f for _, f in held],
        "lo": within[0],
        "hi": within[1],
    }


def _ids(
    held: Sequence[tuple[int, int]], starts: Sequence[datetime | None] | None, within: Within
) -> dict[str, object]:
    """The pairs, with each one's start instant (None: none)."""
    at: list[datetime | None] = list(starts) if starts is not None else [None] * len(held)
    return {**_pairs(held, within), "starts": at}


async def heartbeat(
    db: Database,
    running: Sequence[tuple[int, int]],
    *,
    worker_id: str,
    lease_seconds: float,
    within: Within = ALL_TIME,
) -> set[str]:
    """Extend the leases of (id, fence) held by `worker_id`; returns the keys still held."""
    rows = await db.rows(
        Keyed,
        "OccurrenceHeartbeat",
        {**_pairs(running, within), "lease": lease_seconds, "worker_id": worker_id},
    )
    return {r.idempotency_key for r in rows}


async def reassert(
    db: Database,
    held: Sequence[tuple[str, int, int, bool]],
    *,
    worker_id: str,
    lease_seconds: float,
) -> dict[str, Restored]:
    """Restore the claims (key, fence, attempt, started) the store forgot (a failover lost
    them); returns the keys restored, with their rows. Any other key lost its lease."""
    rows = await db.rows(
        Restored,
        "OccurrenceReassert",
        {
            "keys": [k for k, _, _, _ in held],
            "fences": [f for _, f, _, _ in held],
            "attempts": [a for _, _, a, _ in held],
            "started": [s for _, _, _, s in held],
            "worker_id": worker_id,
            "lease": lease_seconds,
        },
    )
    return {r.idempotency_key: r for r in rows}


async def record_starts(
    db: Database,
    started: Sequence[tuple[int, int]],
    starts: Sequence[datetime | None] | None = None,
    *,
    within: Within = ALL_TIME,
) -> set[str]:
    """Record the actual start of (id, fence) claimed ahead, at `starts` (None: now); returns
    the keys still held (one missing lost its lease and must not start)."""
    rows = await db.rows(Keyed, "OccurrenceStartBatch", _ids(started, starts, within))
    return {r.idempotency_key for r in rows}


async def succeed(
    db: Database,
    done: Sequence[tuple[int, int]],
    starts: Sequence[datetime | None] | None = None,
    *,
    buffered: Sequence[str],
    within: Within = ALL_TIME,
    conn: Conn | None = None,
) -> Succeeded:
    """Complete (id, fence) pairs whose fence is current, recording each one's start from
    `starts` if not recorded yet; a stale one completes nothing. `buffered`: the overlap
    policies whose jobs' waiting occurrences a completion promotes."""
    params = {**_ids(done, starts, within), "buffered": list(buffered)}
    (done_,) = await db.rows(Succeeded, "OccurrenceSucceedBatch", params, conn)
    return done_  # an aggregate: always one row


async def fail(
    db: Database,
    *,
    occurrence_id: int,
    fence: int,
    next_state: str,
    reason: str,
    error: str,
    delay_seconds: float,
    outcome: str,
    started: datetime | None = None,
    within: Within = ALL_TIME,
    conn: Conn | None = None,
) -> Failed | None:
    """Fail one attempt (id, fence): pending after `delay_seconds`, or dead; None if the
    fence is stale.
    `started`: its start instant if not recorded yet."""
    return await db.row(
        Failed,
        "OccurrenceFail",
        {
            "id": occurrence_id,
            "fence": fence,
            "next_state": next_state,
            "reason": reason,
            "error": error,
            "delay": delay_seconds,
            "outcome": outcome,
            "started": started,
            "lo": within[0],
            "hi": within[1],
        },
        conn,
    )


async def release(
    db: Database, claimed: Sequence[tuple[int, int]], *, within: Within = ALL_TIME
) -> set[str]:
    """Give back claimed-but-unstarted (id, fence): pending again, attempt not consumed;
    returns the keys released."""
    rows = await db.rows(Keyed, "OccurrenceRelease", _pairs(claimed, within))
    return {r.idempotency_key for r in rows}


async def reap_leases(db: Database, *, limit: int, conn: Conn | None = None) -> list[Reaped]:
    """Up to `limit` expired leases: pending again (never started, or AtLeastOnce) or dead
    (AtMostOnce, attempts exhausted; a death counts toward suspendAfterFailures)."""
    return await db.rows(Reaped, "LeaseReap", {"limit": limit}, conn)
