"""History partitioned by instant (issue 31) on a real PostgreSQL: the shape a fresh migrate
builds, the resumable online conversion, maintenance (ahead, retention by partition) and
partition pruning of a bounded lookup."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from cronwell import maintenance, partitions
from cronwell.backfill import BackfillError, backfill
from cronwell.errors import UniqueViolation
from cronwell.metrics import Metrics
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store import Database, history_partitions, migrate
from tests.helpers.wait import wait_for

from .helpers import db_now, make_job, sql
from .worker_helpers import running_worker

DAY_SECONDS = 86400.0


@pytest.fixture
async def fresh(empty_db_url: str) -> AsyncIterator[Database]:
    async with Database(empty_db_url, max_size=20) as db:
        yield db


@pytest.fixture
async def legacy(empty_db_url: str) -> AsyncIterator[Database]:
    """A store migrated with the previous shape (unpartitioned history)."""
    async with Database(empty_db_url, max_size=20) as db:
        await migrate(db, partition_history=False)
        yield db


def _day(offset: int) -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + timedelta(days=offset)


async def _relkinds(db: Database) -> dict[str, str]:
    rows = await sql(
        db,
        "SELECT relname, relkind::text FROM pg_class "
        "WHERE relname IN ('cronwell_occurrences', 'cronwell_attempts')",
    )
    return {r["relname"]: r["relkind"] for r in rows}


async def _occurrence(
    db: Database, job_id: uuid.UUID, at: datetime, state: str = "succeeded", key: str | None = None
) -> int:
    rows = await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, "
        "run_at, state, overlap, delivery, max_attempts, timeout_seconds, finished_at) "
        "VALUES (%s, %s, 'default', %s, %s, %s, 'Allow', 'AtLeastOnce', 1, 60, "
        "CASE WHEN %s IN ('pending', 'running', 'waiting') THEN NULL ELSE now() END) "
        "RETURNING id",
        key or f"{job_id}:{at.isoformat()}",
        job_id,
        at,
        at,
        state,
        state,
    )
    return int(rows[0]["id"])


async def _success(db: Database, occ: int, key: str, at: datetime | None) -> None:
    await sql(
        db,
        "INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence, "
        "outcome, scheduled_for) VALUES (%s, %s, 1, 1, 'succeeded', %s)",
        occ,
        key,
        at,
    )


async def test_fresh_migrate_partitions_history(fresh: Database) -> None:
    await migrate(fresh)
    assert await _relkinds(fresh) == {"cronwell_occurrences": "p", "cronwell_attempts": "p"}
    parts = await history_partitions.partitions(fresh)
    names = {p.name for p in parts}
    assert {"cronwell_occurrences_legacy", "cronwell_attempts_legacy"} <= names
    # A new store cuts over at the start of today's partition (nothing can be writing to
    # it yet), not days ahead as a live one does: today's runs are in a day partition.
    assert f"cronwell_occurrences_p{_day(0):%Y%m%d}" in names
    assert f"cronwell_attempts_p{_day(0):%Y%m%d}" in names
    # Every instant from today to 2 days ahead has its partition.
    for parent in ("cronwell_occurrences", "cronwell_attempts"):
        for offset in range(3):
            at = _day(offset) + timedelta(hours=12)
            assert any(
                p.parent == parent and (p.lo is None or p.lo <= at) and (p.hi is None or at < p.hi)
                for p in parts
            ), (parent, offset, parts)
    assert f"cronwell_occurrences_p{_day(2):%Y%m%d}" in names
    job = await make_job(fresh, "nightly", schedule="0 0 * * *")
    at = _day(2) + timedelta(hours=1)
    key = f"{job.id}:{at.isoformat()}"
    occ = await _occurrence(fresh, job.id, at, key=key)
    # The same (key, instant) again is rejected; ON CONFLICT DO NOTHING makes it a no-op.
    with pytest.raises(UniqueViolation):
        await _occurrence(fresh, job.id, at, key=key)
    # Invariant 1: one success per key, still enforced by the database.
    await _success(fresh, occ, key, at)
    with pytest.raises(UniqueViolation):
        await _success(fresh, occ, key, at)
    # The identity went on as a sequence: ids keep being assigned.
    assert occ >= 1


async def test_legacy_rows_keep_invariant_after_switch(legacy: Database) -> None:
    job = await make_job(legacy, "nightly", schedule="0 0 * * *")
    at = _day(0) + timedelta(hours=1)
    key = f"{job.id}:{at.isoformat()}"
    occ = await _occurrence(legacy, job.id, at, key=key)
    await _success(legacy, occ, key, None)  # written before 0015: no instant
    before = await sql(legacy, "SELECT max(id) AS id FROM cronwell_occurrences")
    triggers = await _triggers(legacy)
    assert len(triggers) == 5, triggers
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    await sql(legacy, f"CREATE ROLE {reader}")
    await sql(legacy, f"GRANT SELECT, INSERT ON cronwell_attempts TO {reader}")
    await migrate(legacy)
    assert await _relkinds(legacy) == {"cronwell_occurrences": "p", "cronwell_attempts": "p"}
    # The statement triggers (status, counters, attempts' cleanup) moved to the parents.
    assert await _triggers(legacy) == triggers
    grants = await sql(
        legacy,
        "SELECT has_table_privilege(%s, 'cronwell_attempts', 'INSERT') AS ins, "
        "has_sequence_privilege(%s, 'cronwell_attempts_id_seq', 'USAGE') AS seq",
        reader,
        reader,
    )
    assert grants == [{"ins": True, "seq": True}]
    # A second success for that key, without an instant or with it, is refused.
    with pytest.raises(UniqueViolation):
        await _success(legacy, occ, key, None)
    with pytest.raises(UniqueViolation):
        await _success(legacy, occ, key, at)
    # Ids carry on after the legacy identity's.
    new = await _occurrence(legacy, job.id, at + timedelta(minutes=1))
    assert new > before[0]["id"]
    rows = await sql(legacy, "SELECT count(*) AS n FROM cronwell_attempts")
    assert rows[0]["n"] == 1


async def _triggers(db: Database) -> list[tuple[str, str]]:
    """(table, trigger) of the history tables' own triggers."""
    rows = await sql(
        db,
        "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE c.relname IN ('cronwell_occurrences', 'cronwell_attempts') "
        "AND NOT t.tgisinternal ORDER BY 1, 2",
    )
    return [(r["relname"], r["tgname"]) for r in rows]


