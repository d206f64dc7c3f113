"""Fences never repeat, even when the store forgets (invariant 8): a fence carries an epoch
(generation and timeline, migration 0008) above every earlier one, and every fenced batch
matches each (key, fence) pair, never a set of fences across the batch."""

from __future__ import annotations

import asyncio

from cronwell import dispatch
from cronwell.dispatch import Claimed
from cronwell.store import claims, fences
from cronwell.store.attempts import Restored
from cronwell.store.db import Database
from tests.helpers.wait import wait_for

from .helpers import sql
from .worker_helpers import (
    CONTROL,
    attempts,
    handler_job,
    occurrence,
    running_worker,
    started,
    trigger,
)

COUNTER_BITS = 40


async def claim(db: Database, name: str) -> Claimed:
    await handler_job(db, name, "t-wait-event")
    key = await trigger(db, name)
    (row,) = await sql(db, "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s", key)
    oid = row["id"]
    (started,) = await claims.start(
        db, [oid], worker_id="w", lease_seconds=60, row=dispatch.Claimed
    )
    return dispatch.arrived(started)


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
    """Two running attempts, each batch statement given both ids with their fences
    swapped: each fence is in the batch, but not its own, so nothing matches."""
    a, b = await claim(db, "a"), await claim(db, "b")
    swapped = [(a.id, b.fence), (b.id, a.fence)]
    assert await dispatch.heartbeat(db, worker_id="w", running=swapped, lease_seconds=60) == set()
    assert await dispatch.record_starts(db, swapped) == set()
    assert await dispatch.succeed(db, swapped) == set()
    assert await dispatch.release(db, swapped) == set()
    for c in (a, b):
        assert (await occurrence(db, c.key))["state"] == "running"
    own = [(a.id, a.fence), (b.id, b.fence)]
    assert await dispatch.heartbeat(db, worker_id="w", running=own, lease_seconds=60) == {
        a.key,
        b.key,
    }
    assert await dispatch.succeed(db, own) == {a.key, b.key}


async def test_a_stale_pair_records_nothing_while_the_rest_of_its_batch_lands(
    db: Database,
) -> None:
    """One batch of starts, then of completions, by (id, fence): the pair with a stale
    fence (its lease was taken over) records nothing; the others land."""
    a, b, c = await claim(db, "a"), await claim(db, "b"), await claim(db, "c")
    await sql(db, "UPDATE cronwell_occurrences SET started_at = NULL")  # as if claimed ahead
    batch = [(a.id, a.fence), (b.id, b.fence - 1), (c.id, c.fence)]
    assert await dispatch.record_starts(db, batch) == {a.key, c.key}
    assert (await occurrence(db, b.key))["started_at"] is None
    assert await dispatch.succeed(db, batch) == {a.key, c.key}
    assert [(await occurrence(db, x.key))["state"] for x in (a, b, c)] == [
        "succeeded",
        "running",
        "succeeded",
    ]
    assert [len(await attempts(db, x.key)) for x in (a, b, c)] == [1, 0, 1]


async def forget(db: Database, c: Claimed, *, fence: int | None) -> None:
    """What a new primary that missed the claim's commit shows: pending, an older fence.
    Not due for an hour: no claim races the re-assertion here (in a real failover either
    may win; a claim that does re-runs the occurrence under a higher fence)."""
    await sql(
        db,
        "UPDATE cronwell_occurrences SET state = 'pending', fence = %s, attempt = 0,"
        " worker_id = NULL, lease_expires_at = NULL, started_at = NULL, claimed_at = NULL,"
        " run_at = now() + interval '1 hour' WHERE idempotency_key = %s",
        fence,
        c.key,
    )


async def test_a_claim_the_store_forgot_is_reasserted_as_it_was(db: Database) -> None:
    """The attempt ran under (fence, attempt 1); the store lost the claim. The worker's
    re-assertion restores it, so its completion records the attempt that ran, and its
    attempt number does not rewind."""
    c = await claim(db, "forgotten")
    await forget(db, c, fence=None)
    assert await dispatch.succeed(db, [(c.id, c.fence)]) == set()  # as a stale worker...
    held = [(c.key, c.fence, c.attempt, True)]
    (back,) = (await dispatch.reassert(db, worker_id="w", held=held, lease_seconds=60)).items()
    assert back == (c.key, Restored(c.key, c.id, c.scheduled_for))
    o = await occurrence(db, c.key)
    assert (o["state"], o["fence"], o["attempt"], o["worker_id"]) == ("running", c.fence, 1, "w")
    assert o["started_at"] is not None
    assert await dispatch.succeed(db, [(c.id, c.fence)]) == {c.key}


