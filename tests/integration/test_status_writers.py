"""The status change log fills only while a status writer is declared (migration 0014):
without an operator a burst's runs write no change rows; with one declared they are all
logged; and a writer declaring itself after a gap waits for every transaction that decided
not to log, so its resync reads what they changed."""

from __future__ import annotations

import asyncio
import uuid

from cronwell import dispatch
from cronwell.store import status_changes
from cronwell.store.db import Database
from tests.helpers.wait import wait_for

from .helpers import make_job, sql
from .test_maintenance import _past_occurrences

BURST = 40


async def _burst(db: Database, name: str) -> uuid.UUID:
    """A job with BURST due occurrences, all claimed and completed: the job's id."""
    job = await make_job(db, name, schedule="0 0 1 1 *", concurrencyPolicy="Allow")
    await _past_occurrences(db, job.id, BURST)
    claimed = await dispatch.claim(db, pool="default", worker_id="w", limit=BURST, lease_seconds=60)
    assert len(claimed) == BURST
    assert len(await dispatch.succeed(db, [(c.id, c.fence) for c in claimed])) == BURST
    return job.id


async def _logged(db: Database, job_id: uuid.UUID) -> list[str | None]:
    rows = await sql(
        db,
        "SELECT state FROM cronwell_status_changes WHERE job_id = %s ORDER BY id",
        job_id,
    )
    return [r["state"] for r in rows]


async def test_without_a_writer_a_bursts_runs_log_no_status_changes(db: Database) -> None:
    job_id = await _burst(db, "alone")
    assert await _logged(db, job_id) == []


async def test_with_a_writer_declared_every_start_and_end_is_logged(db: Database) -> None:
    await status_changes.declare_writer(db, identity="op-1", ttl_seconds=30, after_gap=True)
    job_id = await _burst(db, "watched")
    logged = await _logged(db, job_id)
    assert logged.count("running") == BURST and logged.count("succeeded") == BURST
    assert len(logged) == 2 * BURST + 1  # and the job's creation


async def test_an_expired_or_withdrawn_declaration_logs_nothing(db: Database) -> None:
    await status_changes.declare_writer(db, identity="dead", ttl_seconds=30, after_gap=True)
    await sql(db, "UPDATE cronwell_status_writers SET expires_at = now() - interval '1 s'")
    await status_changes.declare_writer(db, identity="gone", ttl_seconds=30, after_gap=True)
    await status_changes.retire_writer(db, identity="gone")
    job_id = await _burst(db, "expired")
    assert await _logged(db, job_id) == []


async def _declared(db: Database) -> bool:
    return bool(await sql(db, "SELECT 1 FROM cronwell_status_writers"))


async def test_a_declaration_after_a_gap_waits_for_the_transactions_that_logged_nothing(
    db: Database,
) -> None:
    job = await make_job(db, "gap", schedule="0 0 1 1 *", concurrencyPolicy="Allow")
    await _past_occurrences(db, job.id, 1)
    other = (await make_job(db, "other", schedule="0 0 1 1 *")).id
    await _past_occurrences(db, other, 1)
    async with db.transaction() as conn:
        # A change with no writer declared (not logged), its transaction still open.
        await conn.execute(
            "UPDATE cronwell_occurrences SET state = 'cancelled' WHERE job_id = %s", (job.id,)
        )
        declaring = asyncio.create_task(
            status_changes.declare_writer(db, identity="late", ttl_seconds=30, after_gap=True)
        )
        await wait_for(lambda: _declared(db), what="the declaration committed")
        # Declared, yet not returned: that change is not in the store for a resync to read.
        # (A bounded look for a return that cannot come while the transaction is open.)
        done, _ = await asyncio.wait([declaring], timeout=1.0)
        assert not done
        # Meanwhile other writes go on (none waits for a lock) and are logged.
        await sql(db, "UPDATE cronwell_occurrences SET state = 'dead' WHERE job_id = %s", other)
        assert await _logged(db, other) == ["dead"]
    await declaring  # once that transaction is over: its change is in the store to resync
    assert await _logged(db, job.id) == []
    # and from now on, every change is logged
    await sql(db, "UPDATE cronwell_occurrences SET state = 'dead' WHERE job_id = %s", job.id)
    assert await _logged(db, job.id) == ["dead"]


async def test_a_transaction_left_open_bounds_the_gap_wait_and_is_reported(
    db: Database,
) -> None:
    """A transaction that logged nothing and stays open (a paused process) holds the
    declaration only for its wait bound: it returns with that transaction named, and
    `gap_holders` says when it ended (the writer then resyncs again)."""
    job = await make_job(db, "stuck", schedule="0 0 1 1 *", concurrencyPolicy="Allow")
    await _past_occurrences(db, job.id, 1)
    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE cronwell_occurrences SET state = 'cancelled' WHERE job_id = %s", (job.id,)
        )
        async with asyncio.timeout(20):
            _, open_ = await status_changes.declare_writer(
                db, identity="bounded", ttl_seconds=30, after_gap=True, wait_seconds=0.5
            )
        assert len(open_) == 1
        assert await status_changes.gap_holders(db, open_) == open_
    assert await status_changes.gap_holders(db, open_) == []
