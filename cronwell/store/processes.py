"""The process registry (cronwell_processes): who is alive, for balancing and `cronwell status`."""

from __future__ import annotations

from datetime import datetime

from cronwell.store.db import Database, row_class


@row_class
class ProcessEntry:
    """What a process says about itself at each heartbeat."""

    id: str
    role: str
    pool: str | None
    hostname: str
    pid: int
    version: str
    concurrency: int | None
    running: int


@row_class
class Process:
    """A registry row as `cronwell status` / `cronwell workers` show it."""

    id: str
    role: str
    pool: str | None
    hostname: str | None
    pid: int | None
    version: str | None
    concurrency: int | None
    running: int
    started_at: datetime
    heartbeat_at: datetime
    live: bool


async def heartbeat(db: Database, entry: ProcessEntry) -> None:
    """Register `entry`, or refresh its heartbeat, load and concurrency."""
    await db.execute(
        "ProcessHeartbeat",
        {
            "id": entry.id,
            "role": entry.role,
            "pool": entry.pool,
            "hostname": entry.hostname,
            "pid": entry.pid,
            "version": entry.version,
            "concurrency": entry.concurrency,
            "running": entry.running,
        },
    )


async def delete(db: Database, process_id: str) -> None:
    """Leave the registry on a clean shutdown."""
    await db.execute("ProcessDelete", {"id": process_id})


async def live_count(
    db: Database, *, role: str, ttl_seconds: float, pool: str | None = None
) -> int:
    """Processes of `role` (in `pool`, if given) that heartbeat within `ttl_seconds`."""
    n: int = await db.scalar("ProcessLiveCount", {"role": role, "ttl": ttl_seconds, "pool": pool})
    return n


async def list_all(db: Database, *, ttl_seconds: float) -> list[Process]:
    """Every registered process, `live` when its heartbeat is within `ttl_seconds`."""
    return await db.rows(Process, "ProcessList", {"ttl": ttl_seconds})


async def prune(db: Database, *, ttl_seconds: float) -> int:
    """Forget processes silent for ten TTLs; returns how many."""
    return await db.execute("ProcessPrune", {"ttl": ttl_seconds})
