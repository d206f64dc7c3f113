"""Overlap (concurrencyPolicy) decided at claim time under the job's lock; for an
occurrence claimed ahead of its instant, at its instant."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import uuid
from datetime import datetime, timedelta

import pytest

from cronwell import dispatch
from cronwell.backfill import backfill
from cronwell.dispatch import Active, Candidate, decide_overlap, plan_ahead
from cronwell.scheduler import Scheduler
from cronwell.store import claims
from cronwell.store.claims import Candidates
from cronwell.store.db import Database
from tests.helpers.store import fail_dead
from tests.helpers.wait import wait_for

from .helpers import (
    db_now,
    make_job,
    occurrences,
    scheduler,
    set_cursor,
    sql,
    waiting_for_a_job_lock,
    waiting_for_an_advisory_lock,
)
from .worker_helpers import (
    EFFECTS_DDL,
    FAR_FUTURE,
    due_in,
    handler_job,
    marks_of,
    running_worker,
    state_is,
    trigger,
)


async def _due(db: Database, policy: str, seconds_back: int = 4) -> Scheduler:
    """Occurrences of a per-second job due now: seconds_back + 1 of them, or one more when
    the wall clock crossed a second meanwhile (tests count them, see _n)."""
    await make_job(db, "ov", schedule="* * * * * *", concurrencyPolicy=policy)
    await set_cursor(db, "ov", f"date_trunc('second', now()) - interval '{seconds_back} s'")
    s = await scheduler(db, horizon_seconds=0.001)
    await s.materialise_until_idle()
    return s


async def _claim(db: Database) -> list[dispatch.Claimed]:
    return await dispatch.claim(db, pool="default", worker_id="w", limit=100, lease_seconds=30)


async def _n(db: Database) -> int:
    n = len(await occurrences(db, "ov"))
    assert n >= 2
    return n


async def _states(db: Database) -> list[str]:
    return [o["state"] for o in await occurrences(db, "ov")]


async def test_allow_runs_all(db: Database) -> None:
    await _due(db, "Allow")
    n = await _n(db)
    assert len(await _claim(db)) == n >= 5
    assert await _states(db) == ["running"] * n


async def test_skip_runs_one_and_records_the_rest(db: Database) -> None:
    await _due(db, "Skip")
    n = await _n(db)
    claimed = await _claim(db)
    assert len(claimed) == 1
    occ = await occurrences(db, "ov")
    assert [o["state"] for o in occ] == ["running"] + ["skipped"] * (n - 1)
    assert all("Overlap" in o["reason"] for o in occ[1:])
    assert claimed[0].key == occ[0]["idempotency_key"]  # the oldest runs


async def test_buffer_one(db: Database) -> None:
    await _due(db, "BufferOne")
    n = await _n(db)
    first = await _claim(db)
    assert await _states(db) == ["running", "waiting"] + ["skipped"] * (n - 2)
    assert await _claim(db) == []  # the waiting one is not claimable while one runs
    assert await dispatch.succeed(db, [(first[0].id, first[0].fence)]) == {first[0].key}
    second = await _claim(db)
    assert len(second) == 1
    assert await _states(db) == ["succeeded", "running"] + ["skipped"] * (n - 2)


async def test_buffer_all_runs_in_order(db: Database) -> None:
    await _due(db, "BufferAll")
    n = await _n(db)
    order = []
    while claimed := await _claim(db):
        assert len(claimed) == 1
        order.append(claimed[0].scheduled_for)
        await dispatch.succeed(db, [(claimed[0].id, claimed[0].fence)])
    assert len(order) == n and order == sorted(order)
    assert await _states(db) == ["succeeded"] * n


async def test_buffer_all_promotes_after_dead(db: Database) -> None:
    await _due(db, "BufferAll", seconds_back=1)
    c = (await _claim(db))[0]
    await fail_dead(db, c.key, c.fence)
    assert len(await _claim(db)) == 1


async def test_replace_cancels_the_active_one(db: Database) -> None:
    s = await _due(db, "Replace", seconds_back=2)
    n = await _n(db)
    claimed = await _claim(db)
    occ = await occurrences(db, "ov")
    assert [o["state"] for o in occ] == ["skipped"] * (n - 1) + ["running"]  # newest wins
    # a newer occurrence comes due: the running one is cancelled, its completion rejected
    await asyncio.sleep(1.1)
    await s.materialise_until_idle()
    newer = await _claim(db)
    assert len(newer) == 1 and newer[0].key != claimed[0].key
    assert await dispatch.succeed(db, [(claimed[0].id, claimed[0].fence)]) == set()
    states = {o["idempotency_key"]: o["state"] for o in await occurrences(db, "ov")}
    assert states[claimed[0].key] == "cancelled" and states[newer[0].key] == "running"


async def test_replace_cancels_an_active_one_of_an_earlier_day(db: Database) -> None:
    """The claim's overlap decisions are bounded by instants (to prune a partitioned
    history): by the active rows' too, which a Replace cancels, however old."""
    s = await _due(db, "Replace", seconds_back=1)
    claimed = (await _claim(db))[0]
    await sql(
        db,
        "UPDATE cronwell_occurrences SET scheduled_for = scheduled_for - interval '1 day'"
        " WHERE idempotency_key = %s",
        claimed.key,
    )
    await asyncio.sleep(1.1)  # a newer occurrence comes due
    await s.materialise_until_idle()
    newer = await _claim(db)
    assert len(newer) == 1 and newer[0].key != claimed.key
    states = {o["idempotency_key"]: o["state"] for o in await occurrences(db, "ov")}
    assert states[claimed.key] == "cancelled" and states[newer[0].key] == "running"


