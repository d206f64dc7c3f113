"""Fences: the epoch every fence carries (migration 0008) and fenced writes to users'
resources (cronwell_fences: a stale writer is refused); what a commit's durability is."""

from __future__ import annotations

import logging

from cronwell.errors import DatabaseError, DatabaseUnavailable
from cronwell.store.db import Conn, Database, row_class

log = logging.getLogger(__name__)


async def write(db: Database, *, resource: str, fence: int, conn: Conn | None = None) -> bool:
    """Accept `fence` for `resource` unless a higher one was already; False: stale writer."""
    return bool(await db.execute("FenceWrite", {"resource": resource, "fence": fence}, conn))


async def identify(db: Database) -> int | None:
    """Record the cluster's identity; on another cluster, move to the next generation.
    Returns the new generation when it moved. A role that may not read pg_control_system()
    (some managed services) skips the check: a logical restore then needs `cronwell db
    new-generation`, as docs/deploy.md says."""
    try:
        gen = await db.scalar("StoreIdentify")
    except DatabaseUnavailable:
        raise
    except DatabaseError as e:
        log.warning(
            f"cannot read the cluster's identity ({e}); after restoring the store on another "
            "cluster run `cronwell db new-generation`",
            extra={"action": "store_identify_skipped"},
        )
        return None
    return None if gen is None else int(gen)


async def next_generation(db: Database) -> int:
    return int(await db.scalar("StoreGenerationNext"))


@row_class
class Epoch:
    generation: int
    timeline: int
    base: int


async def epoch(db: Database) -> Epoch | None:
    """The primary's (a standby has no current WAL position, and issues no fence)."""
    return await db.primary.row(Epoch, "FenceEpoch")


@row_class
class Durability:
    standby_names: str
    synchronous_commit: str
    standbys: int
    sync_standbys: int

    @property
    def synchronous(self) -> bool:
        """Whether an acknowledged commit is on a standby too (a failover loses nothing)."""
        return bool(self.standby_names.strip()) and self.synchronous_commit in (
            "on",
            "remote_write",
            "remote_apply",
        )

    def describe(self) -> str:
        if self.synchronous:
            return (
                f"synchronous: commits wait for a standby ({self.standby_names}, "
                f"synchronous_commit={self.synchronous_commit}; {self.sync_standbys} of "
                f"{self.standbys} connected standbys synchronous): a failover loses nothing"
            )
        seen = f"{self.standbys} connected" if self.standbys else "none visible to this role"
        return (
            f"asynchronous (standbys: {seen}): a failover can lose the last commits; an "
            "occurrence may then run again under the same key and a higher fence, never "
            "under a reused fence"
        )


async def durability(db: Database) -> Durability:
    """The primary's: its settings and the standbys it streams to decide what a commit is."""
    row = await db.primary.row(Durability, "ReplicationDurability")
    assert row is not None  # one row, always
    return row
