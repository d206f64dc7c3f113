"""The partition count P: one value, stored in the database (`cronwell_config`), read by
every process. `cronwell partitions set N` changes it online: one transaction moves every
job to `hash(uid) % N` and adjusts the lease rows, while schedulers keep running.

Why no occurrence is lost or repeated across a change: a job's occurrences are keyed by
its uid and nominal instant (the unique key turns a repeat into a no-op) and its cursor
moves only under its row lock, which both a materialiser and the re-partition take; the
partition number only says which scheduler looks at the job, and every partition 0..N-1
has a lease row that a live scheduler acquires within a lease period.
"""

from __future__ import annotations

import logging
import uuid

from cronwell.errors import CronwellError, PartitionMismatch
from cronwell.schedule import partition_of
from cronwell.store import partitions as store_partitions
from cronwell.store.db import Conn, Database

log = logging.getLogger(__name__)

MAX_PARTITIONS = 4096
_PAGE = 5000
_ZERO = uuid.UUID(int=0)


async def read(db: Database, conn: Conn | None = None) -> int:
    """The store's partition count."""
    n = await store_partitions.count(db, conn)
    if n is None:
        raise CronwellError("the store has no partition count: run `cronwell migrate`")
    return n


async def check(db: Database, configured: int | None) -> int:
    """The store's P; refuses a process configured (--partitions, CRONWELL_PARTITIONS) with
    another one, which would otherwise own partitions no job is in (or miss some)."""
    actual = await read(db)
    if configured is not None and configured != actual:
        raise PartitionMismatch(
            f"this process is configured with {configured} partitions but the store uses "
            f"{actual}: remove the setting (the store's count is used), set it to {actual}, "
            f"or change the store's count with `cronwell partitions set {configured}`"
        )
    return actual


async def set_count(db: Database, partitions: int) -> tuple[int, int]:
    """Re-partition online to `partitions`; returns (old P, jobs moved)."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise CronwellError(f"partitions must be between 1 and {MAX_PARTITIONS}, not {partitions}")
    moved = 0
    async with db.transaction() as conn:
        old = await store_partitions.count_locked(db, conn)
        if old is None:
            raise CronwellError("the store has no partition count: run `cronwell migrate`")
        if old == partitions:
            return old, 0
        await store_partitions.set_count(db, partitions=partitions, conn=conn)
        after = _ZERO
        while True:
            page = await store_partitions.job_page(db, after=after, limit=_PAGE, conn=conn)
            if not page:
                break
            ids = [r.id for r in page]
            parts = [partition_of(i, partitions) for i in ids]
            moved += await store_partitions.move_jobs(db, ids=ids, partitions=parts, conn=conn)
            after = ids[-1]
        await store_partitions.ensure_leases(db, partitions=partitions, conn=conn)
        await store_partitions.trim_leases(db, partitions=partitions, conn=conn)
    log.warning(
        "partition count changed",
        extra={"action": "partitions_set", "old": old, "new": partitions, "moved": moved},
    )
    return old, moved