async def test_migrate_twice_is_a_noop(fresh: Database) -> None:
    await migrate(fresh)
    before = await sql(
        fresh,
        "SELECT relname, oid::bigint FROM pg_class WHERE relname LIKE 'cronwell_%%' "
        "ORDER BY relname",
    )
    await migrate(fresh)
    after = await sql(
        fresh,
        "SELECT relname, oid::bigint FROM pg_class WHERE relname LIKE 'cronwell_%%' "
        "ORDER BY relname",
    )
    assert before == after


async def test_interrupted_conversion_resumes(legacy: Database) -> None:
    job = await make_job(legacy, "nightly", schedule="0 0 * * *")
    await _occurrence(legacy, job.id, _day(0))
    # Step 1 only, plus an INVALID index as an interrupted CONCURRENTLY build leaves it.
    async with legacy.connection() as conn:
        await history_partitions.build_indexes(legacy, conn)
    await sql(legacy, "DROP INDEX cronwell_occurrences_key_instant")
    await sql(
        legacy,
        "CREATE UNIQUE INDEX cronwell_occurrences_key_instant ON cronwell_occurrences "
        "(idempotency_key, scheduled_for)",
    )
    await sql(
        legacy,
        "UPDATE pg_index SET indisvalid = false "
        "WHERE indexrelid = 'cronwell_occurrences_key_instant'::regclass",
    )
    kept = await sql(legacy, "SELECT 'cronwell_occurrences_claim'::regclass::oid::bigint AS o")
    await migrate(legacy)
    assert await _relkinds(legacy) == {"cronwell_occurrences": "p", "cronwell_attempts": "p"}
    valid = await sql(legacy, "SELECT bool_and(indisvalid) AS ok FROM pg_index")
    assert valid[0]["ok"]
    # The legacy's indexes were attached, not rebuilt: same relation, renamed aside.
    moved = await sql(
        legacy, "SELECT 'cronwell_occurrences_claim_legacy'::regclass::oid::bigint AS o"
    )
    assert moved == kept
    assert (await history_partitions.shape(legacy)).partitioned


