"""The schedulers' partition leases (cronwell_partitions): one holder per partition at a
time; a takeover increments the epoch, which fences the previous holder's writes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from cronwell.store.db import Database, row_class


@row_class
class Lease:
    """A partition held at an epoch."""

    partition: int
    epoch: int


@row_class
class Owner:
    """A lease row as `cronwell status` shows it."""

    partition: int
    holder: str | None
    epoch: int
    expires_at: datetime | None
    live: bool | None


async def renew(
    db: Database, *, holder: str, owned: Mapping[int, int], ttl_seconds: float
) -> list[Lease]:
    """Extend the leases of `owned` (partition → epoch) still held; a missing one was lost."""
    parts = sorted(owned)
    return await db.rows(
        Lease,
        "PartitionRenew",
        {
            "holder": holder,
            "ttl": ttl_seconds,
            "partitions": parts,
            "epochs": [owned[p] for p in parts],
        },
    )


async def acquire(db: Database, *, holder: str, want: int, ttl_seconds: float) -> list[Lease]:
    """Take up to `want` free or expired partitions (a takeover increments the epoch)."""
    return await db.rows(
        Lease, "PartitionAcquire", {"holder": holder, "ttl": ttl_seconds, "want": want}
    )


async def release(db: Database, *, holder: str, partitions: list[int]) -> None:
    """Give up `partitions` so other schedulers need not wait out the lease."""
    await db.execute("PartitionRelease", {"holder": holder, "partitions": partitions})


async def list_all(db: Database) -> list[Owner]:
    """Every partition's lease, in partition order."""
    return await db.rows(Owner, "PartitionList")
