"""The database clock: every scheduling decision reads it, never a process's wall clock."""

from __future__ import annotations

from datetime import datetime

from cronwell.store.db import Conn, Database


async def now(db: Database, conn: Conn | None = None) -> datetime:
    """PostgreSQL's now() (the transaction's start when `conn` is in a transaction); the
    primary's, also for a caller reading off a replica: one clock for every decision."""
    value: datetime = await db.primary.scalar("ClockNow", conn=conn)
    return value