async def test_bounded_lookup_touches_one_partition(fresh: Database) -> None:
    await migrate(fresh)
    at = _day(2) + timedelta(hours=3)
    rows = await sql(
        fresh,
        "EXPLAIN SELECT * FROM cronwell_occurrences WHERE idempotency_key = 'x' "
        "AND scheduled_for = %s",
        at,
    )
    plan = "\n".join(r["QUERY PLAN"] for r in rows)
    assert f"cronwell_occurrences_p{_day(2):%Y%m%d}" in plan, plan
    assert "cronwell_occurrences_legacy" not in plan, plan
    assert "Index" in plan, plan


async def _pruner(db: Database, retention: float, metrics: Metrics) -> maintenance.Pruner:
    return maintenance.Pruner(db, retention_seconds=retention, metrics=metrics)


async def test_maintenance_creates_ahead_and_drops_expired(fresh: Database) -> None:
    await migrate(fresh)
    # As if the retention had dropped the legacy partitions long ago, and the days ahead
    # were not created yet.
    await sql(fresh, "DROP TABLE cronwell_attempts_legacy")
    await sql(fresh, "DROP TABLE cronwell_occurrences_legacy")
    for d in (1, 2):
        await sql(fresh, f"DROP TABLE cronwell_occurrences_p{_day(d):%Y%m%d}")
        await sql(fresh, f"DROP TABLE cronwell_attempts_p{_day(d):%Y%m%d}")
    job = await make_job(fresh, "nightly", schedule="0 0 * * *")
    old_lo, old_hi = _day(-30), _day(-29)
    busy_lo, busy_hi = _day(-20), _day(-19)
    assert await history_partitions.ensure_partitions(fresh, old_lo, old_hi) == 1
    assert await history_partitions.ensure_partitions(fresh, busy_lo, busy_hi) == 1
    old = await _occurrence(fresh, job.id, old_lo + timedelta(hours=1))
    await _success(fresh, old, f"{job.id}:old", old_lo + timedelta(hours=1))
    await _occurrence(fresh, job.id, busy_lo + timedelta(hours=1), state="running")
    metrics = Metrics()
    # A retention of 1 s: yesterday's partition may go, today's never.
    pruner = await _pruner(fresh, 1.0, metrics)
    await pruner.prune_once()  # creates tomorrow's and the next day's partitions
    await _occurrence(fresh, job.id, _day(0) + timedelta(seconds=1))
    await pruner.prune_once()
    names = {p.name for p in await history_partitions.partitions(fresh)}
    assert f"cronwell_occurrences_p{old_lo:%Y%m%d}" not in names
    assert f"cronwell_attempts_p{old_lo:%Y%m%d}" not in names
    # A running occurrence keeps its partition past the retention.
    assert f"cronwell_occurrences_p{busy_lo:%Y%m%d}" in names
    # Today's is never dropped; the partitions ahead exist.
    for d in (0, 1, 2):
        assert f"cronwell_occurrences_p{_day(d):%Y%m%d}" in names
        assert f"cronwell_attempts_p{_day(d):%Y%m%d}" in names
    left = await sql(fresh, "SELECT count(*) AS n FROM cronwell_occurrences")
    assert left[0]["n"] == 2
    assert metrics.history_partitions.labels("dropped")._value.get() == 1
    assert metrics.history_partitions.labels("postponed")._value.get() == 2
    assert metrics.history_partitions.labels("created")._value.get() == 2


async def test_legacy_partitions_go_once_past_the_retention(legacy: Database) -> None:
    job = await make_job(legacy, "nightly", schedule="0 0 * * *")
    at = _day(0) + timedelta(hours=1)
    key = f"{job.id}:{at.isoformat()}"
    occ = await _occurrence(legacy, job.id, at, state="pending", key=key)
    await _success(legacy, occ, key, None)
    await migrate(legacy)  # a live store: the cutover C is 2 days ahead
    # A negative retention fakes C being older than it.
    past_c = -(_day(2) - datetime.now(UTC)).total_seconds() - 60
    res = await history_partitions.drop_expired(legacy, retention_seconds=past_c)
    assert (res.partitions, res.postponed) == (0, 1)
    await sql(legacy, "UPDATE cronwell_occurrences SET state = 'succeeded', finished_at = now()")
    res = await history_partitions.drop_expired(legacy, retention_seconds=past_c)
    assert (res.partitions, res.postponed) == (1, 0)
    names = {p.name for p in await history_partitions.partitions(legacy)}
    assert "cronwell_occurrences_legacy" not in names
    assert "cronwell_attempts_legacy" not in names
    assert f"cronwell_occurrences_p{_day(2):%Y%m%d}" in names


