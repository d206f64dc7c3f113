"""Materialisation ahead of time, partition leases and misfires on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import timedelta

import pytest

from cronwell import jobs, liveness, partitions, schedule
from cronwell.models import ScheduledJobSpec
from cronwell.scheduler import MATERIALISATION, Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database

from .helpers import db_now, make_job, occurrences, scheduler, set_cursor, sql


async def test_materialises_ahead_with_identity_keys(db: Database) -> None:
    job = await make_job(db, "tick", schedule="*/10 * * * * *")
    s = await scheduler(db, horizon_seconds=30)
    assert await s.materialise_until_idle() == 1
    # Its first instant within a second: visited near first, the rest at the next pass.
    assert await s.materialise_until_idle() in (0, 1)
    occ = await occurrences(db, "tick")
    now = await db_now(db)
    # every 10 s, past half the horizon (to the job's phase) and within it
    assert 1 <= len(occ) <= 4
    assert max(o["scheduled_for"] for o in occ) > now + timedelta(seconds=5)
    for o in occ:
        assert o["idempotency_key"] == schedule.occurrence_key(job.id, o["scheduled_for"])
        assert o["state"] == "pending" and o["run_at"] == o["scheduled_for"]
        assert o["scheduled_for"] <= now + timedelta(seconds=30)
    # nothing more is due until the cursor comes within the horizon again
    assert await s.materialise_until_idle() == 0


async def test_a_job_is_visited_at_half_the_horizon_and_materialised_past_it(
    db: Database,
) -> None:
    """A per-second job is visited (locked, read, updated) when its next instant comes
    within half the horizon, not every second; a visit materialises it past that line (to
    its phase, plan.visit_reach) and never beyond the horizon (what a pause leaves to
    run)."""
    await make_job(db, "fast", schedule="* * * * * *")
    s = await scheduler(db, horizon_seconds=10, tick_seconds=1)
    for cursor in (None, "now() + interval '4 seconds'"):
        if cursor is not None:
            await set_cursor(db, "fast", cursor)
        assert await s.materialise_until_idle() == 1
        now = await db_now(db)
        last = max(o["scheduled_for"] for o in await occurrences(db, "fast"))
        assert now + timedelta(seconds=3.5) < last <= now + timedelta(seconds=10)
    await set_cursor(db, "fast", "now() + interval '6 seconds'")
    assert await s.materialise_until_idle() == 0  # visited every second before


async def test_new_jobs_get_their_next_seconds_before_any_job_gets_the_rest_of_its_horizon(
    db: Database,
) -> None:
    """300 new per-second jobs at a 30 s horizon, 100 a batch: every job's next seconds are
    inserted before any job's farther ones (an occurrence's id is its insertion order),
    and its revisit takes each to its phase, past the visit line. A job at a time, the
    first batch's 15-30 s of each came before the last batch's next second (10,000 jobs:
    220,000 rows first, the workers 2-5 s behind from the start)."""
    for i in range(300):
        await make_job(db, f"s{i}", schedule="* * * * * *")
    await sql(db, "UPDATE cronwell_jobs SET next_run_at = date_trunc('second', now())")
    t0 = await db_now(db)
    s = await scheduler(db, horizon_seconds=30, batch_size=100)
    visits = await s.materialise_until_idle()
    visits += await s.materialise_until_idle()  # the revisits of a batch not full: next pass
    rows = await sql(
        db,
        "SELECT max(id) FILTER (WHERE scheduled_for < %s) AS near_last,"
        " min(id) FILTER (WHERE scheduled_for > %s) AS far_first,"
        " count(DISTINCT job_id) FILTER (WHERE scheduled_for < %s) AS near_jobs"
        " FROM cronwell_occurrences",
        t0 + timedelta(seconds=3),
        t0 + timedelta(seconds=10),
        t0 + timedelta(seconds=3),
    )
    assert rows[0]["near_jobs"] == 300
    assert rows[0]["near_last"] < rows[0]["far_first"]
    assert visits == 600  # each twice: near first, then to its phase
    now = await db_now(db)
    reached = await sql(
        db,
        "SELECT min(m) AS least FROM (SELECT max(scheduled_for) AS m FROM"
        " cronwell_occurrences GROUP BY job_id) t",
    )
    assert reached[0]["least"] > now + timedelta(seconds=14)  # past the visit line (15 s)


async def test_rematerialisation_is_a_no_op(db: Database) -> None:
    """If a cursor is set back (a crash, a restore), the unique key absorbs the repeat."""
    await make_job(db, "tick", schedule="*/10 * * * * *")
    s = await scheduler(db)
    await s.materialise_until_idle()
    before = await occurrences(db, "tick")
    await set_cursor(db, "tick", f"'{before[0]['scheduled_for'].isoformat()}'::timestamptz")
    assert await s.materialise_until_idle() == 1
    assert [o["id"] for o in await occurrences(db, "tick")] == [o["id"] for o in before]


async def test_concurrent_materialisers_create_each_occurrence_once(db: Database) -> None:
    """8 materialisers race over 3,000 due jobs: SKIP LOCKED splits them, each job is
    processed by exactly one, and each occurrence exists once."""
    async with db.connection() as conn:
        await conn.execute(
            """
            INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,
                                       next_run_at)
            SELECT gen_random_uuid(), 'default', 'bulk' || i, %s::jsonb, 'h', 'default', 0,
                   date_trunc('second', now()) + interval '5 seconds'
            FROM generate_series(1, 3000) i""",
            (
                json.dumps(
                    jobs.spec_document(
                        ScheduledJobSpec.model_validate(
                            {"schedule": "0 0 1 1 *", "target": {"log": {}}}
                        )
                    )
                ),
            ),
        )
    s0 = await scheduler(db, batch_size=97)
    racers = [Scheduler(db, s0.settings, holder=s0.holder) for _ in range(8)]
    for r in racers:
        r.owned = dict(s0.owned)
    counts = await asyncio.gather(*(r.materialise_until_idle() for r in racers))
    assert sum(counts) == 3000
    assert sum(1 for c in counts if c) >= 2  # they really raced
    occ = await occurrences(db)
    assert len(occ) == 3000 == len({o["idempotency_key"] for o in occ})


async def test_partitions_balance_and_fence(db: Database) -> None:
    settings = SchedulerSettings(partition_lease_seconds=1.5)
    await partitions.set_count(db, 8)
    a, b = Scheduler(db, settings, holder="a"), Scheduler(db, settings, holder="b")
    await a.balance()
    assert len(a.owned) == 8
    await b.balance()  # b registers; target is now 4 each
    await a.balance()
    await b.balance()
    assert len(a.owned) == 4 and len(b.owned) == 4 and not set(a.owned) & set(b.owned)
    # a stops renewing (a pause, a kill -9): b takes over after the lease, epochs increase
    old = dict(a.owned)
    await asyncio.sleep(1.7)
    await b.balance()
    assert len(b.owned) == 8
    assert all(b.owned[p] == old[p] + 1 for p in old)
    # a's stale claim at its old epochs materialises nothing, even for due jobs
    await make_job(db, "due", schedule="* * * * * *")
    assert sum([await a.materialise_once(p) for p in range(8)]) == 0
    assert await b.materialise_until_idle() == 1
    assert await b.materialise_until_idle() == 1  # near first, then its phase (near_reach)
    # a's renewal now fails and it stops claiming
    await a.balance()
    assert not set(a.owned) & set(old)


async def test_resign_hands_over_at_once(db: Database) -> None:
    settings = SchedulerSettings(partition_lease_seconds=30)
    await partitions.set_count(db, 4)
    a, b = Scheduler(db, settings, holder="a"), Scheduler(db, settings, holder="b")
    await a.balance()
    await a.resign()
    await b.balance()
    assert len(b.owned) == 4  # no need to wait out the 30 s lease


async def test_hours_of_downtime_run_once_and_record_missed(db: Database) -> None:
    await make_job(db, "minutely", schedule="* * * * *")
    await set_cursor(db, "minutely", "date_trunc('minute', now()) - interval '3 hours'")
    s = await scheduler(db)
    await s.materialise_until_idle()
    occ = await occurrences(db, "minutely")
    missed = [o for o in occ if o["state"] == "missed"]
    catchup = [o for o in occ if o["origin"] == "catchup"]
    assert len(catchup) == 1 and catchup[0]["state"] == "pending"
    assert 175 <= len(missed) <= 181
    assert all("Misfire" in o["reason"] for o in missed)
    assert max(o["scheduled_for"] for o in missed) < catchup[0]["scheduled_for"]
    # every minute of the outage is accounted for, exactly once
    instants = sorted(o["scheduled_for"] for o in occ)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(instants))
    assert (await store_jobs.list_live(db, namespace=None))[0].missed_total == len(missed)


async def test_suspend_then_resume_applies_misfire_policy(db: Database) -> None:
    await make_job(db, "sus", schedule="* * * * *", misfirePolicy="Skip", suspend=True)
    await set_cursor(db, "sus", "date_trunc('minute', now()) - interval '10 minutes'")
    s = await scheduler(db)
    assert await s.materialise_until_idle() == 0  # suspended: nothing
    await jobs.set_suspended(db, namespace="default", name="sus", suspended=False)
    await s.materialise_until_idle()
    occ = await occurrences(db, "sus")
    assert sum(o["state"] == "missed" for o in occ) >= 9
    assert not any(o["origin"] == "catchup" for o in occ)


async def test_jitter_moves_run_at_not_identity(db: Database) -> None:
    job = await make_job(db, "jit", schedule="*/10 * * * * *", jitterSeconds=9)
    s = await scheduler(db)
    await s.materialise_until_idle()
    offset = schedule.jitter_offset(job.id, 9)
    assert offset > timedelta(0)
    for o in await occurrences(db, "jit"):
        assert o["run_at"] - o["scheduled_for"] == offset
        assert o["idempotency_key"] == schedule.occurrence_key(job.id, o["scheduled_for"])


async def test_spec_change_neither_loses_nor_duplicates(db: Database) -> None:
    await make_job(db, "chg", schedule="*/10 * * * * *")
    # A job is materialised once its next instant is within half the horizon. The new
    # schedule's first instant (the first */7 at or after the first */10 dropped) can be up
    # to 16 s away: half of the default 30 s left it unmaterialised about one run in sixty
    # (whenever the clock read :40 to :41 s, the first */7 was :56), and `future` empty.
    s = await scheduler(db, horizon_seconds=60.0)
    await s.materialise_until_idle()
    first = await occurrences(db, "chg")
    # same schedule, new message: future occurrences are re-created with the same keys
    await make_job(db, "chg", schedule="*/10 * * * * *", target={"log": {"message": "v2"}})
    await s.materialise_until_idle()
    again = await occurrences(db, "chg")
    assert [o["idempotency_key"] for o in again] == [o["idempotency_key"] for o in first]
    # a new schedule: no instant of the old one remains pending in the future
    await make_job(db, "chg", schedule="*/7 * * * * *")
    await s.materialise_until_idle()
    now = await db_now(db)
    future = [o for o in await occurrences(db, "chg") if o["scheduled_for"] > now]
    assert future and all(o["scheduled_for"].second % 7 == 0 for o in future)


async def test_reapply_same_spec_is_a_no_op(db: Database) -> None:
    a = await make_job(db, "same", schedule="@hourly")
    b = await make_job(db, "same", schedule="@hourly")
    assert (a.action, b.action, a.id) == ("created", "unchanged", b.id)


async def test_one_shot_runs_once(db: Database) -> None:
    now = await db_now(db)
    at = (now + timedelta(seconds=5)).replace(microsecond=0)
    await make_job(db, "once", runAt=at.isoformat())
    s = await scheduler(db)
    await s.materialise_until_idle()
    await s.materialise_until_idle()
    occ = await occurrences(db, "once")
    assert [o["scheduled_for"] for o in occ] == [at]
    assert (await store_jobs.list_live(db, namespace=None))[0].next_run_at is None


async def test_trigger_is_idempotent_per_id(db: Database) -> None:
    await make_job(db, "trig", schedule="@yearly")
    k1, c1 = await jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t1")
    k2, c2 = await jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t1")
    k3, c3 = await jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t2")
    assert (c1, c2, c3) == (True, False, True) and k1 == k2 != k3
    assert len([o for o in await occurrences(db, "trig") if o["origin"] == "trigger"]) == 2


async def test_delete_keeps_history_drops_unstarted(db: Database) -> None:
    await make_job(db, "del", schedule="*/10 * * * * *")
    s = await scheduler(db)
    await s.materialise_until_idle()
    await jobs.delete_job(db, namespace="default", name="del")
    assert await occurrences(db, "del") == []
    again = await make_job(db, "del", schedule="*/10 * * * * *")
    assert again.action == "created"  # a re-created job is a new job


async def test_suspension_records_missed_instants_and_resume_catches_up_once(
    db: Database,
) -> None:
    """As Kubernetes CronJob: instants that fell while suspended are missed (reason
    Suspended, counted); on resume, RunOnce runs at most one of them, even when all are
    within startingDeadlineSeconds."""
    await make_job(
        db,
        "paused",
        schedule="* * * * * *",
        concurrencyPolicy="Allow",
        misfirePolicy="RunOnce",
        startingDeadlineSeconds=60,
    )
    await jobs.set_suspended(db, namespace="default", name="paused", suspended=True)
    # four instants pass while suspended (the cursor stays where suspension found it)
    await set_cursor(db, "paused", "date_trunc('second', now()) - interval '4 s'")
    await jobs.set_suspended(db, namespace="default", name="paused", suspended=False)
    s = await scheduler(db, horizon_seconds=0.001)
    await s.materialise_until_idle()
    occ = await occurrences(db, "paused")
    (resumed,) = await store_jobs.list_live(db, namespace=None)
    during = [o for o in occ if o["scheduled_for"] < occ[-1]["scheduled_for"]]
    missed = [o for o in occ if o["state"] == "missed"]
    catchup = [o for o in occ if o["origin"] == "catchup"]
    assert len(catchup) == 1, [(o["state"], o["origin"]) for o in occ]
    assert len(missed) >= 3 and all(o["reason"] == "Suspended" for o in missed)
    assert resumed.missed_total == len(missed)
    assert catchup[0]["scheduled_for"] > max(o["scheduled_for"] for o in missed)
    assert len(during) >= 4


async def test_a_stored_spec_that_no_longer_validates_parks_its_job_only(db: Database) -> None:
    """A spec written by an older version (here a random `R` cron, now refused) must not
    fail the batch: its job is parked (no next run), the others are materialised."""
    await make_job(db, "good", schedule="*/10 * * * * *")
    bad = await make_job(db, "bad", schedule="*/10 * * * * *")
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE cronwell_jobs SET spec = jsonb_set(spec, '{schedule}', '\"R * * * *\"'),"
            " spec_hash = 'stale' WHERE id = %s",
            (bad.id,),
        )
    s = await scheduler(db, horizon_seconds=30)
    assert await s.materialise_until_idle() == 2
    assert len(await occurrences(db, "good")) >= 1
    assert await occurrences(db, "bad") == []
    async with db.connection() as conn:
        cur = await conn.execute("SELECT next_run_at FROM cronwell_jobs WHERE id = %s", (bad.id,))
        assert (await cur.fetchone()) == {"next_run_at": None}


async def test_a_changed_spec_is_read_by_the_scheduler_that_parsed_the_old_one(
    db: Database,
) -> None:
    """Batches read only the specs of hashes the scheduler has not parsed: a job whose spec
    changes comes back with a new hash, and the same scheduler reads and follows it."""
    await make_job(db, "tick", schedule="*/10 * * * * *")
    s = await scheduler(db, horizon_seconds=150)
    await s.materialise_until_idle()
    assert all(o["scheduled_for"].second % 10 == 0 for o in await occurrences(db, "tick"))
    await make_job(db, "tick", schedule="7 * * * * *", target={"log": {"message": "new"}})
    await sql(db, "DELETE FROM cronwell_occurrences")  # its cursor starts again from now
    assert await s.materialise_until_idle() >= 1
    seconds = [o["scheduled_for"].second for o in await occurrences(db, "tick")]
    assert seconds and set(seconds) == {7}, seconds


async def test_a_long_catch_up_is_progress_not_a_stall(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each committed batch is progress: a pass of many batches that outlasts the stall
    threshold on a busy machine must not give the partitions up (seen in the soak's
    start-up at load 5, whose first pass materialises 30 s of 1,472 occurrences/s)."""
    for i in range(3):
        await make_job(db, f"j{i}", schedule="0 0 1 1 *")
        await set_cursor(db, f"j{i}", "now()")
    s = await scheduler(db, batch_size=1)  # three batches
    monkeypatch.setattr(liveness.time, "monotonic", lambda: 0.0)
    s.live.waiting(MATERIALISATION)  # the pass began long before the stall threshold
    monkeypatch.undo()
    assert s.live.stalled() == [MATERIALISATION]
    assert await s.materialise_until_idle() == 3
    assert s.live.stalled() == []
