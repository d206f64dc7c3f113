"""Fenced writes to users' resources (cronwell_fences): a stale writer is refused."""

from __future__ import annotations

from cronwell.store.db import Conn, Database


async def write(db: Database, *, resource: str, fence: int, conn: Conn | None = None) -> bool:
    """Accept `fence` for `resource` unless a higher one was already; False: stale writer."""
    return bool(await db.execute("FenceWrite", {"resource": resource, "fence": fence}, conn))
