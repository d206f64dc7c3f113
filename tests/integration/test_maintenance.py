"""Housekeeping on a real PostgreSQL: history limits and retention keep the tables bounded
while status totals stay totals; deaths by lease expiry count like any other; every
completion path promotes the next buffered occurrence."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from cronwell import dispatch, jobs, maintenance
from cronwell.metrics import Metrics
from cronwell.models import ScheduledJobSpec
from cronwell.scheduler import Scheduler
from cronwell.sdk import Context
from cronwell.settings import SchedulerSettings
from cronwell.store import claims, dead, prescales, status_changes
from cronwell.store.db import Database
from tests.helpers.store import fail_dead

from .helpers import make_job, occurrences, scheduler, set_cursor, sql


async def _past_occurrences(db: Database, job_id: uuid.UUID, n: int) -> None:
    """n pending occurrences of a job at past instants (as if materialised earlier)."""
    await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, "
        "run_at, state, overlap, delivery, max_attempts, timeout_seconds) "
        "SELECT %s || ':' || g, %s, 'default', now() - g * interval '1 minute', "
        "now() - g * interval '1 minute', 'pending', 'Allow', 'AtLeastOnce', 1, 60 "
        "FROM generate_series(1, %s) g",
        str(job_id),
        job_id,
        n,
    )


async def _status(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    (row,) = await status_changes.job_status(db, [job_id])
    return asdict(row)


async def _pruner(db: Database, **kw: Any) -> maintenance.Pruner:
    kw.setdefault("retention_seconds", 7 * 86400)
    return maintenance.Pruner(db, batch_rows=2, batch_jobs=1, **kw)


async def test_history_limits_keep_the_newest_runs_and_totals_stay_totals(db: Database) -> None:
    job = await make_job(
        db,
        "hist",
        schedule="0 0 1 1 *",
        successfulJobsHistoryLimit=2,
        failedJobsHistoryLimit=1,
        retry={"maxAttempts": 1},
    )
    other = await make_job(db, "other", schedule="0 0 1 1 *", successfulJobsHistoryLimit=5)
    await _past_occurrences(db, job.id, 7)
    await _past_occurrences(db, other.id, 3)
    claimed = await dispatch.claim(db, pool="default", worker_id="w", limit=50, lease_seconds=60)
    mine = sorted((c for c in claimed if c.job_id == job.id), key=lambda c: c.scheduled_for)
    assert len(mine) == 7
    for c in mine[:3]:  # the three oldest die
        assert await fail_dead(db, c.key, c.fence, "AttemptsExhausted") == "dead"
    done = [(c.id, c.fence) for c in claimed if c not in mine[:3]]
    assert len(await dispatch.succeed(db, done)) == 4 + 3
    before = await _status(db, job.id)

    res = await (await _pruner(db)).prune_once()

    assert res.history == 2 + 2  # 4 succeeded -> 2 kept, 3 dead -> 1 kept
    left = await occurrences(db, "hist")
    assert sorted(o["state"] for o in left) == ["dead", "succeeded", "succeeded"]
    newest = sorted((c.scheduled_for for c in mine), reverse=True)
    assert {o["scheduled_for"] for o in left if o["state"] == "succeeded"} == set(newest[:2])
    assert [o["scheduled_for"] for o in left if o["state"] == "dead"] == [mine[2].scheduled_for]
    assert len(await occurrences(db, "other")) == 3  # within its own limits
    # the attempts of pruned occurrences went with them
    keys = {o["idempotency_key"] for o in left}
    attempts = await sql(
        db,
        "SELECT a.idempotency_key FROM cronwell_attempts a JOIN cronwell_occurrences o "
        "ON o.id = a.occurrence_id WHERE o.job_id = %s",
        job.id,
    )
    assert {a["idempotency_key"] for a in attempts} == keys
    orphans = await sql(
        db,
        "SELECT count(*) AS n FROM cronwell_attempts "
        "WHERE NOT EXISTS (SELECT 1 FROM cronwell_occurrences o WHERE o.id = occurrence_id)",
    )
    assert orphans[0]["n"] == 0
    # status totals are totals: pruning history does not make them go down
    after = await _status(db, job.id)
    assert (after["succeeded"], after["dead"], after["failed"]) == (4, 3, 3)
    assert {k: after[k] for k in ("succeeded", "dead", "failed", "last_error")} == {
        k: before[k] for k in ("succeeded", "dead", "failed", "last_error")
    }
    # a second pass has nothing left to do
    assert (await (await _pruner(db)).prune_once()).history == 0


async def test_history_limits_rank_a_run_settled_ahead_of_its_instant_once_it_comes(
    db: Database,
) -> None:
    """A pass ranks the instants before its start (its statements then leave the partitions
    created ahead out of their plans): a run skipped ahead of its instant is not counted
    yet, so the pass keeps more, never fewer; the first pass after its instant ranks it."""
    job = await make_job(db, "ahead", schedule="0 0 1 1 *", failedJobsHistoryLimit=1)
    await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
        " run_at, state, reason, finished_at, overlap, delivery, max_attempts,"
        " timeout_seconds) SELECT %s || ':' || g, %s, 'default', now() + g * interval '2 s',"
        " now() + g * interval '2 s', 'skipped', 'Overlap', now(), 'Skip', 'AtLeastOnce', 1,"
        " 60 FROM unnest(array[-2, -1, 1]) g",
        str(job.id),
        job.id,
    )
    (future,) = [o for o in await occurrences(db, "ahead") if o["idempotency_key"].endswith(":1")]

    assert (await (await _pruner(db)).prune_once()).history == 1  # the older past one
    left = await occurrences(db, "ahead")
    assert sorted(o["idempotency_key"].rsplit(":", 1)[1] for o in left) == ["-1", "1"]

    await asyncio.sleep(max(0.0, (future["scheduled_for"] - datetime.now(UTC)).total_seconds()))
    await asyncio.sleep(0.2)
    assert (await (await _pruner(db)).prune_once()).history == 1
    assert [o["idempotency_key"] for o in await occurrences(db, "ahead")] == [
        future["idempotency_key"]
    ]


async def test_retention_prunes_deleted_and_one_shot_jobs_only(db: Database) -> None:
    live = await make_job(db, "live", schedule="0 0 1 1 *")
    gone = await make_job(db, "gone", schedule="0 0 1 1 *")
    once = await make_job(db, "once", runAt="2020-01-01T00:00:00Z")
    for j in (live, gone, once):
        await _past_occurrences(db, j.id, 2)
    claimed = await dispatch.claim(db, pool="default", worker_id="w", limit=50, lease_seconds=60)
    assert len(await dispatch.succeed(db, [(c.id, c.fence) for c in claimed])) == 6
    await jobs.delete_job(db, namespace="default", name="gone")
    # everything finished 8 days ago; the tombstone is as old
    await sql(db, "UPDATE cronwell_occurrences SET finished_at = now() - interval '8 days'")
    await sql(
        db, "UPDATE cronwell_jobs SET deleted_at = now() - interval '8 days' WHERE id = %s", gone.id
    )

    res = await (await _pruner(db, retention_seconds=7 * 86400)).prune_once()

    assert res.retention == 4 and res.jobs == 1
    assert len(await occurrences(db, "live")) == 2  # a live recurring job: its limits rule
    assert await occurrences(db, "once") == []
    ids = {r["id"] for r in await sql(db, "SELECT id FROM cronwell_jobs")}
    assert ids == {live.id, once.id}
    await sql(db, "UPDATE cronwell_occurrences SET finished_at = now() - interval '8 days'")
    # younger than the retention: kept
    assert (await (await _pruner(db, retention_seconds=9 * 86400)).prune_once()).retention == 0


async def test_retention_prunes_the_pre_scalers_history(db: Database) -> None:
    now = datetime.now(UTC)
    for days in (10, 9, 8, 1):
        at = now - timedelta(days=days)
        await prescales.record(
            db, prescales.PreScaleRecord("ops", "burst", "burst", at, 5, at, None, None)
        )

    res = await (await _pruner(db, retention_seconds=7 * 86400)).prune_once()

    assert res.other == 3  # in batches of 2
    left = await sql(db, "SELECT scaled_at FROM cronwell_prescales")
    assert [r["scaled_at"] for r in left] == [now - timedelta(days=1)]


async def _attempt_keys(db: Database) -> list[str]:
    """Keys of all attempt rows, whether their occurrence still exists or not."""
    rows = await sql(db, "SELECT idempotency_key FROM cronwell_attempts ORDER BY id")
    return [r["idempotency_key"] for r in rows]


async def test_deleting_occurrences_deletes_their_attempts(db: Database) -> None:
    """Attempts have no foreign key to their occurrence (0007: its per-row check was the
    costliest part of a completion); a statement trigger deletes them with it. Every
    delete path that meets occurrences with attempts leaves none behind: history limits,
    retention, the dead-letter purge, and a plain DELETE."""
    keep = await make_job(db, "keep", schedule="0 0 1 1 *", successfulJobsHistoryLimit=1)
    gone = await make_job(db, "gone", schedule="0 0 1 1 *")
    dlq = await make_job(db, "dlq", schedule="0 0 1 1 *", retry={"maxAttempts": 1})
    for j in (keep, gone, dlq):
        await _past_occurrences(db, j.id, 2)
    claimed = await dispatch.claim(db, pool="default", worker_id="w", limit=50, lease_seconds=60)
    assert len(claimed) == 6
    for c in claimed:
        if c.job_id == dlq.id:
            assert await fail_dead(db, c.key, c.fence) == "dead"
    assert len(await dispatch.succeed(db, [(c.id, c.fence) for c in claimed])) == 4
    assert sorted(await _attempt_keys(db)) == sorted(c.key for c in claimed)
    await jobs.delete_job(db, namespace="default", name="gone")
    await sql(
        db,
        "UPDATE cronwell_occurrences SET finished_at = now() - interval '8 days' "
        "WHERE job_id = ANY(%s)",
        [gone.id, dlq.id],
    )

    res = await (await _pruner(db)).prune_once()  # history limits, then retention

    assert (res.history, res.retention) == (1, 2)
    left = {o["idempotency_key"] for o in await occurrences(db)}
    assert len(left) == 3  # keep's newest, dlq's two dead
    assert sorted(await _attempt_keys(db)) == sorted(left)

    purged = await dead.purge(db, older_than_seconds=86400, namespace="default", name="dlq")
    assert len(purged) == 2
    (newest,) = {o["idempotency_key"] for o in await occurrences(db)}
    assert await _attempt_keys(db) == [newest]

    await sql(db, "DELETE FROM cronwell_occurrences")
    assert await _attempt_keys(db) == []


async def test_a_death_by_lease_expiry_counts_toward_suspend_after_failures(db: Database) -> None:
    job = await make_job(
        db, "fragile", schedule="0 0 1 1 *", suspendAfterFailures=1, retry={"maxAttempts": 1}
    )
    await _past_occurrences(db, job.id, 1)
    assert await dispatch.claim(db, pool="default", worker_id="w", limit=5, lease_seconds=60)
    await sql(db, "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 s'")

    m = Metrics()
    s = Scheduler(db, SchedulerSettings(), metrics=m)

    assert await s.reaper.reap_once() == 1

    (o,) = await occurrences(db, "fragile")
    assert (o["state"], o["reason"]) == ("dead", "AttemptsExhausted")
    sample = m.registry.get_sample_value
    assert sample("cronwell_occurrences_total", {"pool": "default", "outcome": "dead"}) == 1
    st = await _status(db, job.id)
    assert st["consecutive_failures"] == 1
    assert st["suspended"] and st["suspended_reason"] == "SuspendedAfterFailures"
    assert (st["dead"], st["failed"]) == (1, 1)


async def test_a_running_scheduler_starts_its_reaper(db: Database) -> None:
    """Reaping runs as the scheduler's own task (maintenance.Reaper): an expired lease is
    reaped while the scheduler runs, with nobody calling reap_once."""
    job = await make_job(db, "abandoned", schedule="0 0 1 1 *", retry={"maxAttempts": 1})
    await _past_occurrences(db, job.id, 1)
    assert await dispatch.claim(db, pool="default", worker_id="w", limit=5, lease_seconds=60)
    await sql(db, "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 s'")
    s = await scheduler(db, tick_seconds=0.2)
    run = asyncio.create_task(s.run())
    try:
        for _ in range(300):
            (o,) = await occurrences(db, "abandoned")
            if o["state"] != "running" or run.done():
                break
            await asyncio.sleep(0.1)
    finally:
        s.stop()
        await run
    assert (o["state"], o["reason"]) == ("dead", "AttemptsExhausted")
    assert (
        s.metrics.registry.get_sample_value("cronwell_leases_reaped_total", {"state": "dead"}) == 1
    )


async def test_ctx_transaction_promotes_the_next_waiting_occurrence(db: Database) -> None:
    await make_job(db, "buf", schedule="* * * * * *", concurrencyPolicy="BufferOne")
    await set_cursor(db, "buf", "date_trunc('second', now()) - interval '2 s'")
    s = await scheduler(db, horizon_seconds=0.001)
    await s.materialise_until_idle()
    (c,) = await dispatch.claim(db, pool="default", worker_id="w", limit=10, lease_seconds=30)
    states = [o["state"] for o in await occurrences(db, "buf")]
    assert states[0] == "running" and "waiting" in states
    ctx = Context.for_claim(c, db)

    async with ctx.transaction():
        pass  # the handler's effect would be written here

    states = [o["state"] for o in await occurrences(db, "buf")]
    assert states[0] == "succeeded"
    assert "waiting" not in states and "pending" in states, states


async def test_concurrent_applies_of_a_new_name_create_it_once(db_url: str) -> None:
    """Eight processes' worth of `cronwell apply` of the same new names at once (each with
    its own open connection): each name is created once, the others see it, no error."""
    spec = ScheduledJobSpec.model_validate({"schedule": "0 0 1 1 *", "target": {"log": {}}})
    dbs = [Database(db_url, min_size=1, max_size=1) for _ in range(8)]
    for d in dbs:
        await d.open()
    try:
        for round_ in range(5):
            name = f"race{round_}"
            results = await asyncio.gather(
                *(jobs.apply_job(d, namespace="default", name=name, spec=spec) for d in dbs),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert not errors, errors
            actions = sorted(r.action for r in results if isinstance(r, jobs.Applied))
            assert actions == ["created"] + ["unchanged"] * 7
            assert len({r.id for r in results if isinstance(r, jobs.Applied)}) == 1
    finally:
        for d in dbs:
            await d.close()


async def test_status_change_reads_skip_jobs_that_back_off(db: Database) -> None:
    """The status writer's read skips jobs backing off after failed writes, so their rows
    (however many) never hide the rows of other jobs behind them."""
    stuck = await make_job(db, "stuck", schedule="0 0 1 1 *")
    fine = await make_job(db, "fine", schedule="0 0 1 1 *")
    await sql(db, "DELETE FROM cronwell_status_changes")
    await sql(
        db,
        "INSERT INTO cronwell_status_changes (job_id) "
        "SELECT %s FROM generate_series(1, 10) UNION ALL SELECT %s",
        stuck.id,
        fine.id,
    )
    head = await status_changes.read(db, limit=5, skip=[])
    assert {r.job_id for r in head} == {stuck.id}
    rows = await status_changes.read(db, limit=5, skip=[stuck.id])
    assert [r.job_id for r in rows] == [fine.id]


async def test_a_claim_batch_beyond_the_lock_tables_share_is_warned_of_at_start(
    db: Database, caplog: Any
) -> None:
    """One advisory lock per serialised job a claim decides: a batch larger than the slots
    this process's connections bring (max_locks_per_transaction each) gets a warning that
    says what to raise; one within them gets none."""
    per_connection = await claims.lock_slots_per_connection(db)
    share = per_connection * db.pool.max_size
    caplog.set_level("WARNING", logger="cronwell.maintenance")
    await maintenance.announce_lock_table(db, share)
    assert not [r for r in caplog.records if getattr(r, "action", None) == "lock_table_small"]
    await maintenance.announce_lock_table(db, share + 1)
    (warned,) = [r for r in caplog.records if getattr(r, "action", None) == "lock_table_small"]
    assert warned.claim_batch_size == share + 1
    assert warned.max_locks_per_transaction == per_connection
    needed = -(-(share + 1) // db.pool.max_size)
    assert f"raise max_locks_per_transaction to at least {needed}" in warned.getMessage()
