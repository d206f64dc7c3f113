"""Occurrence history as people read it: `runs` listings, one occurrence and its attempts."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Protocol, TypeVar

from cronwell.store.db import Database, row_class

RARE_STATES = frozenset({"skipped", "missed", "cancelled"})
"""The states of cronwell_occurrences_rare (migration 0010): their runs newest first are a
range of that index, read in one query whatever the pool."""


class _Listed(Protocol):
    @property
    def scheduled_for(self) -> datetime: ...
    @property
    def id(self) -> int: ...


L = TypeVar("L", bound=_Listed)


@row_class
class _Pool:
    pool: str


async def newest_first(
    db: Database,
    page: Callable[[str | None], Awaitable[list[L]]],
    *,
    pool: str | None,
    name: str | None,
    state: str | None,
    limit: int,
) -> list[L]:
    """A listing's `limit` newest runs (scheduled_for, id descending), `page(pool)` being
    one query of them in that order. One query when an index reads them in order (a
    pool's, a job's, a rare state's); else every pool's page merged: no index holds every
    run newest first (migration 0017: it cost each state change an index entry), and the
    newest `limit` of all are among the newest `limit` of their pool."""
    if pool is not None or name is not None or state in RARE_STATES:
        return await page(pool)
    pools = await db.rows(_Pool, "RunPools")
    pages = await asyncio.gather(*(page(p.pool) for p in pools))
    return heapq.nlargest(
        limit, itertools.chain.from_iterable(pages), key=lambda r: (r.scheduled_for, r.id)
    )


@row_class
class Run:
    """An occurrence of a `runs` listing, with its jitter, lag and duration.

    Lag is measured from run_at (the jittered instant), so a job with 5 s of jitter does
    not read as 5 s late; jitter_seconds is run_at minus the nominal instant. id orders
    runs of the same instant."""

    id: int
    namespace: str
    name: str
    idempotency_key: str
    scheduled_for: datetime
    run_at: datetime
    state: str
    reason: str | None
    origin: str
    attempt: int
    fence: int | None
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    jitter_seconds: Decimal
    lag_seconds: Decimal | None
    duration_seconds: Decimal | None


@row_class
class Occurrence:
    """One occurrence with everything `dlq show` prints, and whether its job is deleted."""

    namespace: str
    name: str
    job_deleted_at: datetime | None
    idempotency_key: str
    job_id: uuid.UUID
    pool: str
    scheduled_for: datetime
    run_at: datetime
    state: str
    reason: str | None
    last_error: str | None
    origin: str
    overlap: str
    delivery: str
    attempt: int
    max_attempts: int
    fence: int | None
    worker_id: str | None
    lease_expires_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime


@row_class
class Attempt:
    """One recorded attempt of a key."""

    attempt: int
    fence: int
    worker_id: str | None
    outcome: str
    error: str | None
    started_at: datetime | None
    finished_at: datetime


async def list_runs(
    db: Database, *, namespace: str | None, name: str | None, state: str | None, limit: int
) -> list[Run]:
    """Recent occurrences, optionally of one namespace / job name / state, newest first."""

    async def page(pool: str | None) -> list[Run]:
        params = {"namespace": namespace, "name": name, "state": state, "pool": pool}
        return await db.rows(Run, "RunsList", params | {"limit": limit})

    return await newest_first(db, page, pool=None, name=name, state=state, limit=limit)


async def list_for_job(
    db: Database, *, job_id: uuid.UUID, state: str | None, limit: int
) -> list[Run]:
    """Recent occurrences of the job with uid `job_id` (the kubectl plugin), newest first."""
    return await db.rows(Run, "RunsListForJob", {"job_id": job_id, "state": state, "limit": limit})


async def get(db: Database, key: str) -> Occurrence | None:
    """The occurrence with idempotency key `key`, if any."""
    return await db.row(Occurrence, "OccurrenceGet", {"key": key})


async def attempts(db: Database, key: str) -> list[Attempt]:
    """Every recorded attempt of `key`, in order (fences strictly increase along it)."""
    return await db.rows(Attempt, "AttemptList", {"key": key})