AT = datetime(2026, 1, 1)
"""An active occurrence's instant (the claim's settle bounds include it)."""


def _cand(i: int, job: uuid.UUID, policy: str, attempt: int = 0, due: bool = True) -> Candidate:
    at = datetime(2026, 1, 1, 0, 0, i)
    return Candidate(i, job, policy, attempt, at, at, due)


@pytest.mark.parametrize(
    ("policy", "active_state", "expected"),
    [
        ("Skip", "running", ([], ["skipped", "skipped"])),
        ("BufferOne", "running", ([], ["waiting", "skipped"])),
        ("BufferOne", "waiting", ([1], ["skipped"])),
        ("BufferAll", "running", ([], ["waiting", "waiting"])),
        ("BufferAll", "pending", ([], ["waiting", "waiting"])),  # a retry in backoff is active
        ("Allow", "running", ([1, 2], [])),
    ],
)
def test_decide_overlap_with_an_active_occurrence(
    policy: str, active_state: str, expected: tuple[list[int], list[str]]
) -> None:
    job = uuid.uuid4()
    run, settle = decide_overlap(
        [_cand(1, job, policy), _cand(2, job, policy)], [Active(99, job, active_state, "k", AT)]
    )
    assert (run, [s[1] for s in settle if s[0] != 99]) == expected


@pytest.mark.parametrize("policy", ["Skip", "BufferOne", "BufferAll", "Replace"])
@pytest.mark.parametrize("attempt", [0, 1])
def test_decide_overlap_runs_a_lone_candidate_of_an_idle_job_whatever_its_policy(
    policy: str, attempt: int
) -> None:
    """The common case of a burst (one occurrence per job, nothing of it active): it runs,
    nothing is settled; an active occurrence of another job, or the candidate itself
    listed as active, changes nothing; one of its own job does."""
    job, other = uuid.uuid4(), uuid.uuid4()
    cand = _cand(1, job, policy, attempt)
    idle = [Active(9, other, "running", "k9", AT), Active(1, job, "pending", "k1", AT)]
    assert decide_overlap([cand], idle) == ([1], [])
    run, settle = decide_overlap([cand], [Active(8, job, "running", "k8", AT)])
    assert 1 not in run or policy == "Replace"
    assert settle


def test_decide_overlap_retry_resumes_before_newer() -> None:
    job = uuid.uuid4()
    run, settle = decide_overlap([_cand(1, job, "Skip", attempt=2), _cand(2, job, "Skip")], [])
    assert run == [1] and settle == [
        (2, "skipped", "Overlap: an earlier occurrence is still active")
    ]


def test_decide_overlap_jobs_are_independent() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    run, _ = decide_overlap(
        [_cand(1, a, "Skip"), _cand(2, b, "Skip")], [Active(9, a, "running", "k", AT)]
    )
    assert run == [2]


def test_plan_ahead_claims_a_serialised_job_only_when_nothing_of_it_is_active_or_due() -> None:
    idle, busy, due_job, allow = (uuid.uuid4() for _ in range(4))
    ahead = [
        _cand(1, idle, "Skip", due=False),
        _cand(2, idle, "Skip", due=False),  # the job's second: decided at its instant
        _cand(3, busy, "Replace", due=False),
        _cand(4, due_job, "BufferAll", due=False),
        _cand(5, allow, "Allow", due=False),
        _cand(6, allow, "Allow", due=False),
    ]
    due = [_cand(7, due_job, "BufferAll")]
    assert plan_ahead(ahead, due, [Active(9, busy, "running", "k", AT)]) == [1, 5, 6]


