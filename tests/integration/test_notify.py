"""The workers' wake-up channel on a real PostgreSQL: a batch's NOTIFY names its pools, and
a lost listening connection is a DatabaseUnavailable (the worker then polls and listens
again), never a psycopg error."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from cronwell import dispatch
from cronwell.errors import DatabaseUnavailable
from cronwell.store import notify
from cronwell.store.db import Database


async def test_a_batch_wakes_the_pools_it_names(db: Database) -> None:
    listening = notify.due_pools(db)
    assert await anext(listening) is None  # listening: anything before was missed
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await dispatch.notify_due(db, conn, [("a", now), ("b", now), ("a", now)])
    pools = await asyncio.wait_for(anext(listening), 10)
    assert sorted(pools or []) == ["a", "b"]
    await listening.aclose()


async def test_a_lost_connection_is_database_unavailable(db: Database) -> None:
    listening = notify.due_pools(db)
    assert await anext(listening) is None
    async with db.connection() as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE '%LISTEN cronwell_due;%' AND datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    with pytest.raises(DatabaseUnavailable):
        await asyncio.wait_for(anext(listening), 10)
