"""Read models of the web dashboard (`cronwell ui`): what a page shows, read-only, one
keyset-paginated query per view (the dashboard never writes except through the existing
store functions it reuses).

`namespaces` is what the viewer may see (None: every namespace, the dashboard without
authentication); it goes into the query, so a page is filtered before its LIMIT."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from cronwell.store import gauges, runs
from cronwell.store.db import Database, row_class
from cronwell.store.dead import Dead


@row_class
class JobRow:
    """A live job as the jobs page lists it."""

    namespace: str
    name: str
    pool: str
    spec: dict[str, Any]
    labels: dict[str, str]
    next_run_at: datetime | None
    suspended: bool
    recent: list[str]
    """States of the last 20 due occurrences, oldest first."""
    last_state: str | None
    """State of the latest finished occurrence."""
    last_run_at: datetime | None
    """When its latest run finished (success or failure), from the job's counters."""


RUN_STATES = ("pending", "waiting", "running", "succeeded", "dead", "skipped", "missed",
              "cancelled")  # fmt: skip
"""An occurrence's states (the CHECK of cronwell_occurrences.state): the runs' `?state=`."""
JOB_STATES = ("suspended", "active", "failing", "late")
JOB_SORTS = {"name": "UiJobPageByName", "next_run": "UiJobPageByNextRun",
             "last_run": "UiJobPageByLastRun"}  # fmt: skip
"""`?sort=` values and their queries: one per order, so each pages on its own index."""


@row_class
class JobCursor:
    """Where a jobs page starts: after this job in the sort's order. `key` is the sort
    key as PostgreSQL text ('infinity' for no next run, '-infinity' for never run), None
    for the name order."""

    namespace: str
    name: str
    key: str | None = None


async def job_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    pool: str | None,
    text: str | None,
    state: str | None = None,
    labels: dict[str, str] | None = None,
    sort: str = "name",
    after: JobCursor | None,
    limit: int,
) -> list[JobRow]:
    """Up to `limit` live jobs after the cursor in the `sort` order (JOB_SORTS)."""
    return await db.rows(
        JobRow,
        JOB_SORTS[sort],
        {
            "namespaces": namespaces,
            "namespace": namespace,
            "pool": pool,
            "text": text,
            "state": state,
            "labels": json.dumps(labels) if labels else None,
            "after_ns": after.namespace if after else None,
            "after_name": after.name if after else None,
            "after_key": after.key if after else None,
            "limit": limit,
        },
    )


@row_class
class JobDetail:
    """A live job as its own page shows it."""

    id: uuid.UUID
    namespace: str
    name: str
    pool: str
    spec: dict[str, Any]
    next_run_at: datetime | None
    suspended: bool
    suspended_reason: str | None


async def job_get(db: Database, *, namespace: str, name: str) -> JobDetail | None:
    """The live job `namespace`/`name`, if any."""
    return await db.row(JobDetail, "UiJobGet", {"namespace": namespace, "name": name})


@row_class
class RunRow:
    """An occurrence as the runs page lists it (`id` is the keyset cursor's tie-break)."""

    id: int
    namespace: str
    name: str
    time_zone: str | None
    """The job's zone (spec.timeZone; None: UTC)."""
    idempotency_key: str
    scheduled_for: datetime
    pool: str
    state: str
    attempt: int
    fence: int | None
    last_error: str | None
    jitter_seconds: Decimal
    lag_seconds: Decimal | None
    duration_seconds: Decimal | None


async def run_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    name: str | None,
    state: str | None,
    pool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: tuple[datetime, int] | None,
    limit: int,
) -> list[RunRow]:
    """Up to `limit` occurrences older than the (scheduled_for, id) cursor, newest first,
    nominally scheduled in [since, until) when given."""

    async def page(of: str | None) -> list[RunRow]:
        return await db.rows(
            RunRow,
            "UiRunPage",
            {
                "namespaces": namespaces,
                "namespace": namespace,
                "name": name,
                "state": state,
                "pool": of,
                "since": since,
                "until": until,
                "after_at": after[0] if after else None,
                "after_id": after[1] if after else None,
                "limit": limit,
            },
        )

    return await runs.newest_first(db, page, pool=pool, name=name, state=state, limit=limit)