def test_plan_ahead_never_claims_a_newer_occurrence_before_a_pending_retry() -> None:
    """A failed, its retry is due after B's instant (the backoff): both are candidates of the
    claim-ahead window, B first by run_at. B claimed ahead would run, and A's retry would
    then wait behind it (Skip: for ever, while B runs). The retry goes first, as at
    decide_overlap; B is decided at its instant (skipped while A is active)."""
    job = uuid.uuid4()
    b = _cand(1, job, "Skip", due=False)  # fresh, due first
    a = _cand(2, job, "Skip", attempt=1, due=False)  # the earlier occurrence's retry
    a = dataclasses.replace(a, scheduled_for=datetime(2026, 1, 1))  # nominally before B
    assert plan_ahead([b, a], [], [Active(2, job, "pending", "a", AT)]) == [2]


def test_plan_ahead_claims_a_skip_jobs_next_occurrence_conditionally_behind_a_running_one() -> None:
    """Of a busy job, the next occurrence is claimed ahead conditionally only when the job
    is Skip, everything active of it is running and earlier, nothing of it is due and the
    occurrence is fresh (not a retry); one a job per claim."""
    jobs = [uuid.uuid4() for _ in range(8)]
    early = datetime(2025, 12, 31)
    late = datetime(2026, 2, 1)

    def active(i: int, job: uuid.UUID, state: str, at: datetime = early) -> Active:
        return Active(100 + i, job, state, f"k{i}", at)

    ahead = [
        _cand(1, jobs[0], "Skip", due=False),  # behind a running one: conditional
        _cand(2, jobs[0], "Skip", due=False),  # the job's second: not in this claim
        _cand(3, jobs[1], "Skip", due=False),  # behind a retry backing off
        _cand(4, jobs[2], "Skip", due=False),  # behind a waiting one
        _cand(5, jobs[3], "BufferOne", due=False),  # not Skip
        _cand(6, jobs[4], "Skip", attempt=1, due=False),  # a retry
        _cand(7, jobs[5], "Skip", due=False),  # something of its job is due
        _cand(8, jobs[6], "Skip", due=False),  # the running one is later
        _cand(9, jobs[7], "Skip", due=False),  # idle: claimed unconditionally
    ]
    runs = [
        active(0, jobs[0], "running"),
        active(1, jobs[1], "running"),
        active(2, jobs[1], "pending"),
        active(3, jobs[2], "waiting"),
        active(4, jobs[3], "running"),
        active(5, jobs[4], "running"),
        active(6, jobs[5], "running"),
        active(7, jobs[6], "running", late),
    ]
    conditional: set[int] = set()
    run = plan_ahead(ahead, [_cand(10, jobs[5], "Skip")], runs, conditional)
    assert (sorted(run), conditional) == ([1, 9], {1})
    assert plan_ahead(ahead, [], runs) == [9]  # no set: nothing conditional


async def _claim_ahead(db: Database) -> list[dispatch.Claimed]:
    return await dispatch.claim(
        db, pool="default", worker_id="w", limit=100, lease_seconds=30, ahead_seconds=60
    )


async def _retry_in(db: Database, a: dispatch.Claimed, seconds: float) -> None:
    """A's attempt fails; its retry is due in `seconds`."""
    state = await dispatch.fail(
        db,
        occurrence_id=a.id,
        fence=a.fence,
        next_state="pending",
        reason="Failed",
        error="boom",
        delay_seconds=seconds,
    )
    assert state == "pending"


async def _row(db: Database, key: str) -> dict[str, object]:
    (row,) = await sql(
        db,
        "SELECT state, attempt, reason, started_at,"
        " coalesce(conditional_at = claimed_at, false) AS conditional"
        " FROM cronwell_occurrences WHERE idempotency_key = %s",
        key,
    )
    return row