async def test_an_attempts_partition_left_by_an_interrupted_drop_goes_next_pass(
    fresh: Database,
) -> None:
    """The two drops of a range are separate transactions (occurrences first, the writers'
    lock order): one interrupted between them leaves the attempts partition, which the next
    pass drops; a live range's stays."""
    await migrate(fresh)
    # As if the retention had dropped the legacy partitions long ago.
    await sql(fresh, "DROP TABLE cronwell_attempts_legacy")
    await sql(fresh, "DROP TABLE cronwell_occurrences_legacy")
    lo, hi = _day(-30), _day(-29)
    assert await history_partitions.ensure_partitions(fresh, lo, hi) == 1
    await sql(fresh, f"DROP TABLE cronwell_occurrences_p{lo:%Y%m%d}")  # the pass stopped here
    await history_partitions.drop_expired(fresh, retention_seconds=DAY_SECONDS)
    names = {p.name for p in await history_partitions.partitions(fresh)}
    assert f"cronwell_attempts_p{lo:%Y%m%d}" not in names
    assert f"cronwell_attempts_p{_day(2):%Y%m%d}" in names


async def test_a_drop_that_meets_a_held_lock_waits_and_retries(fresh: Database) -> None:
    """A drop whose lock is not granted in time (lock_timeout) backs off and tries again
    instead of failing the pass: the lock timeout was reported as a lost connection and
    never retried."""
    await migrate(fresh)
    await sql(fresh, "DROP TABLE cronwell_attempts_legacy")
    await sql(fresh, "DROP TABLE cronwell_occurrences_legacy")
    lo, hi = _day(-30), _day(-29)
    assert await history_partitions.ensure_partitions(fresh, lo, hi) == 1
    name = f"cronwell_occurrences_p{lo:%Y%m%d}"
    async with fresh.transaction() as conn:
        await conn.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")  # a long reader
        drop = asyncio.create_task(
            history_partitions.drop_expired(fresh, retention_seconds=DAY_SECONDS)
        )
        await asyncio.sleep(1.0)  # held across the drop's first tries (100 ms waits)
    res = await asyncio.wait_for(drop, 60)
    assert res.partitions == 1
    assert name not in {p.name for p in await history_partitions.partitions(fresh)}


async def test_ensure_partitions_fills_a_range_ahead(fresh: Database) -> None:
    await migrate(fresh)
    n = await history_partitions.ensure_partitions(fresh, _day(3), _day(5))
    assert n == 2
    assert await history_partitions.ensure_partitions(fresh, _day(3), _day(5)) == 0
    names = {p.name for p in await history_partitions.partitions(fresh)}
    for d in (3, 4):
        assert f"cronwell_attempts_p{_day(d):%Y%m%d}" in names
    # Hourly partitions continue from the last bound.
    n = await history_partitions.ensure_partitions(
        fresh, _day(5), _day(5) + timedelta(hours=2), partition_seconds=3600
    )
    assert n == 2
    names = {p.name for p in await history_partitions.partitions(fresh)}
    assert f"cronwell_occurrences_p{_day(5):%Y%m%d}_0100" in names


