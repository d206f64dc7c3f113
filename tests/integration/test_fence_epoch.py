"""Fences never repeat, even when the store forgets (invariant 8): a fence carries an epoch
(generation and timeline, migration 0008) above every earlier one, and every fenced batch
matches each (key, fence) pair, never a set of fences across the batch."""

from __future__ import annotations

from cronwell import dispatch
from cronwell.dispatch import Claimed
from cronwell.store import claims, fences
from cronwell.store.db import Database

from .helpers import sql
from .worker_helpers import handler_job, occurrence, trigger

COUNTER_BITS = 40


async def claim(db: Database, name: str) -> Claimed:
    await handler_job(db, name, "t-wait-event")
    key = await trigger(db, name)
    (row,) = await sql(db, "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s", key)
    oid = row["id"]
    (started,) = await claims.start(db, [oid], worker_id="w", lease_seconds=60)
    return dispatch.claimed_from_row(started)


async def test_a_fence_carries_the_epoch_of_generation_and_timeline(db: Database) -> None:
    epoch = await fences.epoch(db)
    assert epoch is not None
    assert (epoch.generation, epoch.timeline) == (0, 1)  # a fresh cluster, never promoted
    c = await claim(db, "a")
    assert c.fence >> COUNTER_BITS == epoch.generation * 16384 + epoch.timeline
    assert c.fence > epoch.base


async def test_fences_stay_above_those_a_forgetful_store_handed_out(db: Database) -> None:
    """The counter goes back (as on a standby that missed the last claims); a fence issued
    under the next epoch is still above every fence issued before."""
    before = await claim(db, "before")
    await sql(db, "SELECT setval('cronwell_fence', 1, false)")  # the store forgot
    assert await fences.next_generation(db) == 1
    after = await claim(db, "after")
    assert after.fence > before.fence
    assert after.fence & ((1 << COUNTER_BITS) - 1) == 1  # the counter did repeat


async def test_a_store_on_another_cluster_moves_to_the_next_generation(db: Database) -> None:
    assert await fences.identify(db) is None  # migrate recorded this cluster already
    await sql(db, "UPDATE cronwell_store SET system_identifier = 42")  # restored elsewhere
    assert await fences.identify(db) == 1
    assert await fences.identify(db) is None
    epoch = await fences.epoch(db)
    assert epoch is not None and epoch.generation == 1


async def test_a_batch_is_fenced_per_key_never_by_the_set_of_its_fences(db: Database) -> None:
    """Two running attempts, each batch statement given both keys with their fences
    swapped: each key's fence is in the batch, but not its own, so nothing matches."""
    a, b = await claim(db, "a"), await claim(db, "b")
    swapped = [(a.key, b.fence), (b.key, a.fence)]
    assert await dispatch.heartbeat(db, worker_id="w", running=swapped, lease_seconds=60) == set()
    assert await dispatch.record_starts(db, swapped) == set()
    assert await dispatch.succeed(db, swapped) == set()
    assert await dispatch.release(db, swapped) == set()
    for c in (a, b):
        assert (await occurrence(db, c.key))["state"] == "running"
    own = [(a.key, a.fence), (b.key, b.fence)]
    assert await dispatch.heartbeat(db, worker_id="w", running=own, lease_seconds=60) == {
        a.key,
        b.key,
    }
    assert await dispatch.succeed(db, own) == {a.key, b.key}