async def _running_and_next(db: Database, name: str) -> tuple[dispatch.Claimed, str]:
    """A Skip job: A runs (claimed when due), B is due in 30 s."""
    await make_job(db, name, schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    await trigger(db, name)
    (a,) = await _claim(db)
    b_key = await trigger(db, name)
    await due_in(db, b_key, 30.0)
    return a, b_key


async def test_overlap_of_an_occurrence_claimed_ahead_is_decided_at_its_instant(
    db: Database,
) -> None:
    """Skip: while A runs, B (due later) is claimed ahead conditionally, not skipped; at its
    instant its gate skips it if A is still active (never started, its attempt given back),
    and starts it if A is done. A later C, while B runs, is skipped at its gate."""
    a, b_key = await _running_and_next(db, "ov")
    (b,) = await _claim_ahead(db)
    assert (b.key, b.started_at, b.conditional) == (b_key, None, True)
    assert await dispatch.gate(db, [b], pool="default") == {b.id: dispatch.GATE_SKIP}
    assert await _row(db, b_key) == {
        "state": "skipped",
        "attempt": 0,
        "reason": "Overlap: an earlier occurrence is still active",
        "started_at": None,
        "conditional": True,
    }

    b2_key = await trigger(db, "ov")
    await due_in(db, b2_key, 30.0)
    (b2,) = await _claim_ahead(db)
    assert b2.conditional
    assert await dispatch.succeed(db, [(a.id, a.fence)]) == {a.key}
    assert await dispatch.gate(db, [b2], pool="default") == {b2.id: dispatch.GATE_START}
    assert await _row(db, b2_key) == {
        "state": "running",  # no write: its start is recorded as for any claimed ahead
        "attempt": 1,
        "reason": None,
        "started_at": None,
        "conditional": True,
    }

    c_key = await trigger(db, "ov")
    await due_in(db, c_key, 40.0)
    (c,) = await _claim_ahead(db)
    assert c.conditional
    await dispatch.record_starts(db, [(b2.id, b2.fence)])
    assert await dispatch.gate(db, [c], pool="default") == {c.id: dispatch.GATE_SKIP}
    assert await state_is(db, c_key, "skipped")


async def test_a_run_its_worker_saw_succeed_is_not_active_at_the_gate(db: Database) -> None:
    """A succeeded in B's worker, which has not written A's completion yet (completions
    wait while starts go first): at B's instant A is over, and B starts, not skipped."""
    a, _ = await _running_and_next(db, "ov")
    (b,) = await _claim_ahead(db)
    assert await dispatch.gate(db, [b], pool="default", over=[a.id]) == {b.id: dispatch.GATE_START}


async def test_a_conditional_claim_is_not_decided_under_a_lost_fence(db: Database) -> None:
    """B's gate, A still running, under a fence B no longer holds (its lease lapsed and
    another claim holds it under a newer fence) skips nothing: B's worker must not run it,
    and the newer claim's row is left as it is."""
    _, b_key = await _running_and_next(db, "ov")
    (b,) = await _claim_ahead(db)
    await sql(
        db,
        "UPDATE cronwell_occurrences SET fence = fence + 1 WHERE idempotency_key = %s",
        b_key,
    )
    assert await dispatch.gate(db, [b], pool="default") == {}
    assert (await _row(db, b_key))["state"] == "running"  # untouched: the other fence's


async def test_an_earlier_occurrence_given_back_runs_before_a_later_conditional_one(
    db: Database,
) -> None:
    """Skip: A is claimed ahead, B (after A) conditionally behind it; A's worker stops and
    gives A back unstarted. A, due, runs (B has not run: A is not skipped for overlapping
    what comes after it) and B's gate skips B. Given back before B's gate decides, A makes
    B step aside (given back, attempt not consumed); then A runs and B is skipped."""
    for order in ("a_first", "gate_first"):
        name = f"gb-{order.replace('_', '-')}"
        await make_job(db, name, schedule=FAR_FUTURE, concurrencyPolicy="Skip")
        a_key = await trigger(db, name)
        await due_in(db, a_key, 20.0)
        (a,) = await _claim_ahead(db)
        b_key = await trigger(db, name)
        await due_in(db, b_key, 30.0)
        (b,) = await _claim_ahead(db)
        assert (a.key, b.key, b.conditional) == (a_key, b_key, True)
        assert await dispatch.release(db, [(a.id, a.fence)]) == {a_key}
        await due_in(db, a_key, 0.0)
        if order == "gate_first":
            assert await dispatch.gate(db, [b], pool="default") == {b.id: dispatch.GATE_BACK}
            assert await _row(db, b_key) == {
                "state": "pending",
                "attempt": 0,
                "reason": None,
                "started_at": None,
                "conditional": False,
            }
            await due_in(db, b_key, 0.0)
            (a2,) = await _claim(db)
            assert a2.key == a_key
            assert await state_is(db, b_key, "skipped")
        else:
            (a2,) = await _claim(db)
            assert a2.key == a_key
            assert await dispatch.gate(db, [b], pool="default") == {b.id: dispatch.GATE_SKIP}
        assert await state_is(db, a_key, "running")


async def test_a_retry_runs_before_a_later_conditional_occurrence(db: Database) -> None:
    """Skip: A runs, B is claimed conditionally behind it; A fails and its retry is due
    before B's instant. The retry runs (not waiting behind B, which has not run), and B's
    gate then skips B."""
    a, b_key = await _running_and_next(db, "rt")
    (b,) = await _claim_ahead(db)
    assert (b.key, b.conditional) == (b_key, True)
    await _retry_in(db, a, 0.0)
    (retry,) = await _claim(db)
    assert (retry.key, retry.attempt) == (a.key, 2)
    assert await dispatch.gate(db, [b], pool="default") == {b.id: dispatch.GATE_SKIP}


async def test_a_worker_skips_a_skip_jobs_next_run_at_its_instant_never_two_at_once(
    db: Database, db_url: str
) -> None:
    """A per-second Skip job whose runs take 1.4 s, under a worker claiming ahead: the next
    occurrence is claimed (conditionally) while the previous one runs, and at its instant
    the worker skips it (never started, no effect) or starts it once the previous is done.
    The runs never overlap, and every occurrence is decided (none left running or
    pending behind)."""
    await sql(db, EFFECTS_DDL)
    await make_job(
        db,
        "slow",
        schedule="* * * * * *",
        concurrencyPolicy="Skip",
        target={"handler": {"name": "t-sleepy-effect", "payload": {"sleep": 1.4}}},
    )
    await set_cursor(db, "slow", "date_trunc('second', now()) + interval '2 s'")
    s = await scheduler(db, horizon_seconds=30.0)
    await s.materialise_until_idle()
    await set_cursor(db, "slow", "'infinity'")  # nothing more
    await sql(  # the instants 2-8 s from now: 6 or 7 of them
        db,
        "DELETE FROM cronwell_occurrences"
        " WHERE scheduled_for > date_trunc('second', now()) + interval '8 s'",
    )
    keys = [o["idempotency_key"] for o in await occurrences(db, "slow")]
    assert len(keys) >= 6
    async with running_worker(db_url, claim_ahead_seconds=3.0, lease_seconds=10.0) as w:

        async def decided() -> bool:
            states = [o["state"] for o in await occurrences(db, "slow")]
            return all(st in ("succeeded", "skipped") for st in states)

        await wait_for(decided, 30.0, "every occurrence decided")
    gated = [o.claimed.key for o in w.outcomes if o.result == "skipped"]
    assert gated, [(o.claimed.key, o.result) for o in w.outcomes]  # decided at the instant
    ran = sorted((m["t"], m["key"]) for m in marks_of(None, "start") if m["key"] in keys)
    done = {m["key"]: m["t"] for m in marks_of(None, "done") if m["key"] in keys}
    for (_, k1), (t2, k2) in itertools.pairwise(ran):
        assert t2 >= done[k1], f"{k2} started before {k1} was done"
    rows = await sql(
        db,
        "SELECT o.idempotency_key AS key, o.state, o.attempt, o.started_at,"
        " (SELECT count(*) FROM test_effects e WHERE e.key = o.idempotency_key) AS effects"
        " FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id"
        " WHERE j.name = 'slow'",
    )
    for r in rows:
        if r["state"] == "skipped":
            assert (r["attempt"], r["started_at"], r["effects"]) == (0, None, 0), r
        else:
            assert (r["state"], r["effects"]) == ("succeeded", 1), r
    assert {r["key"] for r in rows if r["state"] == "skipped"} >= set(gated)


async def test_a_gate_that_cannot_read_starts_nothing(db: Database, db_url: str) -> None:
    """B, claimed conditionally behind A, which is done by B's instant (its gate would start
    it): the database refuses the gate's read (a migration holds the history's lock, and
    the worker's statements give up on a lock after 0.3 s here). B does not start: the
    worker reports it not run (given back, or left to its lease when the database refuses
    that too)."""
    await handler_job(db, "gf", "t-clock", concurrencyPolicy="Skip")
    await trigger(db, "gf")
    (a,) = await _claim(db)  # A runs, held by another worker
    b_key = await trigger(db, "gf")
    await due_in(db, b_key, 4.0)
    await sql(
        db,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET lock_timeout = ''300ms''',"
        " current_database()); END $$",
    )
    async with running_worker(db_url, claim_ahead_seconds=5.0, lease_seconds=10.0) as w:
        await wait_for(lambda: state_is(db, b_key, "running"), 3.0, "B claimed ahead")
        assert await dispatch.succeed(db, [(a.id, a.fence)]) == {a.key}
        async with db.transaction() as stuck:
            await stuck.execute("LOCK TABLE cronwell_occurrences IN ACCESS EXCLUSIVE MODE")
            out = await w.outcome(b_key, timeout=10.0)
    assert out.result in ("released", "stale"), out
    assert marks_of(None, "start", b_key) == []


async def test_a_retry_in_backoff_runs_before_a_newer_occurrence_due_first(db: Database) -> None:
    """Skip: A fails and retries in 2 s; B is due in 1 s. The claim ahead takes A's retry,
    not B; at its instant B is skipped (A is active), never run ahead of A's retry."""
    await make_job(db, "rb", schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    a_key = await trigger(db, "rb")
    (a,) = await _claim(db)
    await _retry_in(db, a, 2.0)
    b_key = await trigger(db, "rb")
    await due_in(db, b_key, 1.0)
    (retry,) = await _claim_ahead(db)
    assert (retry.key, retry.attempt) == (a_key, 2)
    await due_in(db, b_key, 0.0)
    assert await _claim_ahead(db) == []
    assert await state_is(db, b_key, "skipped")


def test_hold_back_leaves_a_job_behind_the_earlier_occurrence_another_claimer_holds() -> None:
    held, mine, allow = (uuid.uuid4() for _ in range(3))
    at = datetime(2026, 1, 1)

    def cand(i: int, job: uuid.UUID, policy: str, before: int | None) -> Candidate:
        return Candidate(i, job, policy, 0, at.replace(second=i), at, False, before)

    cands = [
        cand(2, held, "Skip", before=1),  # #1 is pending and not here: another claimer has it
        cand(3, held, "Skip", before=None),  # after #2: held back with it
        cand(5, mine, "Skip", before=4),  # #4 is pending and here: decided in this claim
        cand(4, mine, "Skip", before=None),
        cand(6, allow, "Allow", before=None),
    ]
    assert [c.id for c in dispatch.hold_back(cands)] == [5, 4, 6]


def _decide_per_object(
    cands: list[Candidate], active: list[Active], due_limit: int | None, conditional: set[int]
) -> tuple[list[int], list[tuple[int, str, str]]]:
    """A claim's decisions with an object per candidate (before its candidates came as
    arrays): hold_back over all, the first `due_limit` due ones decided, the rest planned."""
    kept = dispatch.hold_back(cands)
    due = [c for c in kept if c.due]
    run, settle = decide_overlap(due[:due_limit], active)
    return run + plan_ahead([c for c in kept if not c.due], due, active, conditional), settle


def _as_arrays(cands: list[Candidate]) -> Candidates:
    """The candidates as OccurrenceClaimCandidates returns them: a serialised job's columns
    only, None for a job that allows overlap."""

    def col(f: str) -> list[object]:
        return [getattr(c, f) if c.overlap in dispatch.SERIAL else None for c in cands]

    at = [c.scheduled_for for c in cands]
    return Candidates(
        [c.id for c in cands],
        [c.due for c in cands],
        *(col(f) for f in ("job_id", "overlap", "attempt", "scheduled_for", "run_at")),
        col("pending_before"),
        min(at),
        max(at),
    )


def test_a_claim_decides_from_its_arrays_as_with_an_object_per_candidate() -> None:
    """Random claims (policies, retries, due or ahead, earlier occurrences pending here or
    held by another claimer, active occurrences, due limits): deciding from the arrays, with
    objects only for the candidates that need them, runs, skips and buffers the same
    occurrences as an object per candidate did. A candidate claimed from the arrays alone
    that needed a decision (a second of its job, one behind an active run or a held earlier
    occurrence) would differ."""
    rng = random.Random(20261205)
    policies = [*dispatch.SERIAL_ORDER, "Allow"]
    fast = 0
    for _ in range(2000):
        jobs = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(rng.randint(1, 5))]
        policy = {j: rng.choice(policies) for j in jobs}
        cands = []
        for i in range(1, rng.randint(1, 10) + 1):
            job = rng.choice(jobs)
            before = rng.choice([None, None, i - 1, 100 + i])  # here, or another claimer's
            at = datetime(2026, 1, 1, 0, 0, i)
            serial = policy[job] in dispatch.SERIAL
            cands.append(
                Candidate(
                    i,
                    job,
                    policy[job],
                    rng.choice([0, 0, 1]),
                    at,
                    at,
                    rng.random() < 0.6,
                    before if serial else None,
                )
            )
        # Active: a run of its own, or one of its job's candidates (a retry backing off).
        active = [
            Active(rng.choice([200 + n, *own]), job, state, f"k{n}", AT, prev)
            for n, job in enumerate(jobs)
            for own in [[c.id for c in cands if c.job_id == job]]
            if policy[job] in dispatch.SERIAL and rng.random() < 0.3
            for state in [rng.choice(["running", "waiting", "pending"])]
            # Conditional, its instant not come: the candidate just before it, or another.
            for prev in [rng.choice([None, None, None, *own, 300 + n])]
        ]
        due_limit = rng.choice([None, 0, 1, 3])
        conditional: set[int] = set()
        want_conditional: set[int] = set()
        run, settle = dispatch.decide(_as_arrays(cands), active, due_limit, conditional)
        want_run, want_settle = _decide_per_object(cands, active, due_limit, want_conditional)
        assert (sorted(run), sorted(settle), conditional) == (
            sorted(want_run),
            sorted(want_settle),
            want_conditional,
        ), (
            cands,
            active,
            due_limit,
        )
        fast += bool(run)
    assert fast > 500  # most trials claim something


@pytest.mark.parametrize("due", [False, True], ids=["ahead", "due"])
async def test_a_serialised_job_runs_in_order_while_another_claimer_holds_its_earlier_occurrence(
    db: Database, due: bool
) -> None:
    """Skip: A and B pending, nothing active. Another claimer has A locked (SKIP LOCKED hides
    it), so this claim sees only B: B stays pending (neither claimed ahead nor run), and
    once A is free A runs and B is decided behind it: skipped at its instant. Before the
    fix B was claimed while A waited, and A was then skipped as overlapping B."""
    await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    a_key = await trigger(db, "ov")
    b_key = await trigger(db, "ov")
    await due_in(db, a_key, 0.0 if due else 20.0)
    await due_in(db, b_key, 0.0 if due else 30.0)
    async with db.transaction() as other:  # a concurrent claim with A among its candidates
        await other.execute(
            "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s FOR UPDATE", (a_key,)
        )
        assert await _claim_ahead(db) == []
        assert await state_is(db, b_key, "pending")
    (a,) = await _claim_ahead(db)
    assert a.key == a_key
    assert await state_is(db, b_key, "skipped" if due else "pending")


async def test_a_job_moved_to_another_pool_does_not_wait_on_its_old_pools_occurrence(
    db: Database,
) -> None:
    """A's pool has no workers any more (the job moved): B, in the new pool, is not held
    behind A, which only the old pool's workers could decide."""
    await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    a_key = await trigger(db, "ov")
    await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Skip", pool="moved")
    b_key = await trigger(db, "ov")
    (b,) = await dispatch.claim(db, pool="moved", worker_id="w", limit=10, lease_seconds=30)
    assert b.key == b_key
    assert await state_is(db, a_key, "pending")


async def test_a_claim_does_not_wait_for_the_materialisers_lock_on_its_job(db: Database) -> None:
    """The materialiser holds its batch of job rows (FOR UPDATE) while it inserts their
    occurrences: a claim of a serialised job's due occurrence decides it meanwhile. It
    took the job's row lock before, and waited for the materialiser's whole batch."""
    job = await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    key = await trigger(db, "ov")
    async with db.transaction() as materialiser:
        await materialiser.execute(
            "SELECT id FROM cronwell_jobs WHERE id = %s FOR UPDATE", (job.id,)
        )
        (c,) = await asyncio.wait_for(_claim(db), 30)
        assert c.key == key
        assert await state_is(db, key, "running")


async def test_claims_of_one_job_wait_for_each_other(db: Database) -> None:
    """The job's lock is real: while another transaction holds it (a claim deciding the
    job, a promotion, a backfill), a claim of the job's occurrence waits, then decides it
    with what that transaction wrote (here: an earlier run of the job, running)."""
    job = await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Skip")
    key = await trigger(db, "ov")
    async with db.transaction() as holder:
        await claims.lock_jobs(db, [job.id], conn=holder)
        claim = asyncio.create_task(_claim(db))
        await wait_for(lambda: waiting_for_a_job_lock(db), 10, "the claim to wait for the lock")
        assert not claim.done()
        await holder.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt, fence,"
            " worker_id, claimed_at, started_at, lease_expires_at)"
            " SELECT 'earlier', %s, 'default', now() - interval '1 minute',"
            " now() - interval '1 minute', 'running', 'Skip', 'AtLeastOnce', 1, 60, 1, 1, 'x',"
            " now(), now(), now() + interval '1 minute'",
            (job.id,),
        )
    assert await asyncio.wait_for(claim, 30) == []
    assert await state_is(db, key, "skipped")


async def test_claims_of_a_pool_take_turns(db: Database) -> None:
    """While a claim of the pool holds its turn, the next claim waits for it rather than
    claiming beside it, then claims what the first left (here: everything)."""
    await make_job(db, "ov", schedule=FAR_FUTURE)
    key = await trigger(db, "ov")
    turn = dispatch.ClaimTurn()
    turn.wait_seconds = 60  # a hang guard only: the holder lets go below
    async with db.transaction() as holder:
        assert await claims.take_turn(db, pool="default", wait_seconds=0, conn=holder)
        claim = asyncio.create_task(
            dispatch.claim(db, pool="default", worker_id="w", limit=10, lease_seconds=30, turn=turn)
        )
        await wait_for(
            lambda: waiting_for_an_advisory_lock(db, claims.CLAIM_TURN_CLASS),
            10,
            "the claim to wait for the pool's turn",
        )
        assert not claim.done()
        assert await state_is(db, key, "pending")
    assert [c.key for c in await asyncio.wait_for(claim, 30)] == [key]
    assert turn.wait_seconds == dispatch.TURN_WAIT_SECONDS


async def test_a_claim_goes_ahead_of_a_turn_that_is_not_let_go(db: Database) -> None:
    """The turn is a preference: a claim that waited TURN_WAIT_SECONDS for a holder that
    never lets go (paused mid-claim) claims beside it; its worker's next claims do not wait
    for the turn until one finds it free."""
    await make_job(db, "ov", schedule=FAR_FUTURE, concurrencyPolicy="Allow")
    first, second = await trigger(db, "ov"), await trigger(db, "ov")
    turn = dispatch.ClaimTurn()
    async with db.transaction() as holder:
        assert await claims.take_turn(db, pool="default", wait_seconds=0, conn=holder)
        (c,) = await dispatch.claim(
            db, pool="default", worker_id="w", limit=1, lease_seconds=30, turn=turn
        )
        assert c.key == first
        assert turn.wait_seconds == 0  # the next claim only tries
        (c,) = await dispatch.claim(
            db, pool="default", worker_id="w", limit=1, lease_seconds=30, turn=turn
        )
        assert c.key == second
        assert turn.wait_seconds == 0
    assert (
        await dispatch.claim(
            db, pool="default", worker_id="w", limit=1, lease_seconds=30, turn=turn
        )
        == []
    )
    assert turn.wait_seconds == dispatch.TURN_WAIT_SECONDS  # the turn was free


async def test_waiting_for_the_turn_leaves_the_lock_timeout_as_it_was(db: Database) -> None:
    """The turn's bounded wait sets lock_timeout for that wait only: the claim's later
    waits (the jobs' locks) keep the session's setting, whether the turn came or not."""
    async with db.transaction() as holder:
        assert await claims.take_turn(db, pool="default", wait_seconds=0, conn=holder)
        async with db.transaction() as conn:
            await conn.execute("SET LOCAL lock_timeout = '7s'")
            assert not await claims.take_turn(db, pool="default", wait_seconds=0.05, conn=conn)
            cur = await conn.execute("SELECT current_setting('lock_timeout') AS t")
            assert (await cur.fetchone() or {})["t"] == "7s"
    async with db.transaction() as conn:
        await conn.execute("SET LOCAL lock_timeout = '7s'")
        assert await claims.take_turn(db, pool="default", wait_seconds=0.05, conn=conn)
        assert await claims.take_turn(db, pool="other", wait_seconds=0.05, conn=conn)
        cur = await conn.execute("SELECT current_setting('lock_timeout') AS t")
        assert (await cur.fetchone() or {})["t"] == "7s"


async def test_a_backfill_takes_the_jobs_lock(db: Database) -> None:
    """A backfill writes a job's earlier occurrences under the job's lock: it waits while
    a claim deciding the job holds it (and a claim waits for it: the same lock, above)."""
    job = await make_job(db, "ov", schedule="* * * * *", concurrencyPolicy="Skip")
    end = (await db_now(db)).replace(second=0, microsecond=0) - timedelta(minutes=1)
    async with db.transaction() as holder:
        await claims.lock_jobs(db, [job.id], conn=holder)
        run = asyncio.create_task(
            backfill(db, namespace="default", name="ov", start=end - timedelta(minutes=3), end=end)
        )
        await wait_for(lambda: waiting_for_a_job_lock(db), 10, "the backfill to wait")
        assert not run.done()
    result = await asyncio.wait_for(run, 30)
    assert len(result.created) == 4