LAG_EDGES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Start-lag bucket edges in seconds: bucket 0 is below 50 ms, the last is a minute or more."""


@row_class
class LagHistogram:
    """A job's start lags over a window: runs started, p50/p99 (None without runs) and
    the count per LAG_EDGES bucket (len(LAG_EDGES) + 1 of them)."""

    runs: int
    p50: float | None
    p99: float | None
    buckets: list[int]


async def lag_histogram(db: Database, *, job_id: uuid.UUID, window_seconds: int) -> LagHistogram:
    """The start-lag histogram of one job's runs scheduled in the last `window_seconds`."""
    found = await db.row(
        LagHistogram,
        "UiJobLagHistogram",
        {"job_id": job_id, "window_seconds": window_seconds, "edges": list(LAG_EDGES)},
    )
    assert found is not None  # an aggregate always returns its row
    return found


@row_class
class DeadRow(Dead):
    """A dead letter as the dashboard lists it: with its job's zone (None: UTC), where its
    instants are shown when the viewer picks the job's zone."""

    time_zone: str | None = None


async def dead_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    name: str | None,
    limit: int,
) -> list[DeadRow]:
    """Dead occurrences the viewer may see (optionally one namespace / job name), newest first."""
    return await db.rows(
        DeadRow,
        "UiDeadList",
        {"namespaces": namespaces, "namespace": namespace, "name": name, "limit": limit},
    )


async def dead_namespace(db: Database, *, key: str, namespaces: list[str] | None) -> str | None:
    """The namespace of dead occurrence `key` if the viewer may see it: where an action on it
    is authorised."""
    found = await db.scalar("UiDeadNamespace", {"key": key, "namespaces": namespaces})
    return str(found) if found is not None else None


async def namespaces(db: Database) -> list[str]:
    """Namespaces that have jobs (live or deleted): the candidates of per-namespace access."""
    return [str(r["namespace"]) for r in await db.fetch("UiNamespaces")]


EXACT_COUNT_BELOW = 1_000_000
"""Occurrences up to which /status counts every row by state (a few ms per 100k rows);
above, the final states are estimates (a count over 10M rows took seconds)."""


@row_class
class StateCount:
    """Occurrences in one state; `estimate`: from the planner's statistics, not counted."""

    state: str
    n: int
    estimate: bool = False


async def occurrence_counts(
    db: Database, *, exact_below: int = EXACT_COUNT_BELOW
) -> list[StateCount]:
    """Occurrences by state for /status: every row counted on a store of fewer than
    `exact_below` occurrences (or never analysed); on a larger one the live and dead states
    counted and the final ones estimated (UiOccurrenceCounts)."""
    rows = await db.scalar("UiOccurrenceRows")
    if rows is None or rows < exact_below:
        return [StateCount(c.state, c.n) for c in await gauges.occurrence_counts(db)]
    return await db.rows(StateCount, "UiOccurrenceCounts")


BACKLOG_CAP = 10_000
"""Due occurrences counted per pool on /status; beyond, "more than" (a bounded count)."""


@row_class
class Backlog:
    """A pool's occurrences due and not started: how many (at most `BACKLOG_CAP`, `more`
    when there are more) and how late the oldest is."""

    pool: str
    due: int
    more: bool
    oldest_run_at: datetime
    late_seconds: Decimal


async def backlog(db: Database, *, cap: int = BACKLOG_CAP) -> list[Backlog]:
    """Per pool with a backlog, its due-and-not-started count (bounded) and oldest."""
    return await db.rows(Backlog, "UiBacklog", {"cap": cap})


@row_class
class TableSize:
    """One of the store's tables on disk (indexes and TOAST included)."""

    name: str
    bytes: int
    rows_estimate: int | None


async def table_sizes(db: Database) -> list[TableSize]:
    """The store's tables, largest first."""
    return await db.rows(TableSize, "UiTableSizes")


async def oldest_finished(db: Database) -> datetime | None:
    """When the oldest finished occurrence still kept finished (None: none kept)."""
    found: datetime | None = await db.scalar("UiOldestFinished")
    return found
