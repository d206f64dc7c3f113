"""Overlap (concurrencyPolicy) decided at claim time under the job's row lock."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import pytest

from cronwell import dispatch
from cronwell.dispatch import Active, Candidate, decide_overlap
from cronwell.scheduler import Scheduler
from cronwell.store.db import Database
from tests.helpers.store import fail_dead

from .helpers import make_job, occurrences, scheduler, set_cursor


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
    assert await dispatch.succeed(db, [(first[0].key, first[0].fence)]) == {first[0].key}
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
        await dispatch.succeed(db, [(claimed[0].key, claimed[0].fence)])
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
    assert await dispatch.succeed(db, [(claimed[0].key, claimed[0].fence)]) == set()
    states = {o["idempotency_key"]: o["state"] for o in await occurrences(db, "ov")}
    assert states[claimed[0].key] == "cancelled" and states[newer[0].key] == "running"


def _cand(i: int, job: uuid.UUID, policy: str, attempt: int = 0) -> Candidate:
    return Candidate(i, job, policy, attempt, datetime(2026, 1, 1, 0, 0, i))


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
        [_cand(1, job, policy), _cand(2, job, policy)], [Active(99, job, active_state, "k")]
    )
    assert (run, [s[1] for s in settle if s[0] != 99]) == expected


def test_decide_overlap_retry_resumes_before_newer() -> None:
    job = uuid.uuid4()
    run, settle = decide_overlap([_cand(1, job, "Skip", attempt=2), _cand(2, job, "Skip")], [])
    assert run == [1] and settle == [
        (2, "skipped", "Overlap: an earlier occurrence is still active")
    ]


def test_decide_overlap_jobs_are_independent() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    run, _ = decide_overlap(
        [_cand(1, a, "Skip"), _cand(2, b, "Skip")], [Active(9, a, "running", "k")]
    )
    assert run == [2]
