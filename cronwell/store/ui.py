"""Read models of the web dashboard (`cronwell ui`): what a page shows, read-only, one
keyset-paginated query per view (the dashboard never writes except through the existing
store functions it reuses)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronwell.store.db import Database


@dataclass(frozen=True, slots=True)
class JobRow:
    """A live job as the jobs page lists it."""

    namespace: str
    name: str
    pool: str
    spec: dict[str, Any]
    next_run_at: datetime | None
    suspended: bool


async def job_page(
    db: Database,
    *,
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
