"""The process registry (cronwell_processes): who is alive, for balancing and `cronwell status`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cronwell.store.db import Database, row_class

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


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


async def live_count(db: Database, *, role: str, ttl_seconds: float) -> int:
    """Processes of `role` that heartbeat within `ttl_seconds`."""
    n: int = await db.scalar("ProcessLiveCount", {"role": role, "ttl": ttl_seconds})
    return n


@row_class
class _PoolView:
    n: int
    bursts: dict[str, int] | None


async def pool_view(
    db: Database,
    *,
    worker_id: str,
    pool: str,
    ttl_seconds: float,
    publish: dict[datetime, int] | None,
) -> tuple[int, dict[datetime, int]]:
    """The pool's live workers and the most occurrences any of them has seen due at each
    coming instant; `publish`: this worker's own view, written first (None: unchanged)."""

    def key(t: datetime) -> str:
        return str((t - _EPOCH) // _MICROSECOND)

    bursts = None if publish is None else json.dumps({key(t): n for t, n in publish.items()})
    params = {"id": worker_id, "pool": pool, "ttl": ttl_seconds, "bursts": bursts}
    (view,) = await db.rows(_PoolView, "ProcessPoolView", params)
    seen = {_EPOCH + int(k) * _MICROSECOND: int(n) for k, n in (view.bursts or {}).items()}
    return view.n, seen


async def list_all(db: Database, *, ttl_seconds: float) -> list[Process]:
    """Every registered process, `live` when its heartbeat is within `ttl_seconds`."""
    return await db.rows(Process, "ProcessList", {"ttl": ttl_seconds})


async def prune(db: Database, *, ttl_seconds: float) -> int:
    """Forget processes silent for ten TTLs; returns how many."""
    return await db.execute("ProcessPrune", {"ttl": ttl_seconds})
