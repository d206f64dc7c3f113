"""The dead-letter queue: occurrences in state `dead`, listed, replayed (same key) or purged."""

from __future__ import annotations

from datetime import datetime

import psycopg

from cronwell.store.db import Conn, Database, row_class


@row_class
class Dead:
    """A dead-lettered occurrence with its reason and last error."""

    namespace: str
    name: str
    idempotency_key: str
    scheduled_for: datetime
    state: str
    reason: str | None
    last_error: str | None
    attempt: int
    max_attempts: int
    fence: int | None
    delivery: str
    origin: str
    started_at: datetime | None
    finished_at: datetime | None


@row_class
class Replayed:
    """A dead occurrence pending again: when, in which pool, and its new attempt budget."""

    idempotency_key: str
    pool: str
    run_at: datetime
    attempt: int
    max_attempts: int


@row_class
class Purged:
    idempotency_key: str


@row_class
class DeadCount:
    """Dead occurrences matching a filter, and how many of them a replay (without
    include_ambiguous) would take: what a bulk action is confirmed against."""

    total: int
    replayable: int


class CountChanged(Exception):
    """A bulk action would have touched a different number of dead occurrences than the
    user confirmed (it was rolled back)."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(f"{found} dead occurrence(s) match now, not {expected}")
        self.expected, self.found = expected, found


async def list_dead(
    db: Database, *, namespace: str | None, name: str | None, limit: int
) -> list[Dead]:
    """Dead occurrences (optionally of one namespace / job name), newest first."""
    return await db.rows(Dead, "DeadList", {"namespace": namespace, "name": name, "limit": limit})


async def replay(
    db: Database,
    *,
    key: str | None,
    namespace: str | None,
    name: str | None,
    include_ambiguous: bool,
    conn: Conn | None = None,
) -> list[Replayed]:
    """Dead occurrences (one key, or a job's, or all) back to pending under the same key;
    Ambiguous ones only with `include_ambiguous`, never those of deleted jobs."""
    return await db.rows(
        Replayed,
        "DeadReplay",
        {
            "key": key,
            "namespace": namespace,
            "name": name,
            "include_ambiguous": include_ambiguous,
        },
        conn,
    )


async def purge(
    db: Database,
    *,
    older_than_seconds: float,
    namespace: str | None,
    name: str | None,
    dry_run: bool = False,
) -> list[str]:
    """Delete dead occurrences finished more than `older_than_seconds` ago; their keys.

    With `dry_run` the delete is rolled back: the keys are those it would delete."""
    async with db.transaction() as conn:
        rows = await db.rows(
            Purged,
            "DeadPurge",
            {"older_than": older_than_seconds, "namespace": namespace, "name": name},
            conn,
        )
        if dry_run:
            raise psycopg.Rollback()
    return [r.idempotency_key for r in rows]


async def count(db: Database, *, namespace: str | None, name: str | None) -> DeadCount:
    """How many dead occurrences match (and how many of them are replayable)."""
    got = await db.row(DeadCount, "DeadMatchCount", {"namespace": namespace, "name": name})
    return got or DeadCount(0, 0)


async def discard(
    db: Database,
    *,
    key: str | None,
    namespace: str | None,
    name: str | None,
    expect: int | None = None,
) -> list[str]:
    """Delete dead occurrences (one key, or all matching the filter) whatever their age,
    with their attempts, as the purge does; their keys. With `expect`, a different count
    rolls the delete back and raises CountChanged (the set changed since it was confirmed)."""
    async with db.transaction() as conn:
        rows = await db.rows(
            Purged, "DeadDiscard", {"key": key, "namespace": namespace, "name": name}, conn
        )
        if expect is not None and len(rows) != expect:
            raise CountChanged(expect, len(rows))
    return [r.idempotency_key for r in rows]