async def test_a_claim_whose_row_was_materialised_again_completes_by_its_new_id(
    db: Database,
) -> None:
    """The failover lost the occurrence's materialisation too: the scheduler made its row
    again, same key, another id. The re-assertion finds it by key and says its id; the
    completion by the claim's id matches nothing, by that id it lands."""
    c = await claim(db, "again")
    await forget(db, c, fence=None)
    (row,) = await sql(
        db, "UPDATE cronwell_occurrences SET id = DEFAULT WHERE id = %s RETURNING id", c.id
    )
    assert row["id"] != c.id
    held = [(c.key, c.fence, c.attempt, True)]
    back = await dispatch.reassert(db, worker_id="w", held=held, lease_seconds=60)
    assert back == {c.key: Restored(c.key, row["id"], c.scheduled_for)}
    assert await dispatch.succeed(db, [(c.id, c.fence)]) == set()
    assert await dispatch.succeed(db, [(back[c.key].id, c.fence)]) == {c.key}


async def test_a_lost_lease_is_never_reasserted(db: Database) -> None:
    """A higher fence (claimed since), a running or a finished occurrence: nothing to
    restore, the worker's lease is lost as ever."""
    newer = await claim(db, "newer")
    await forget(db, newer, fence=newer.fence + 1)  # claimed since, then pending again
    running = await claim(db, "running")
    done = await claim(db, "done")
    assert await dispatch.succeed(db, [(done.id, done.fence)]) == {done.key}
    held = [(c.key, c.fence - 1, c.attempt, True) for c in (running, done)]
    held.append((newer.key, newer.fence, newer.attempt, True))
    assert await dispatch.reassert(db, worker_id="w", held=held, lease_seconds=60) == {}
    assert (await occurrence(db, newer.key))["state"] == "pending"
    assert (await occurrence(db, running.key))["fence"] == running.fence


async def test_a_worker_records_its_attempt_after_the_store_forgot_its_claim(
    db: Database, db_url: str
) -> None:
    """Mid-attempt the store forgets the claim (a failover lost it); the worker's fenced
    writes find it pending under no fence, re-assert it, and the success recorded is the
    attempt that ran: its fence, attempt 1, no second run."""
    await handler_job(db, "amnesia", "t-wait-event")
    async with running_worker(db_url, lease_seconds=30) as w:
        key = await trigger(db, "amnesia")
        mark = await started(key)
        c = w.worker.running[key].claimed
        await forget(db, c, fence=None)
        CONTROL[key].set()
        assert (await w.outcome(key)).result == "succeeded"
    o = await occurrence(db, key)
    assert (o["state"], o["fence"], o["attempt"]) == ("succeeded", mark["fence"], 1)
    assert [(a["attempt"], a["fence"], a["outcome"]) for a in await attempts(db, key)] == [
        (1, mark["fence"], "succeeded")
    ]


async def test_a_worker_keeps_a_claim_whose_row_was_materialised_again_at_another_instant(
    db: Database, db_url: str
) -> None:
    """The failover lost a trigger's materialisation too: it was made again under the same
    key, another id and a later instant (a trigger's is its insertion time). The worker's
    heartbeat re-asserts it once, and its later heartbeats and its completion go by the new
    row's id and instant: the lease is held to the end and the attempt that ran succeeds
    (by the claim's instant, the next heartbeat found nothing, could not re-assert a claim
    already restored, and cancelled the attempt)."""
    await handler_job(db, "moved", "t-wait-event")
    async with running_worker(db_url, lease_seconds=1.5) as w:
        key = await trigger(db, "moved")
        mark = await started(key)
        c = w.worker.running[key].claimed
        await forget(db, c, fence=None)
        (row,) = await sql(
            db,
            "UPDATE cronwell_occurrences SET id = DEFAULT,"
            " scheduled_for = scheduled_for + interval '3 seconds'"
            " WHERE id = %s RETURNING id, scheduled_for",
            c.id,
        )
        # Heartbeats every 0.5 s: the re-assertion, then several by the moved row.
        await wait_for(lambda: _restored(db, key), 5.0, "the claim re-asserted")
        await asyncio.sleep(2.0)
        assert key in w.worker.running and w.worker.running[key].abort is None
        CONTROL[key].set()
        assert (await w.outcome(key)).result == "succeeded"
    (o,) = await sql(
        db,
        "SELECT id, scheduled_for, state, fence, attempt FROM cronwell_occurrences"
        " WHERE idempotency_key = %s",
        key,
    )
    assert (o["id"], o["scheduled_for"]) == (row["id"], row["scheduled_for"])
    assert (o["state"], o["fence"], o["attempt"]) == ("succeeded", mark["fence"], 1)


async def _restored(db: Database, key: str) -> bool | None:
    o = await occurrence(db, key)
    return True if o["state"] == "running" else None