@pytest.mark.slow
async def test_online_conversion_with_scheduler_and_workers_running(
    empty_db_url: str,
) -> None:
    """A legacy store with 10 per-second jobs, a scheduler and two workers: the
    conversion runs while they do; afterwards every job's instants are one second apart, each
    once (none lost), no key succeeded twice, and attempts from before and after the switch
    read through the parent."""
    async with Database(empty_db_url, max_size=20) as db:
        await migrate(db, partition_history=False)
        await partitions.set_count(db, 2)
        for i in range(10):
            await make_job(
                db,
                f"sec{i}",
                schedule="* * * * * *",
                target={"handler": {"name": "t-noop", "payload": {}}},
            )
        # In-process: `cronwell scheduler` migrates at start, which would convert the store
        # itself before the test does.
        sdb = Database(empty_db_url, max_size=10)
        await sdb.open()
        sched = Scheduler(
            sdb,
            SchedulerSettings(partition_lease_seconds=2, horizon_seconds=1, tick_seconds=0.2),
        )
        task = asyncio.create_task(sched.run())
        try:
            async with (
                running_worker(empty_db_url, worker_id="w1") as w1,
                running_worker(empty_db_url, worker_id="w2") as w2,
            ):

                async def some_done() -> bool:
                    rows = await sql(db, "SELECT count(*) AS n FROM cronwell_attempts")
                    return bool(rows[0]["n"] >= 20)

                await wait_for(some_done, 30, "attempts on the legacy store", 0.2)
                assert not (await history_partitions.shape(db)).partitioned
                await migrate(db)
                switched = (await history_partitions.shape(db)).partitioned
                switched_at = await db_now(db)
                await asyncio.sleep(4)
                assert not task.done()
            outcomes = w1.outcomes + w2.outcomes
        finally:
            sched.stop()
            await asyncio.wait_for(task, 20)
            await sdb.close()
        assert switched
        rows = await sql(
            db,
            "SELECT j.name, o.scheduled_for FROM cronwell_occurrences o "
            "JOIN cronwell_jobs j ON j.id = o.job_id ORDER BY 1, 2",
        )
        by_job: dict[str, list[datetime]] = defaultdict(list)
        for r in rows:
            by_job[r["name"]].append(r["scheduled_for"])
        assert len(by_job) == 10
        for name, instants in by_job.items():
            assert len(instants) == len(set(instants)), f"{name}: duplicate instants"
            gaps = [b - a for a, b in itertools.pairwise(instants) if b - a != timedelta(seconds=1)]
            assert not gaps, f"{name}: lost instants {gaps}"
            assert instants[-1] > switched_at + timedelta(seconds=2), f"{name} stopped"
        dup = await sql(
            db,
            "SELECT idempotency_key FROM cronwell_attempts WHERE outcome = 'succeeded' "
            "GROUP BY 1 HAVING count(*) > 1",
        )
        assert dup == []
        ran = await sql(
            db,
            "SELECT count(*) FILTER (WHERE o.scheduled_for < %s) AS before, "
            "count(*) FILTER (WHERE o.scheduled_for > %s + interval '1 second') AS after "
            "FROM cronwell_attempts a JOIN cronwell_occurrences o ON o.id = a.occurrence_id "
            "WHERE a.outcome = 'succeeded'",
            switched_at,
            switched_at,
        )
        assert ran[0]["before"] > 0 and ran[0]["after"] > 0, ran
        # released: claimed ahead and handed back when the workers stopped.
        assert [o for o in outcomes if o.result not in ("succeeded", "released")] == []


async def test_backfill_creates_partitions_and_refuses_past_the_retention(
    fresh: Database,
) -> None:
    await migrate(fresh)
    await sql(fresh, "DROP TABLE cronwell_attempts_legacy")
    await sql(fresh, "DROP TABLE cronwell_occurrences_legacy")
    await make_job(fresh, "daily", schedule="0 12 * * *")
    lo, hi = _day(-3), _day(-1)
    res = await backfill(fresh, namespace="default", name="daily", start=lo, end=hi)
    assert len(res.created) == 2
    names = {p.name for p in await history_partitions.partitions(fresh)}
    assert {
        f"cronwell_occurrences_p{_day(-3):%Y%m%d}",
        f"cronwell_attempts_p{_day(-2):%Y%m%d}",
    } <= names
    with pytest.raises(BackfillError, match="older than the retention"):
        await backfill(
            fresh,
            namespace="default",
            name="daily",
            start=_day(-3),
            end=hi,
            retention_seconds=86400.0,
        )


@pytest.mark.parametrize("partitioned", [True, False])
async def test_a_trigger_id_sent_twice_creates_one_occurrence(
    empty_db_url: str, partitioned: bool
) -> None:
    """The key's unique index no longer dedupes a trigger (its instant is now(), so the
    second one's (key, instant) differs): the lookup under a lock does, on both shapes,
    sent one after the other or at once."""
    from cronwell import jobs

    async with Database(empty_db_url, max_size=20) as db:
        await migrate(db, partition_history=partitioned)
        await make_job(db, "trig", schedule="@yearly")
        first = await jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t1")
        await asyncio.sleep(0.01)  # a later now(): another (key, instant) pair
        again = await jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t1")
        assert first[1] and again == (first[0], False)
        at_once = await asyncio.gather(
            *(
                jobs.trigger_job(db, namespace="default", name="trig", trigger_id="t2")
                for _ in range(8)
            )
        )
        assert sorted(c for _, c in at_once) == [False] * 7 + [True]
        rows = await sql(
            db, "SELECT count(*) AS n FROM cronwell_occurrences WHERE origin = 'trigger'"
        )
        assert rows[0]["n"] == 2


