"""The partition count P (cronwell_config), each job's partition, and the lease rows 0..P-1
that exist for it; `cronwell.partitions` changes P online with these in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cronwell.store.db import Conn, Database, row_class


@row_class
class JobPartition:
    """A job's uid and the partition it is in."""

    id: uuid.UUID
    partition: int


async def init_count(db: Database, *, partitions: int, conn: Conn | None = None) -> None:
    """Store P for a new store; a store that has one keeps it."""
    await db.execute("ConfigPartitionsInit", {"partitions": partitions}, conn=conn)


async def count(db: Database, conn: Conn | None = None) -> int | None:
    """The stored P (None before `cronwell migrate`)."""
    n: int | None = await db.scalar("ConfigPartitionsGet", conn=conn)
    return n


async def count_shared(db: Database, conn: Conn) -> int | None:
    """P, read-locked for a job insert: a concurrent re-partition waits, then sees the job."""
    n: int | None = await db.scalar("ConfigPartitionsShare", conn=conn)
    return n


async def count_locked(db: Database, conn: Conn) -> int | None:
    """P, locked for a re-partition: inserts of new jobs wait until it commits."""
    n: int | None = await db.scalar("ConfigPartitionsLock", conn=conn)
    return n


async def set_count(db: Database, *, partitions: int, conn: Conn) -> None:
    """Store a new P (in the re-partition's transaction, after `count_locked`)."""
    await db.execute("ConfigPartitionsSet", {"partitions": partitions}, conn=conn)


async def job_page(
    db: Database, *, after: uuid.UUID, limit: int, conn: Conn | None = None
) -> list[JobPartition]:
    """Up to `limit` jobs with a uid above `after`, in uid order (a re-partition's page)."""
    return await db.rows(JobPartition, "JobPartitionList", {"after": after, "limit": limit}, conn)


async def move_jobs(
    db: Database, *, ids: Sequence[uuid.UUID], partitions: Sequence[int], conn: Conn
) -> int:
    """Put each job of `ids` in the partition at the same index; returns how many moved."""
    return await db.execute(
        "JobPartitionSetBatch", {"ids": list(ids), "partitions": list(partitions)}, conn=conn
    )


async def ensure_leases(db: Database, *, partitions: int, conn: Conn | None = None) -> None:
    """Create the lease rows 0..partitions-1 that are missing."""
    await db.execute("PartitionEnsure", {"partitions": partitions}, conn=conn)


async def trim_leases(db: Database, *, partitions: int, conn: Conn | None = None) -> None:
    """Drop the lease rows of partitions at or above `partitions` (P was reduced)."""
    await db.execute("PartitionTrim", {"partitions": partitions}, conn=conn)
