"""Read models of the web dashboard (`cronwell ui`): what a page shows, read-only, one
keyset-paginated query per view (the dashboard never writes except through the existing
store functions it reuses).

`namespaces` is what the viewer may see (None: every namespace, the dashboard without
authentication); it goes into the query, so a page is filtered before its LIMIT."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from cronwell.store.db import Database
from cronwell.store.dead import Dead


@dataclass(frozen=True, slots=True)
class JobRow:
    """A live job as the jobs page lists it."""

    namespace: str
    name: str
    pool: str
    spec: dict[str, Any]
    next_run_at: datetime | None
    suspended: bool
    recent: list[str]
    """States of the last 20 due occurrences, oldest first."""
    last_state: str | None
    """State of the latest finished occurrence."""


async def job_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    pool: str | None,
    text: str | None,
    after: tuple[str, str] | None,
    limit: int,
) -> list[JobRow]:
    """Up to `limit` live jobs after the (namespace, name) cursor, in that order."""
    return await db.rows(
        JobRow,
        "UiJobPage",
        {
            "namespaces": namespaces,
            "namespace": namespace,
            "pool": pool,
            "text": text,
            "after_ns": after[0] if after else None,
            "after_name": after[1] if after else None,
            "limit": limit,
        },
    )


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class RunRow:
    """An occurrence as the runs page lists it (`id` is the keyset cursor's tie-break)."""

    id: int
    namespace: str
    name: str
    idempotency_key: str
    scheduled_for: datetime
    state: str
    attempt: int
    fence: int | None
    last_error: str | None
    lag_seconds: Decimal | None
    duration_seconds: Decimal | None


async def run_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    name: str | None,
    state: str | None,
    after: tuple[datetime, int] | None,
    limit: int,
) -> list[RunRow]:
    """Up to `limit` occurrences older than the (scheduled_for, id) cursor, newest first."""
    return await db.rows(
        RunRow,
        "UiRunPage",
        {
            "namespaces": namespaces,
            "namespace": namespace,
            "name": name,
            "state": state,
            "after_at": after[0] if after else None,
            "after_id": after[1] if after else None,
            "limit": limit,
        },
    )


async def dead_page(
    db: Database,
    *,
    namespaces: list[str] | None,
    namespace: str | None,
    name: str | None,
    limit: int,
) -> list[Dead]:
    """Dead occurrences the viewer may see (optionally one namespace / job name), newest first."""
    return await db.rows(
        Dead,
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