async def test_every_attempt_row_carries_its_occurrences_instant(fresh: Database) -> None:
    """A success, a failure and a lease reaped: each attempt row has its occurrence's
    instant, so it lives in the attempts partition of its day (not the DEFAULT one, for
    rows without one) and goes with the day's occurrences. Writes are bounded by it."""
    from cronwell import dispatch
    from cronwell.store import attempts as attempts_store
    from cronwell.store import claims

    from .worker_helpers import handler_job, trigger

    await migrate(fresh)

    async def claim(name: str) -> dispatch.Claimed:
        await handler_job(fresh, name, "t-wait-event", retry={"maxAttempts": 3})
        key = await trigger(fresh, name)
        (row,) = await sql(
            fresh, "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s", key
        )
        (s,) = await claims.start(
            fresh, [row["id"]], worker_id="w", lease_seconds=60, row=dispatch.Claimed
        )
        return dispatch.arrived(s)

    ok, bad, lost = await claim("ok"), await claim("bad"), await claim("lost")
    held = await claim("held")
    at = (ok.scheduled_for, ok.scheduled_for)
    assert await dispatch.succeed(fresh, [(ok.id, ok.fence)], within=at) == {ok.key}
    assert (
        await dispatch.fail(
            fresh,
            occurrence_id=bad.id,
            fence=bad.fence,
            next_state="pending",
            reason="Error",
            error="boom",
            delay_seconds=0,
            within=(bad.scheduled_for, bad.scheduled_for),
        )
        == "pending"
    )
    await sql(
        fresh,
        "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second',"
        " started_at = coalesce(started_at, now()) WHERE idempotency_key = %s",
        lost.key,
    )
    reaped = await attempts_store.reap_leases(fresh, limit=10)
    assert [r.idempotency_key for r in reaped] == [lost.key]
    rows = await sql(
        fresh,
        "SELECT a.idempotency_key, a.outcome, a.scheduled_for = o.scheduled_for AS same"
        " FROM cronwell_attempts a JOIN cronwell_occurrences o ON o.id = a.occurrence_id"
        " ORDER BY a.id",
    )
    assert [(r["idempotency_key"], r["outcome"], r["same"]) for r in rows] == [
        (ok.key, "succeeded", True),
        (bad.key, "failed", True),
        (lost.key, "lease_expired", True),
    ]
    # A batch bounded by another instant matches nothing: the bounds are applied.
    running = [(held.id, held.fence)]
    for day, alive in ((timedelta(days=-1), set()), (timedelta(0), {held.key})):
        instant = held.scheduled_for + day
        got = await dispatch.heartbeat(
            fresh, worker_id="w", running=running, lease_seconds=60, within=(instant, instant)
        )
        assert got == alive, day


async def test_narrow_partitions_are_kept_at_most_48_ahead(fresh: Database) -> None:
    """Five-minute partitions (a retention of minutes: the soak) start at the current one on
    a new store and are created 48 ahead, not two days' worth (576)."""
    await migrate(fresh, history_partition_seconds=300)
    now = await db_now(fresh)
    parts = [
        p
        for p in await history_partitions.partitions(fresh)
        if p.parent == "cronwell_occurrences" and p.lo is not None
    ]
    assert all(p.hi is not None and (p.hi - p.lo).total_seconds() == 300 for p in parts), parts
    assert len(parts) in (48, 49), len(parts)
    assert min(p.lo for p in parts if p.lo is not None) <= now
    assert max(p.hi for p in parts if p.hi is not None) >= now + timedelta(hours=4)
    cell = now.replace(minute=now.minute - now.minute % 5, second=0, microsecond=0)
    assert f"cronwell_occurrences_p{cell:%Y%m%d_%H%M}" in {p.name for p in parts}
