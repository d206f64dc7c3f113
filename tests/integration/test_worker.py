"""The worker runtime in-process against the real PostgreSQL: fenced completion, HTTP
headers, error classification, backoff, dead-lettering and replay, suspendAfterFailures,
AtMostOnce, LeaseLost aborts (async and sync handlers), self-fencing, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from cronwell import dispatch, maintenance
from cronwell.dispatch import Claimed
from cronwell.errors import LeaseLost
from cronwell.models import RetryPolicy
from cronwell.schedule import format_instant
from cronwell.sdk import Context
from cronwell.settings import WorkerSettings
from cronwell.store import claims, processes
from cronwell.store.db import Database
from cronwell_worker.runtime import Worker, backoff_seconds, plan_claims, self_fence_margin
from tests.helpers.wait import wait_for

from .helpers import db_now, make_job, sql, waiting_for_a_job_lock
from .worker_helpers import (
    CONTROL,
    EFFECTS_DDL,
    FAR_FUTURE,
    attempts,
    burst_in,
    due_in,
    handler_job,
    http_server,
    marks_of,
    occurrence,
    requeue,
    running_worker,
    started,
    state_is,
    steal,
    trigger,
)

# -- pure logic -----------------------------------------------------------------------------


def test_backoff_is_exponential_capped_and_jittered_into_half_to_full() -> None:
    p = RetryPolicy(initial_delay_seconds=2, factor=3, max_delay_seconds=50)
    rng = random.Random(7)
    for attempt, base in [(1, 2), (2, 6), (3, 18), (4, 50), (9, 50)]:
        for _ in range(200):
            d = backoff_seconds(p, attempt, rng)
            assert 0.5 * base <= d < base, (attempt, d)


def test_self_fence_margin_is_below_the_lease() -> None:
    assert self_fence_margin(1.0) == pytest.approx(0.1)
    assert self_fence_margin(60.0) == 1.0


def test_a_burst_is_claimed_from_its_share_over_the_rate_before_it_and_the_next_waits() -> None:
    """Each instant's share (its count / workers + slack) is claimed before it at the
    measured rate with a margin, after the shares before it; capped by the widest window."""
    kw = {"rate": 1000.0, "min_window": 2.0, "max_window": 30.0, "slack": 10, "margin": 1.0}
    # 10,000 due in 20 s, two workers: 5,010 to claim at 1,000/s + 1 s: from 6.01 s before.
    plan = plan_claims([(20.0, 10_000)], workers=2, **kw)
    assert plan.window == 2.0 and plan.quota == 0
    assert plan.next_in == pytest.approx(20.0 - 6.01)
    plan = plan_claims([(5.0, 10_000), (25.0, 100)], workers=2, **kw)
    assert (plan.window, plan.quota) == (5.0, 5010)
    # The second instant's claim comes after the first's share: 25 - (5,010 + 52) / 1,000 - 1
    # (50 + a slack of 5 %, 2: a small burst's slack is not a whole claim batch).
    assert plan.next_in == pytest.approx(25.0 - 5.062 - 1.0)
    # 100 over two workers with a claim batch of 256 as the most slack: 52 each, not all 100
    # for the first to look (its 64 slots would start only 64 of them at the instant).
    plan = plan_claims([(1.0, 100)], workers=2, **kw | {"slack": 256})
    assert plan.quota == 52
    # Within the least window: always, up to the share; a huge burst: at most 30 s early.
    plan = plan_claims([(1.0, 7), (29.0, 10**7)], workers=1, **kw)
    assert (plan.window, plan.quota, plan.next_in) == (29.0, 7 + 10**7, None)


def test_claimed_instants_take_no_claiming_time_from_later_ones_but_one_being_claimed_does() -> (
    None
):
    """A steady stream (10,000 per-second jobs, two workers): the instants already claimed
    leave the next one's claim to its own share, so the plan settles near and a look reads
    no farther; counted whole, each second's share pushed the next claim earlier and the
    plan never settled. A burst with some left to claim still counts whole (claimed from
    the front, not just in time)."""
    kw = {"rate": 5000.0, "min_window": 2.0, "max_window": 30.0, "slack": 256, "margin": 1.0}
    stream = [(float(t), 10_000) for t in range(31)]
    claimed = [0, 0, 0] + [10_000] * 28  # the instants within the window are claimed
    old = plan_claims(stream, workers=2, **kw)
    assert old.next_in is None  # read to the widest: 5,250 a second at 5,000/s never fits
    plan = plan_claims(stream, workers=2, **kw, pending=claimed)
    # The third second's share (5,250 at 5,000/s + 1 s) is due to start in 3 - 2.05 s.
    assert plan.next_in == pytest.approx(3.0 - 2.05)
    assert (plan.window, plan.quota) == (2.0, 3 * 5250)
    # A burst at 20 s with one occurrence left: its whole share still leads it.
    burst = [(20.0, 10_000)]
    assert plan_claims(burst, workers=2, **kw, pending=[1]) == plan_claims(burst, workers=2, **kw)


def _ctx() -> Context:
    return Context(key="k", fence=1, scheduled_for=datetime.now(UTC), attempt=1,
                   namespace="n", name="j")  # fmt: skip


def test_context_cancellation_before_and_after_its_event_is_first_used() -> None:
    early = _ctx()
    early.cancel()
    assert early.cancelled.is_set()  # made after cancel(): born set
    with pytest.raises(LeaseLost):
        early.check_cancelled()
    late = _ctx()
    event = late.cancelled
    late.check_cancelled()  # not cancelled: no error
    late.cancel()
    assert event.is_set() and late.cancelled is event
    with pytest.raises(LeaseLost):
        late.check_cancelled()
    direct = _ctx()
    direct.cancelled.set()  # what code written against the Event does
    with pytest.raises(LeaseLost):
        direct.check_cancelled()
    direct.cancelled.clear()
    direct.check_cancelled()  # cleared: the Event is the truth once it exists


# -- completion -----------------------------------------------------------------------------


async def test_handler_job_completes_with_exactly_one_succeeded_attempt(
    db: Database, db_url: str
) -> None:
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "ok", "t-sleepy-effect")
    async with running_worker(db_url) as w:
        key = await trigger(db, "ok")
        o = await wait_for(lambda: state_is(db, key, "succeeded"))
        assert (await w.outcome(key)).result == "succeeded"
    atts = await attempts(db, key)
    assert [(a["attempt"], a["outcome"], a["fence"]) for a in atts] == [
        (1, "succeeded", o["fence"])
    ]
    assert atts[0]["worker_id"] == w.worker.id
    assert await sql(db, "SELECT key, fence FROM test_effects") == [
        {"key": key, "fence": o["fence"]}
    ]
    assert w.results(key) == ["succeeded"]


async def test_http_target_sends_key_fence_instant_and_attempt(db: Database, db_url: str) -> None:
    with http_server([503, 200]) as srv:
        await make_job(
            db,
            "hook",
            schedule=FAR_FUTURE,
            target={"http": {"url": srv.url, "headers": {"X-Test": "yes"}, "body": "{}"}},
            retry={"maxAttempts": 3, "initialDelaySeconds": 0},
        )
        async with running_worker(db_url):
            key = await trigger(db, "hook")
            o = await wait_for(lambda: state_is(db, key, "succeeded"))
    atts = await attempts(db, key)
    assert [a["outcome"] for a in atts] == ["failed", "succeeded"]
    assert "503" in atts[0]["error"]
    assert atts[0]["fence"] < atts[1]["fence"] == o["fence"]
    assert len(srv.requests) == 2
    for req, att in zip(srv.requests, atts, strict=True):
        h = {k.lower(): v for k, v in req.headers.items()}
        assert req.method == "POST" and req.body == b"{}"
        assert h["idempotency-key"] == key
        assert h["cronwell-fence-token"] == str(att["fence"])
        assert h["cronwell-scheduled-for"] == format_instant(o["scheduled_for"])
        assert h["cronwell-attempt"] == str(att["attempt"])
        assert h["x-test"] == "yes"


# -- error classification -------------------------------------------------------------------


async def test_http_4xx_is_not_retried_but_408_429_and_5xx_are(db: Database, db_url: str) -> None:
    expect = {400: False, 404: False, 408: True, 429: True, 500: True}
    keys: dict[int, str] = {}
    with http_server() as srv:
        for status in expect:
            await make_job(
                db,
                f"s{status}",
                schedule=FAR_FUTURE,
                target={"http": {"url": f"{srv.base}/status/{status}"}},
                retry={"maxAttempts": 2, "initialDelaySeconds": 0},
            )
        async with running_worker(db_url):
            for status in expect:
                keys[status] = await trigger(db, f"s{status}")
            for key in keys.values():
                await wait_for(lambda key=key: state_is(db, key, "dead"))  # type: ignore[misc]
    for status, retried in expect.items():
        o = await occurrence(db, keys[status])
        assert f"answered {status}" in o["last_error"]
        if retried:
            assert (o["attempt"], o["reason"]) == (2, "AttemptsExhausted"), status
        else:
            assert (o["attempt"], o["reason"]) == (1, f"HTTP{status}"), status


async def test_unknown_handler_and_invalid_target_are_dead_with_a_reason_worker_goes_on(
    db: Database, db_url: str
) -> None:
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "nohandler", "no-such-handler")
    await make_job(
        db,
        "badenv",
        schedule=FAR_FUTURE,
        target={
            "http": {
                "url": "http://127.0.0.1:9/x",
                "headers": {"Authorization": "Bearer ${env:CRONWELL_TEST_SURELY_UNSET}"},
            }
        },
    )
    await make_job(db, "corrupt", schedule=FAR_FUTURE)
    bad = {"corrupt": await trigger(db, "corrupt")}
    # The stored spec is damaged after the occurrence exists (the worker reads it at claim).
    await sql(db, "UPDATE cronwell_jobs SET spec = spec - 'target' WHERE name = 'corrupt'")
    await handler_job(db, "good", "t-sleepy-effect")
    async with running_worker(db_url) as w:
        bad |= {n: await trigger(db, n) for n in ("nohandler", "badenv")}
        for key in bad.values():
            await wait_for(lambda key=key: state_is(db, key, "dead"))  # type: ignore[misc]
        good = await trigger(db, "good")
        await wait_for(lambda: state_is(db, good, "succeeded"))
        assert not w.task.done()
    o = await occurrence(db, bad["nohandler"])
    assert (o["reason"], o["attempt"]) == ("UnknownHandler", 1)
    assert "no handler named 'no-such-handler'" in o["last_error"]
    assert "--import" in o["last_error"]
    o = await occurrence(db, bad["badenv"])
    assert (o["reason"], o["attempt"]) == ("InvalidTarget", 1)
    assert "CRONWELL_TEST_SURELY_UNSET" in o["last_error"]
    o = await occurrence(db, bad["corrupt"])
    assert (o["reason"], o["attempt"]) == ("InvalidTarget", 1)
    assert "stored spec is invalid" in o["last_error"]


# -- retries, dead-lettering, replay --------------------------------------------------------


async def test_backoff_moves_run_at_then_dead_then_replay_keeps_the_key(
    db: Database, db_url: str
) -> None:
    CONTROL["retrying"] = True
    await handler_job(
        db,
        "retrying",
        "t-fail-while",
        retry={"maxAttempts": 3, "initialDelaySeconds": 10, "factor": 2},
    )

    async def attempt_recorded(n: int) -> list[dict[str, Any]] | None:
        atts = await attempts(db, key)
        return atts if len(atts) >= n else None

    async with running_worker(db_url):
        key = await trigger(db, "retrying")
        for n, base in [(1, 10.0), (2, 20.0)]:
            atts = await wait_for(lambda n=n: attempt_recorded(n))  # type: ignore[misc]
            o = await occurrence(db, key)
            assert (o["state"], o["reason"], o["attempt"]) == ("pending", "Failed", n)
            assert "failing on purpose" in o["last_error"]
            # The failure and the new run_at were written in one transaction: same now().
            delay = (o["run_at"] - atts[-1]["finished_at"]).total_seconds()
            assert 0.5 * base <= delay < base, (n, delay)
            # Time passes (the test does not wait out the backoff).
            await sql(
                db, "UPDATE cronwell_occurrences SET run_at = now() WHERE idempotency_key = %s", key
            )
        o = await wait_for(lambda: state_is(db, key, "dead"))
        assert (o["reason"], o["attempt"], o["max_attempts"]) == ("AttemptsExhausted", 3, 3)
        assert "failing on purpose" in o["last_error"]
        assert CONTROL["calls:retrying"] == 3

        CONTROL["retrying"] = False
        replayed = await dispatch.replay_dead(db, key=key)
        assert [(r.idempotency_key, r.max_attempts) for r in replayed] == [(key, 6)]
        o = await wait_for(lambda: state_is(db, key, "succeeded"))
    atts = await attempts(db, key)
    assert [(a["attempt"], a["outcome"]) for a in atts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "succeeded"),
    ]
    fences = [a["fence"] for a in atts]
    assert fences == sorted(set(fences)), "fences must strictly increase"
    assert o["fence"] == fences[-1] and o["idempotency_key"] == key
    assert CONTROL["calls:retrying"] == 4


async def test_suspend_after_failures_counts_dead_runs_in_a_row(db: Database, db_url: str) -> None:
    await handler_job(db, "flaky", "t-fail-while", retry={"maxAttempts": 1}, suspendAfterFailures=2)

    async def job() -> dict[str, Any]:
        (row,) = await sql(
            db,
            "SELECT consecutive_failures, suspended, suspended_reason FROM cronwell_jobs "
            "WHERE name = 'flaky'",
        )
        return row

    async with running_worker(db_url):
        for failing, expect in [
            (True, (1, False, None)),
            (False, (0, False, None)),  # a success resets the count
            (True, (1, False, None)),
            (True, (2, True, "SuspendedAfterFailures")),
        ]:
            CONTROL["flaky"] = failing
            key = await trigger(db, "flaky")
            await wait_for(lambda key=key: state_is(db, key, "dead", "succeeded"))  # type: ignore[misc]
            j = await job()
            assert (j["consecutive_failures"], j["suspended"], j["suspended_reason"]) == expect


# -- AtMostOnce -----------------------------------------------------------------------------


async def test_at_most_once_never_reruns_an_ambiguous_attempt(db: Database, db_url: str) -> None:
    CONTROL["amo"] = True
    await handler_job(
        db,
        "amo",
        "t-fail-while",
        delivery="AtMostOnce",
        retry={"maxAttempts": 5, "initialDelaySeconds": 0},
    )
    await handler_job(db, "amo-lease", "t-fail-while", delivery="AtMostOnce")
    port = _closed_port()
    await make_job(
        db,
        "amo-refused",
        schedule=FAR_FUTURE,
        delivery="AtMostOnce",
        target={"http": {"url": f"http://127.0.0.1:{port}/x"}},
        retry={"maxAttempts": 2, "initialDelaySeconds": 0},
    )
    # A worker claimed "amo-lease" and vanished: its lease runs out, the reaper decides.
    lease_key = await trigger(db, "amo-lease")
    (c,) = await dispatch.claim(db, pool="default", worker_id="gone", limit=5, lease_seconds=60)
    await sql(
        db,
        "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = %s",
        lease_key,
    )
    reaped = await maintenance.reap(db, limit=10)
    assert [(r.state, r.reason) for r in reaped] == [("dead", "Ambiguous")]

    async with running_worker(db_url):
        key = await trigger(db, "amo")
        o = await wait_for(lambda: state_is(db, key, "dead"))
        refused = await trigger(db, "amo-refused")
        r = await wait_for(lambda: state_is(db, refused, "dead"))
        # Replays skip Ambiguous occurrences unless asked.
        assert await dispatch.replay_dead(db, name="amo") == []
        assert await dispatch.replay_dead(db, key=lease_key) == []
        await asyncio.sleep(0.5)  # give the worker every chance to (wrongly) run them again
    assert (o["reason"], o["attempt"]) == ("Ambiguous", 1)
    assert CONTROL["calls:amo"] == 1, "an ambiguous AtMostOnce attempt ran again"
    assert [a["outcome"] for a in await attempts(db, key)] == ["failed"]
    lease = await occurrence(db, lease_key)
    assert (lease["state"], lease["reason"], lease["attempt"]) == ("dead", "Ambiguous", 1)
    assert CONTROL.get("calls:amo-lease", 0) == 0
    assert [a["outcome"] for a in await attempts(db, lease_key)] == ["lease_expired"]
    # Refused connections sent nothing: safe to retry even AtMostOnce.
    assert (r["reason"], r["attempt"]) == ("AttemptsExhausted", 2)
    assert c.key == lease_key


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


# -- LeaseLost ------------------------------------------------------------------------------


async def test_lease_lost_cancels_an_async_handler_at_once(db: Database, db_url: str) -> None:
    await handler_job(db, "waiter", "t-wait-event")
    async with running_worker(db_url, lease_seconds=1.5) as w:
        key = await trigger(db, "waiter")
        first = await started(key)
        thief = await steal(db, key)
        stolen_at = time.monotonic()

        async def cancelled() -> list[dict[str, Any]]:
            return marks_of(None, "cancelled", key)

        (m,) = await wait_for(cancelled, 5, "the handler to be cancelled")
        # Caught by the next heartbeat (every lease/3 = 0.5 s).
        assert m["t"] - stolen_at < 1.5
        assert m["flag"] is True and m["fence"] == first["fence"] < thief.fence
        outcome = await w.outcome(key)
        assert (outcome.result, outcome.error) == ("lease_lost", "lease_lost")
    o = await occurrence(db, key)
    assert (o["state"], o["fence"], o["worker_id"]) == ("running", thief.fence, "thief")
    await _the_thief_completes(db, key, first["fence"], thief)


@pytest.mark.parametrize(
    ("handler", "event"),
    [("t-sync-spin", "injected"), ("t-sync-polite", "saw-flag")],
)
async def test_lease_lost_stops_a_sync_handler(
    db: Database, db_url: str, handler: str, event: str
) -> None:
    """t-sync-spin never looks at ctx.cancelled: LeaseLost raised inside its thread stops
    it. t-sync-polite swallows exceptions: ctx.cancelled stops it."""
    await handler_job(db, "sync", handler)
    async with running_worker(db_url, lease_seconds=1.5) as w:
        key = await trigger(db, "sync")
        await started(key)
        thief = await steal(db, key)
        stolen_at = time.monotonic()
        (m,) = await wait_for(lambda: _marks(event, key), 5, f"the handler to see {event}")
        assert m["t"] - stolen_at < 1.5
        assert (await w.outcome(key)).result == "lease_lost"
    assert not marks_of(None, "done", key)
    o = await occurrence(db, key)
    assert (o["state"], o["fence"]) == ("running", thief.fence)


async def _marks(event: str, key: str) -> list[dict[str, Any]]:
    return marks_of(None, event, key)


# -- timeout ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "event"), [("t-wait-event", "cancelled"), ("t-sync-spin", "injected")]
)
async def test_an_attempt_past_its_timeout_is_stopped_never_before_it_and_failed(
    db: Database, db_url: str, handler: str, event: str, caplog: pytest.LogCaptureFixture
) -> None:
    """timeoutSeconds bounds each attempt from its start: the handler is stopped (an async
    one cancelled, a sync one's thread interrupted), not before the timeout, and the
    attempt is a failure with outcome `timeout`, retried as any failure is. A timeout is
    the attempt's own ending, not a lease lost or a shutdown. A stopped sync handler's
    ending is consumed, not left to the collector to log as a future never retrieved."""
    await handler_job(
        db, "slow", handler, timeoutSeconds=1, retry={"maxAttempts": 2, "initialDelaySeconds": 0}
    )
    async with running_worker(db_url) as w:
        key = await trigger(db, "slow")
        o = await wait_for(lambda: state_is(db, key, "dead"), 15, "both attempts to time out")
        assert w.results(key) == ["retry", "dead"]
    assert o["reason"] == "AttemptsExhausted"
    atts = await attempts(db, key)
    assert [(a["attempt"], a["outcome"], a["error"]) for a in atts] == [
        (n, "timeout", "attempt timed out after 1s") for n in (1, 2)
    ]
    starts, stops = marks_of(None, "start", key), marks_of(None, event, key)
    assert [m["attempt"] for m in starts] == [m["attempt"] for m in stops] == [1, 2]
    for start, stop in zip(starts, stops, strict=True):
        # The timeout runs from just before the handler's first line, which marks the start.
        assert stop["t"] - start["t"] >= 1.0 - 0.005, "stopped before its timeout"
    assert not marks_of(None, "done", key)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_an_attempt_within_its_timeout_succeeds_and_a_later_one_still_times_out(
    db: Database, db_url: str
) -> None:
    """A timer is not left behind by an attempt that finished (it would cancel whatever the
    task runs next), and attempts of different timeouts each get their own."""
    await handler_job(db, "quick", "t-wait-event", timeoutSeconds=1, retry={"maxAttempts": 1})
    await handler_job(db, "long", "t-wait-event", timeoutSeconds=3, retry={"maxAttempts": 1})
    async with running_worker(db_url) as w:
        quick = await trigger(db, "quick")
        await started(quick)
        CONTROL.setdefault(quick, asyncio.Event()).set()
        await wait_for(lambda: state_is(db, quick, "succeeded"), 10, "the quick one to succeed")
        long = await trigger(db, "long")
        start = await started(long)
        await wait_for(lambda: state_is(db, long, "dead"), 15, "the long one to time out")
        assert (w.results(quick), w.results(long)) == (["succeeded"], ["dead"])
    (stop,) = marks_of(None, "cancelled", long)
    assert stop["t"] - start["t"] >= 3.0 - 0.005
    assert not marks_of(None, "cancelled", quick)


async def test_a_key_claimed_again_by_the_same_worker_aborts_the_old_attempt(
    db: Database, db_url: str
) -> None:
    """The lease runs out and this very worker claims the key again: the old attempt is
    aborted at once, and the new one (new fence) is tracked and renewed like any other."""
    await handler_job(db, "again", "t-wait-event")
    lease = 1.5
    async with running_worker(db_url, lease_seconds=lease):
        key = await trigger(db, "again")
        first = await started(key)
        await requeue(db, key)

        async def second_start() -> dict[str, Any] | None:
            return next((m for m in marks_of(None, "start", key) if m["attempt"] == 2), None)

        second = await wait_for(second_start, 5, "the same worker to claim it again")
        (m,) = await wait_for(lambda: _marks("cancelled", key), 5, "the old attempt to stop")
        assert m["fence"] == first["fence"] < second["fence"]
        await asyncio.sleep(lease + 0.5)  # longer than a lease: only renewals keep it
        o = await occurrence(db, key)
        assert (o["state"], o["fence"]) == ("running", second["fence"])
        assert o["lease_expires_at"] > await db_now(db), "the new attempt is not renewed"
        assert len(marks_of(None, "cancelled", key)) == 1
        CONTROL[key].set()
        await wait_for(lambda: state_is(db, key, "succeeded"))
    atts = await attempts(db, key)
    assert [(a["outcome"], a["fence"]) for a in atts] == [
        ("lease_expired", first["fence"]),
        ("succeeded", second["fence"]),
    ]


async def _the_thief_completes(db: Database, key: str, first: int, thief: Claimed) -> None:
    """The taker's completion stands; the first attempt is recorded as lease_expired."""
    assert await dispatch.succeed(db, [(thief.id, thief.fence)]) == {key}
    atts = await attempts(db, key)
    assert [(a["outcome"], a["fence"]) for a in atts] == [
        ("lease_expired", first),
        ("succeeded", thief.fence),
    ]


async def test_a_late_completion_is_rejected_by_its_fence(db: Database, db_url: str) -> None:
    """Heartbeats far apart (lease 60 s): the attempt is taken over unnoticed and finishes
    while the taker still runs. Only the fence tells them apart: the stale batched
    completion matches nothing, and the taker's completion stands."""
    await handler_job(db, "late", "t-wait-event")
    async with running_worker(db_url, lease_seconds=60) as w:
        key = await trigger(db, "late")
        first = await started(key)
        thief = await steal(db, key)
        CONTROL[key].set()  # the stale attempt finishes now
        assert (await w.outcome(key)).result == "stale"
        o = await occurrence(db, key)
        assert (o["state"], o["fence"], o["worker_id"]) == ("running", thief.fence, "thief")
    await _the_thief_completes(db, key, first["fence"], thief)


async def test_self_fences_when_heartbeats_cannot_renew(db: Database, db_url: str) -> None:
    """Heartbeats hang (the occurrence row is locked): the worker abandons the attempt by
    its own clock *before* the lease it last renewed runs out in the database."""
    await handler_job(db, "fenced", "t-wait-event")
    lease = 1.5
    async with running_worker(db_url, lease_seconds=lease) as w:
        key = await trigger(db, "fenced")
        await started(key)
        await asyncio.sleep(0.6)  # at least one renewal went through
        async with await psycopg.AsyncConnection.connect(db_url) as locker:
            cur = await locker.execute(
                "SELECT clock_timestamp() AS t FROM cronwell_occurrences "
                "WHERE idempotency_key = %s FOR UPDATE",
                (key,),
            )
            row = await cur.fetchone()
            assert row is not None
            db_t0, mono_t0 = row[0], time.monotonic()
            (m,) = await wait_for(lambda: _marks("cancelled", key), 5, "self-fencing")
            cur = await locker.execute(
                "SELECT lease_expires_at FROM cronwell_occurrences WHERE idempotency_key = %s",
                (key,),
            )
            row = await cur.fetchone()
            assert row is not None
            expires = row[0]
            await locker.rollback()
        outcome = await w.outcome(key)
        assert (outcome.result, outcome.error) == ("lease_lost", "self_fenced")
    cancelled_db_time = (expires - db_t0).total_seconds()
    assert m["t"] - mono_t0 < cancelled_db_time, "aborted only after the lease ran out"
    assert m["t"] - mono_t0 < lease


# -- slots ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def completion_held(db_url: str, key: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The running occurrence's row locked by another session, then its `t-wait-event`
    handler let go: its completion write waits for the lock until the caller rolls back."""
    async with await psycopg.AsyncConnection.connect(db_url) as locker:
        await locker.execute(
            "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = %s FOR UPDATE", (key,)
        )
        CONTROL[key].set()
        yield locker


async def test_a_slot_frees_when_the_handler_returns_not_when_its_completion_is_written(
    db: Database, db_url: str
) -> None:
    """concurrency=1: while the first attempt's completion cannot be written (a lock on its
    row), the next occurrence is claimed and run; a third waits, since attempts held
    (running or completing) stay below twice the concurrency."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "first", "t-wait-event")
    for name in ("second", "third"):
        await handler_job(db, name, "t-sleepy-effect")
    async with running_worker(db_url, concurrency=1, lease_seconds=30) as w:
        first = await trigger(db, "first")
        await started(first)
        async with completion_held(db_url, first) as locker:
            second = await trigger(db, "second")
            await started(second)
            assert (await occurrence(db, first))["state"] == "running"  # completion blocked
            third = await trigger(db, "third")
            await asyncio.sleep(0.5)
            assert (await occurrence(db, third))["state"] == "pending"
            assert not marks_of(None, "start", third)
            await locker.rollback()
        for key in (first, second, third):
            await wait_for(lambda key=key: state_is(db, key, "succeeded"))
        assert [w.results(k) for k in (first, second, third)] == [["succeeded"]] * 3


async def test_a_backlog_of_quick_handlers_is_claimed_in_whole_batches(
    db: Database, db_url: str
) -> None:
    """3,200 overdue occurrences, handlers that return at once, 300 slots, claims of up to
    160: each claim is sized once the last batch's handlers had their turn. Sized at once
    after a claim, the next one counted the slots of handlers that had not run yet and
    took the rest: 160, 140, 160, 140, half the slots a claim on average, whatever the
    batch (10,000 per-second jobs behind by 4 s never caught up, a sixth of the machine's
    CPU idle)."""
    await handler_job(db, "late", "t-noop")
    await burst_in(db, "late", 3200, -5.0)
    async with running_worker(db_url, concurrency=300, claim_batch_size=160):
        await wait_for(lambda: _all_succeeded(db, "late", 3200), timeout=60)
    rows = await sql(
        db,
        "SELECT claimed_at, count(*) AS n FROM cronwell_occurrences GROUP BY claimed_at"
        " ORDER BY claimed_at",
    )
    sizes = [r["n"] for r in rows]
    assert sum(sizes) == 3200
    # After the first claims (sized before a look) and before the last: whole batches,
    # but for a claim bounded by completions not yet written (at most twice the slots
    # running or completing). Sized at once, they alternated 160 and 140.
    steady = sizes[3:-1]
    assert sum(1 for n in steady if n == 160) >= 2 / 3 * len(steady), sizes


async def _all_succeeded(db: Database, name: str, n: int) -> bool:
    rows = await sql(
        db,
        "SELECT count(*) AS n FROM cronwell_occurrences o JOIN cronwell_jobs j"
        " ON j.id = o.job_id WHERE j.name = %s AND o.state = 'succeeded'",
        name,
    )
    return rows[0]["n"] == n


async def test_a_due_occurrence_another_claimer_holds_does_not_make_the_claim_loop_spin(
    db: Database, db_url: str
) -> None:
    """Due now but locked by another claim (a claimer paused in its transaction): SKIP
    LOCKED hides it from the claim while the next-due query still sees it due. The loop
    must wait a little between tries, not claim again at once for as long as the lock is
    held (it did: hundreds of statements a second)."""
    await make_job(db, "held", schedule=FAR_FUTURE)
    key = await trigger(db, "held")
    async with await psycopg.AsyncConnection.connect(db_url) as locker:
        await locker.execute(
            "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = %s FOR UPDATE", (key,)
        )
        async with running_worker(db_url, poll_seconds=5.0) as w:
            await asyncio.sleep(0.5)  # started and registered
            before = w.db.statements
            await asyncio.sleep(1.0)
            statements = w.db.statements - before
        await locker.rollback()
    assert statements < 100, f"{statements} statements in 1 s with nothing claimable"
    assert await state_is(db, key, "pending")


# -- graceful shutdown ----------------------------------------------------------------------


async def test_stop_finishes_running_attempts_claims_nothing_and_deregisters(
    db: Database, db_url: str
) -> None:
    await handler_job(db, "drain", "t-wait-event")
    await handler_job(db, "after", "t-sleepy-effect")
    async with running_worker(db_url) as w:
        key = await trigger(db, "drain")
        await started(key)
        rows = await sql(db, "SELECT id FROM cronwell_processes WHERE role = 'worker'")
        assert rows == [{"id": w.worker.id}]
        w.worker.stop()
        later = await trigger(db, "after")
        await asyncio.sleep(0.5)
        assert not w.task.done(), "stopped before its running attempt finished"
        CONTROL[key].set()
        await asyncio.wait_for(asyncio.shield(w.task), 5)
    assert (await occurrence(db, key))["state"] == "succeeded"
    assert (await occurrence(db, later))["state"] == "pending", "claimed after stop()"
    assert await sql(db, "SELECT id FROM cronwell_processes") == []


async def test_an_attempt_ends_at_its_handler_and_stop_waits_for_its_completion_write(
    db: Database, db_url: str
) -> None:
    """An attempt's task ends when its handler returns and its completion is queued (no
    second step after the write); its entry stays, lease renewed, until the write. A stop
    meanwhile waits for that write: the worker exits with the success recorded. The write
    is held up by a row lock the test takes on the running occurrence."""
    await handler_job(db, "queued", "t-wait-event")
    async with running_worker(db_url, lease_seconds=30.0) as w:
        key = await trigger(db, "queued")
        await started(key)
        async with completion_held(db_url, key) as locker:

            async def ended_unwritten() -> bool:
                r = w.worker.running.get(key)
                return r is not None and r.task is not None and r.task.done()

            await wait_for(ended_unwritten, 5, "the attempt's task to end before its write")
            assert await state_is(db, key, "running")
            assert w.results(key) == [], "an outcome reported before its write"
            w.worker.stop()
            await asyncio.sleep(0.5)
            assert not w.task.done(), "the worker exited with a completion unwritten"
            await locker.rollback()
        await asyncio.wait_for(asyncio.shield(w.task), 10)
        assert w.results(key) == ["succeeded"]
        assert key not in w.worker.running
    assert await state_is(db, key, "succeeded")


async def test_second_stop_cancels_and_records_the_attempt(db: Database, db_url: str) -> None:
    await handler_job(db, "stuck", "t-wait-event", retry={"maxAttempts": 3})
    async with running_worker(db_url) as w:
        key = await trigger(db, "stuck")
        first = await started(key)
        w.worker.stop()
        w.worker.stop()
        await asyncio.wait_for(asyncio.shield(w.task), 5)
        assert (await w.outcome(key)).result == "cancelled"
    assert marks_of(None, "cancelled", key)
    o = await occurrence(db, key)
    assert (o["state"], o["reason"], o["attempt"]) == ("pending", "WorkerShutdown", 1)
    atts = await attempts(db, key)
    assert [(a["outcome"], a["fence"]) for a in atts] == [("cancelled", first["fence"])]


async def test_stop_releases_claimed_but_unstarted_occurrences(db: Database, db_url: str) -> None:
    """stop() arrives while a claim is in flight (held up by the job's lock, which another
    claim holds): what it claimed is given back, pending again with its attempt not
    consumed."""
    await handler_job(db, "unstarted", "t-sleepy-effect")
    key = await trigger(db, "unstarted")
    (job,) = await sql(db, "SELECT id FROM cronwell_jobs WHERE name = 'unstarted'")
    async with await psycopg.AsyncConnection.connect(db_url) as locker:
        await claims.lock_jobs(db, [job["id"]], conn=locker)
        async with running_worker(db_url) as w:
            await wait_for(
                lambda: waiting_for_a_job_lock(db), 10, "the claim to wait for the job lock"
            )
            w.worker.stop()
            await locker.rollback()
            await asyncio.wait_for(asyncio.shield(w.task), 10)
            assert (await w.outcome(key)).result == "released"
    o = await occurrence(db, key)
    assert (o["state"], o["attempt"], o["worker_id"]) == ("pending", 0, None)
    assert o["fence"] is not None  # it was claimed...
    assert not marks_of(None, "start", key)  # ...and never started
    assert await attempts(db, key) == []


# -- claim ahead ----------------------------------------------------------------------------


async def _occ(db: Database, key: str) -> dict[str, Any]:
    (row,) = await sql(
        db,
        "SELECT state, reason, attempt, worker_id, run_at, claimed_at, started_at"
        " FROM cronwell_occurrences WHERE idempotency_key = %s",
        key,
    )
    return row


async def test_an_occurrence_claimed_ahead_starts_at_its_instant_not_before(
    db: Database, db_url: str
) -> None:
    """Claimed before its instant, started at it (the handler's own first mark against the
    earliest local instant the database clock can read run_at), and under AtMostOnce its
    start was recorded before the handler ran."""
    await handler_job(db, "ahead", "t-clock", delivery="AtMostOnce")
    key = await trigger(db, "ahead")
    run_at, earliest = await due_in(db, key, 3.0)
    async with running_worker(db_url, claim_ahead_seconds=10.0) as w:
        await wait_for(lambda: state_is(db, key, "succeeded"))
        out = await w.outcome(key)
    assert out.result == "succeeded"
    (start,) = marks_of(None, "start", key)
    (row,) = marks_of(None, "row", key)
    assert start["t"] >= earliest, f"started {earliest - start['t']:.3f}s before its instant"
    assert out.start_lag is not None and out.start_lag >= 0
    assert row["started_at"] is not None, "AtMostOnce ran before its start was recorded"
    o = await _occ(db, key)
    assert o["claimed_at"] < run_at <= o["started_at"], o
    # run_at is 3 s after scheduled_for here, as jitter makes it: the lag (the Outcome's, the
    # one the start-lag metric and the `dev` line show) counts from run_at, not from before.
    offset = (out.claimed.run_at - out.claimed.scheduled_for).total_seconds()
    assert out.start_lag < offset, (out.start_lag, offset)
    assert [(a["attempt"], a["outcome"]) for a in await attempts(db, key)] == [(1, "succeeded")]


async def test_claimed_ahead_never_started_is_given_back_not_ambiguous(
    db: Database, db_url: str
) -> None:
    """An AtMostOnce occurrence claimed ahead by a worker that vanished before its instant
    never ran: the reaper gives it back at its instant, attempt unconsumed, no attempt row,
    not Ambiguous; then it runs once."""
    await handler_job(db, "amo-ahead", "t-clock", delivery="AtMostOnce")
    key = await trigger(db, "amo-ahead")
    run_at, _ = await due_in(db, key, 30.0)
    claim = {"pool": "default", "worker_id": "gone", "limit": 5, "lease_seconds": 60}
    assert await dispatch.claim(db, **claim) == []  # not due, and no claim ahead asked
    (c,) = await dispatch.claim(db, **claim, ahead_seconds=60)
    assert (c.key, c.started_at, c.attempt) == (key, None, 1)
    await sql(
        db,
        "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = %s",
        key,
    )
    reaped = await maintenance.reap(db, limit=10)
    assert [(r.state, r.reason) for r in reaped] == [("pending", "NotStarted")]
    o = await _occ(db, key)
    assert (o["state"], o["attempt"], o["run_at"], o["claimed_at"]) == ("pending", 0, run_at, None)
    assert await attempts(db, key) == []
    await due_in(db, key, 0.5)
    async with running_worker(db_url) as w:
        await wait_for(lambda: state_is(db, key, "succeeded"))
        assert w.results(key) == ["succeeded"]
    assert [(a["attempt"], a["outcome"]) for a in await attempts(db, key)] == [(1, "succeeded")]
    assert len(marks_of(None, "start", key)) == 1


async def test_stop_gives_back_occurrences_claimed_ahead_at_their_instant(
    db: Database, db_url: str
) -> None:
    await handler_job(db, "ahead-stop", "t-clock")
    key = await trigger(db, "ahead-stop")
    run_at, _ = await due_in(db, key, 30.0)
    async with running_worker(db_url, claim_ahead_seconds=60.0) as w:
        await wait_for(lambda: state_is(db, key, "running"))
        w.worker.stop()
        await asyncio.wait_for(asyncio.shield(w.task), 10)
        assert w.results(key) == ["released"]
    o = await _occ(db, key)
    assert (o["state"], o["attempt"], o["worker_id"], o["run_at"]) == ("pending", 0, None, run_at)
    assert o["started_at"] is None and not marks_of(None, "start", key)
    assert await attempts(db, key) == []


async def _ahead(db: Database, name: str) -> dict[str, Any]:
    """A job's occurrences: claimed ahead (running, not started), pending, by worker, and
    whether the database clock is still before all of their instants."""
    (row,) = await sql(
        db,
        "SELECT count(*) FILTER (WHERE o.state = 'running' AND o.started_at IS NULL) AS ahead,"
        " count(*) FILTER (WHERE o.state = 'pending') AS pending,"
        " count(*) FILTER (WHERE o.state = 'succeeded') AS succeeded,"
        " coalesce(bool_and(o.run_at > now()), true) AS before_t"
        " FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id WHERE j.name = %s",
        name,
    )
    workers = await sql(
        db,
        "SELECT worker_id, count(*) AS n FROM cronwell_occurrences"
        " WHERE state = 'running' AND started_at IS NULL GROUP BY worker_id",
    )
    return row | {"by_worker": {w["worker_id"]: w["n"] for w in workers}}


# A burst 25 s ahead, claimed from 15 s + its share at the measured rate before it: "before
# its instant" with room to spare on a loaded machine (the assertion is only "before T").
BURST_LEAD, BURST_MARGIN = 25.0, 15.0
AHEAD = {
    "claim_ahead_seconds": 0.5,
    "claim_ahead_margin_seconds": BURST_MARGIN,
    "lease_seconds": 30.0,
}


async def _all_claimed_ahead(db: Database, name: str, n: int) -> dict[str, Any]:
    """Wait until all n occurrences of job `name` are claimed ahead; they were before T."""
    seen = await wait_for(
        lambda: _claimed_ahead(db, name, n), timeout=BURST_LEAD, what=f"{n} claimed ahead"
    )
    assert seen["before_t"], "claimed only after the instant"
    return seen


async def test_a_burst_larger_than_the_concurrency_is_claimed_entirely_before_its_instant(
    db: Database, db_url: str
) -> None:
    """600 occurrences due at one instant, a worker of concurrency 4: all 600 are claimed
    ahead (a claimed-ahead occurrence waits without a handler slot), then all run."""
    await handler_job(db, "burst", "t-noop")
    async with running_worker(
        db_url,
        concurrency=4,
        claim_batch_size=50,
        **AHEAD,
    ):
        await burst_in(db, "burst", 600, BURST_LEAD)
        seen = await _all_claimed_ahead(db, "burst", 600)
        assert seen["pending"] == 0
        done = await wait_for(
            lambda: _succeeded(db, "burst", 600), timeout=BURST_LEAD + 30, what="all ran"
        )
        assert done["succeeded"] == 600


async def test_a_look_reads_no_farther_than_its_plan_needs(db: Database, db_url: str) -> None:
    """Nothing near: the look reads farther and finds the burst 20 s away. A stream of
    instants within the claim-ahead window settles the claim plan (it stops at the first
    instant that needs no claim yet): the look then leaves the burst unread (reading the
    widest window, 30 s and up to 50,000 rows a worker, every look cost 100 ms of the
    database's time a look under 5,000 per-second jobs)."""
    for name in ("far", "near", "next"):
        await handler_job(db, name, "t-noop")
    await burst_in(db, "far", 500, 20.0)
    async with Database(db_url, max_size=2) as wdb:
        w = Worker(wdb, WorkerSettings())
        assert await w._look()
        assert w._coming is not None and [n for _, n in w._coming.instants] == [500]
        await burst_in(db, "near", 10, 0.5)
        await burst_in(db, "next", 10, 2.6)
        w._coming = None  # look again at once (not within LOOK_MIN_SECONDS)
        assert await w._look()
        assert w._coming is not None and [n for _, n in w._coming.instants] == [10, 10]


async def test_a_look_reads_no_farther_while_something_is_due(db: Database, db_url: str) -> None:
    """Overdue work and a stream of instants the plan cannot settle on (each second's
    share over a second's claiming at the planning rate): the look stops at its near
    window and leaves the burst 20 s away unread; with nothing due, the same stream makes
    it read on to the burst. Due work is claimed before anything ahead: behind it, the
    look read on to its budget, 47 ms a look at 10,000 per-second jobs."""
    for name in ("late", "stream", "far"):
        await handler_job(db, name, "t-noop")
    await burst_in(db, "late", 100, -2.0)
    for t in (0.5, 1.5, 2.5):
        await burst_in(db, "stream", 5000, t)
    await burst_in(db, "far", 300, 20.0)
    async with Database(db_url, max_size=2) as wdb:
        w = Worker(wdb, WorkerSettings())
        assert await w._look()
        assert w._coming is not None
        assert [n for _, n in w._coming.instants] == [100, 5000, 5000, 5000]
        await sql(db, "DELETE FROM cronwell_occurrences WHERE run_at < now()")
        w._coming = None  # look again at once (not within LOOK_MIN_SECONDS)
        assert await w._look()
        assert w._coming is not None
        assert [n for _, n in w._coming.instants][-1] == 300  # read on to the burst


async def test_a_look_behind_a_backlog_reads_a_claim_round_of_it(db: Database, db_url: str) -> None:
    """2,000 occurrences overdue and a burst of 30 coming: the look counts one claim round
    of the overdue ones (a batch per live worker: what the pool's next claims take) and
    all of the burst. Under a backlog the look read all of it, up to its budget (100,000
    rows for two workers: 68 ms a look at 10,000 per-second jobs, the database's time
    going to a count nobody needs while the backlog grew)."""
    for name in ("late", "coming"):
        await handler_job(db, name, "t-noop")
    await burst_in(db, "late", 2000, -5.0)
    await burst_in(db, "coming", 30, 1.0)
    async with Database(db_url, max_size=2) as wdb:
        w = Worker(wdb, WorkerSettings(claim_batch_size=50))
        assert await w._look()
        assert w._coming is not None and [n for _, n in w._coming.instants] == [50, 30]
        assert w._coming.first_pending() is not None and w._coming.first_pending() <= 0


async def _claimed_ahead(db: Database, name: str, n: int) -> dict[str, Any] | None:
    row = await _ahead(db, name)
    return row if row["ahead"] >= n or not row["before_t"] else None


async def _succeeded(db: Database, name: str, n: int) -> dict[str, Any] | None:
    row = await _ahead(db, name)
    return row if row["succeeded"] == n else None


async def test_two_workers_of_a_pool_share_a_burst_ahead(db: Database, db_url: str) -> None:
    """Two live workers, one starting its claims ahead long before the other: it claims at
    most half the burst plus a batch of slack, and the other the rest, all before the
    instant (without the share, the first would claim all of it while the other idles)."""
    await handler_job(db, "shared", "t-noop")
    opts = AHEAD | {"concurrency": 8, "claim_batch_size": 20}
    async with (
        running_worker(db_url, worker_id="w-early", **opts | {"claim_ahead_margin_seconds": 20.0}),
        running_worker(db_url, worker_id="w-late", **opts | {"claim_ahead_margin_seconds": 8.0}),
    ):
        await wait_for(lambda: _registered(db, 2), what="both workers registered")
        await burst_in(db, "shared", 400, BURST_LEAD)
        seen = await _all_claimed_ahead(db, "shared", 400)
        share_and_slack = 400 // 2 + 20
        assert set(seen["by_worker"]) == {"w-early", "w-late"}, seen["by_worker"]
        assert max(seen["by_worker"].values()) <= share_and_slack, seen["by_worker"]
        await wait_for(
            lambda: _succeeded(db, "shared", 400), timeout=BURST_LEAD + 30, what="all ran"
        )


async def test_a_worker_that_joins_shrinks_the_share_at_the_next_look(
    db: Database, db_url: str
) -> None:
    """A burst coming and one live worker: its look plans the whole burst as its share.
    A second worker registers: the next look counts two, so the first claims no more than
    half (plus slack). The count was reused for 2 s, in which a worker claiming ahead at
    tens of thousands a second took most of a 50,000 burst meant for two."""
    await handler_job(db, "joined", "t-noop")
    await burst_in(db, "joined", 100, 20.0)

    def entry(worker_id: str) -> processes.ProcessEntry:
        return processes.ProcessEntry(worker_id, "worker", "default", "h", 1, "v", 8, 0)

    async with Database(db_url, max_size=2) as wdb:
        await processes.heartbeat(db, entry("first"))
        w = Worker(wdb, WorkerSettings())
        assert await w._look()
        assert w._coming is not None and w._coming.workers == 1
        await processes.heartbeat(db, entry("joined"))
        w._coming = None  # look again at once (not within LOOK_MIN_SECONDS)
        assert await w._look()
        assert w._coming is not None and w._coming.workers == 2


async def test_a_worker_gives_back_its_surplus_when_a_peer_joins(db: Database, db_url: str) -> None:
    """One live worker claims all of a coming burst ahead (alone, all of it is its share).
    A second joins: the first's next look counts two and gives back, unstarted, what it
    holds over half the burst plus slack; the second, told the burst's size by the first's
    published view (what is pending says only what is left), claims all the rest ahead.
    Each occurrence then runs once, by the worker that held it at the instant. Before, the
    first kept what it had claimed and the second ran none of the burst."""
    await handler_job(db, "given-back", "t-noop")
    opts = AHEAD | {"concurrency": 8, "claim_batch_size": 20}
    async with running_worker(db_url, worker_id="w-first", **opts):
        await wait_for(lambda: _registered(db, 1), what="the first worker registered")
        await burst_in(db, "given-back", 400, BURST_LEAD)
        seen = await _all_claimed_ahead(db, "given-back", 400)
        assert seen["by_worker"] == {"w-first": 400}
        async with running_worker(db_url, worker_id="w-joined", **opts):
            split = await wait_for(
                lambda: _held_by_two(db, "given-back", 400),
                timeout=BURST_LEAD,
                what="the burst held ahead by both workers",
            )
            assert split["before_t"] and split["pending"] == 0, split
            assert split["by_worker"]["w-first"] == 400 // 2 + 10, split  # share + 5 % slack
            await wait_for(
                lambda: _succeeded(db, "given-back", 400), timeout=BURST_LEAD + 30, what="ran"
            )
    ran = await sql(
        db,
        "SELECT a.worker_id, count(*) AS n, count(DISTINCT a.occurrence_id) AS occurrences"
        " FROM cronwell_attempts a GROUP BY a.worker_id ORDER BY a.worker_id",
    )
    assert [(r["worker_id"], r["n"], r["occurrences"]) for r in ran] == [
        ("w-first", 210, 210),
        ("w-joined", 190, 190),
    ]
    # Given back unstarted: the attempt was not consumed (each ran as its first attempt).
    (attempts,) = await sql(db, "SELECT array_agg(DISTINCT attempt) AS a FROM cronwell_occurrences")
    assert attempts["a"] == [1]


async def test_a_worker_holding_claims_ahead_counts_its_peers_without_looking_again(
    db: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker holds a coming burst claimed ahead and nothing wakes it: each second it
    counts the pool's live workers and does not read again what is coming (it read up to three
    windows of the pool's instants a second: a tenth of the statements' execution time in
    a 50,000 burst). A peer registering changes the count: the next one looks again, counting two.
    `claims.coming` is the real query, counted on its way."""
    reads = 0
    real = claims.coming

    async def counted(*args: Any, **kwargs: Any) -> list[claims.Coming]:
        nonlocal reads
        reads += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(claims, "coming", counted)
    await handler_job(db, "held", "t-noop")
    # poll_seconds: the least a held worker looks anyway (what a lost NOTIFY left unsaid)
    opts = AHEAD | {"concurrency": 8, "claim_batch_size": 20, "poll_seconds": 10.0}
    async with running_worker(db_url, worker_id="w-held", **opts) as rw:
        await wait_for(lambda: _registered(db, 1), what="the worker registered")
        await burst_in(db, "held", 100, BURST_LEAD)
        await _all_claimed_ahead(db, "held", 100)
        await asyncio.sleep(1.0)  # its last claim's look, after the rows were claimed
        before = reads
        await asyncio.sleep(4.0)
        assert reads - before <= 1, f"{reads - before} reads in 4 s while holding"
        assert rw.worker._coming is not None and rw.worker._coming.workers == 1
        await processes.heartbeat(
            db, processes.ProcessEntry("w-peer", "worker", "default", "h", 1, "v", 8, 0)
        )
        before = reads
        await wait_for(
            lambda: _looked(rw.worker, before, lambda: reads),
            timeout=5.0,
            what="a look after the peer registered",
        )
        assert rw.worker._coming is not None and rw.worker._coming.workers == 2


async def _looked(w: Worker, before: int, reads: Callable[[], int]) -> bool:
    return bool(reads() > before and w._coming is not None and w._coming.workers == 2)


async def test_the_pool_view_merges_the_live_workers_bursts(db: Database) -> None:
    """Each worker publishes the burst sizes it has seen; a look reads the most any live
    worker of its pool has seen at each instant: not a silent worker's, not another pool's,
    and a view left unchanged (None) is not overwritten."""
    t1 = datetime(2026, 12, 5, 12, 0, 0, 123456, tzinfo=UTC)
    t2 = t1 + timedelta(seconds=1)

    def entry(worker_id: str, pool: str = "default") -> processes.ProcessEntry:
        return processes.ProcessEntry(worker_id, "worker", pool, "h", 1, "v", 8, 0)

    for worker_id, pool in (("a", "default"), ("b", "default"), ("gone", "default"), ("o", "x")):
        await processes.heartbeat(db, entry(worker_id, pool))

    async def view(
        worker_id: str, publish: dict[datetime, int] | None, pool: str = "default"
    ) -> tuple[int, dict[datetime, int]]:
        return await processes.pool_view(
            db, worker_id=worker_id, pool=pool, ttl_seconds=15.0, publish=publish
        )

    await view("gone", {t1: 900})
    await view("o", {t1: 700})
    await sql(
        db,
        "UPDATE cronwell_processes SET heartbeat_at = now() - interval '1 min' WHERE id = 'gone'",
    )
    await view("a", {t1: 400, t2: 5})
    await view("b", {t1: 300, t2: 50})
    assert await view("a", None) == (2, {t1: 400, t2: 50})
    assert await view("o", None, pool="x") == (1, {t1: 700})


async def _held_by_two(db: Database, name: str, n: int) -> dict[str, Any] | None:
    row = await _ahead(db, name)
    return row if row["ahead"] == n and len(row["by_worker"]) == 2 else None


async def _registered(db: Database, n: int) -> bool:
    rows = await sql(db, "SELECT count(*) AS n FROM cronwell_processes WHERE role = 'worker'")
    return bool(rows[0]["n"] == n)


async def test_waiting_claims_hold_no_handler_slot(db: Database, db_url: str) -> None:
    """Long-running handlers fill the concurrency: a coming burst is still claimed ahead,
    and runs once the slots free."""
    for name in ("long-1", "long-2"):
        await handler_job(db, name, "t-wait-event")
    await handler_job(db, "later", "t-noop")
    async with running_worker(
        db_url,
        concurrency=2,
        **AHEAD,
    ):
        keys = [await trigger(db, name) for name in ("long-1", "long-2")]
        for k in keys:
            await started(k)
        await burst_in(db, "later", 30, BURST_LEAD)
        await _all_claimed_ahead(db, "later", 30)
        assert [(await occurrence(db, k))["state"] for k in keys] == ["running", "running"]
        for k in keys:
            CONTROL.setdefault(k, asyncio.Event()).set()
        await wait_for(lambda: _succeeded(db, "later", 30), timeout=BURST_LEAD + 30, what="all ran")


async def test_stop_gives_back_every_waiting_claim(db: Database, db_url: str) -> None:
    """Stopping before the instant gives back all that waits (more than the concurrency),
    unstarted and unconsumed."""
    await handler_job(db, "ahead-many", "t-noop")
    async with running_worker(
        db_url,
        concurrency=2,
        **AHEAD,
    ) as w:
        await burst_in(db, "ahead-many", 200, BURST_LEAD)
        await _all_claimed_ahead(db, "ahead-many", 200)
        w.worker.stop()
        await asyncio.wait_for(asyncio.shield(w.task), 20)
        assert sorted({o.result for o in w.outcomes}) == ["released"]
        assert len(w.outcomes) == 200
    rows = await sql(
        db,
        "SELECT state, attempt, worker_id, started_at, count(*) AS n FROM cronwell_occurrences"
        " GROUP BY 1, 2, 3, 4",
    )
    assert rows == [
        {"state": "pending", "attempt": 0, "worker_id": None, "started_at": None, "n": 200}
    ]
    assert await sql(db, "SELECT * FROM cronwell_attempts") == []


async def test_an_at_least_once_attempt_claimed_ahead_starts_with_no_write_before_it(
    db: Database, db_url: str
) -> None:
    """AtLeastOnce, claimed ahead: at its start the database has no start yet (no round
    trip in front of the handler); its completion records the start instant (database
    clock, at or after run_at), on the occurrence and its attempt row alike."""
    await handler_job(db, "least-ahead", "t-clock")
    key = await trigger(db, "least-ahead")
    run_at, earliest = await due_in(db, key, 3.0)
    async with running_worker(db_url, claim_ahead_seconds=10.0) as w:
        await wait_for(lambda: state_is(db, key, "succeeded"))
        out = await w.outcome(key)
    assert (out.result, out.claimed.started_at) == ("succeeded", None)  # claimed ahead
    (start,) = marks_of(None, "start", key)
    (row,) = marks_of(None, "row", key)
    assert start["t"] >= earliest, f"started {earliest - start['t']:.3f}s before its instant"
    assert row["started_at"] is None, "a start write came before the handler"
    (o,) = await sql(
        db,
        "SELECT claimed_at, started_at, finished_at FROM cronwell_occurrences"
        " WHERE idempotency_key = %s",
        key,
    )
    assert o["claimed_at"] < run_at <= o["started_at"] <= o["finished_at"], o
    atts = await attempts(db, key)
    assert [(a["outcome"], a["started_at"]) for a in atts] == [("succeeded", o["started_at"])]


async def test_a_failed_at_least_once_attempt_claimed_ahead_records_its_start_with_the_failure(
    db: Database, db_url: str
) -> None:
    await handler_job(db, "fails-ahead", "t-fail-while", retry={"maxAttempts": 1})
    key = await trigger(db, "fails-ahead")
    run_at, _ = await due_in(db, key, 1.0)
    async with running_worker(db_url, claim_ahead_seconds=10.0):
        o = await wait_for(lambda: state_is(db, key, "dead"))
    assert o["started_at"] is not None and run_at <= o["started_at"] <= o["finished_at"], o
    atts = await attempts(db, key)
    assert [(a["outcome"], a["started_at"]) for a in atts] == [("failed", o["started_at"])]
    CONTROL.pop("calls:fails-ahead", None)


async def test_a_transactional_completion_records_an_unwritten_start(
    db: Database, db_url: str
) -> None:
    """ctx.transaction() completes the attempt itself: it records the start too."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "tx-ahead", "t-outbox-effect")
    key = await trigger(db, "tx-ahead")
    run_at, _ = await due_in(db, key, 1.0)
    async with running_worker(db_url, claim_ahead_seconds=10.0):
        o = await wait_for(lambda: state_is(db, key, "succeeded"))
    assert o["started_at"] is not None and run_at <= o["started_at"] <= o["finished_at"], o
    assert [a["started_at"] for a in await attempts(db, key)] == [o["started_at"]]


async def test_a_long_at_least_once_attempt_started_without_a_write_gets_its_start_recorded(
    db: Database, db_url: str
) -> None:
    """A handler still running a while after its start (started with no write) has its start
    recorded while it runs (the dashboard shows it started); its completion keeps it."""
    await handler_job(db, "long-ahead", "t-wait-event")
    key = await trigger(db, "long-ahead")
    run_at, _ = await due_in(db, key, 3.0)
    async with running_worker(db_url, claim_ahead_seconds=10.0) as w:
        await started(key)
        assert w.worker.running[key].claimed.started_at is None  # claimed ahead

        async def recorded() -> dict[str, Any] | None:
            o = await _occ(db, key)
            return o if o["started_at"] is not None else None

        o = await wait_for(recorded, 10, "the start to be recorded while the handler runs")
        assert o["state"] == "running" and o["started_at"] >= run_at, o
        CONTROL[key].set()
        done = await wait_for(lambda: state_is(db, key, "succeeded"))
    assert done["started_at"] == o["started_at"]
    assert [a["started_at"] for a in await attempts(db, key)] == [o["started_at"]]


async def test_an_at_least_once_attempt_whose_lease_is_not_surely_held_does_not_start(
    db: Database, db_url: str
) -> None:
    """Nothing is written before an AtLeastOnce start, so the worker's own judgement of its
    lease decides: one whose last renewal is too old at the instant is given back
    unstarted (pending, attempt unconsumed), never run. The store's lease still runs here:
    only the local judgement stops it."""
    from cronwell.settings import WorkerSettings
    from cronwell_worker.runtime import Outcome, Worker

    await handler_job(db, "unsure", "t-clock")
    key = await trigger(db, "unsure")
    await due_in(db, key, 0.2)
    outcomes: list[Outcome] = []
    async with Database(db_url, max_size=4) as wdb:
        w = Worker(wdb, WorkerSettings(lease_seconds=60), on_outcome=outcomes.append)
        (c,) = await dispatch.claim(
            wdb, pool="default", worker_id=w.id, limit=5, lease_seconds=60, ahead_seconds=10
        )
        w._start(c, time.monotonic())  # as if its last renewal was sent a lease ago
        task = w.running[key].task
        assert task is not None
        await asyncio.wait_for(task, 10)
    assert [o.result for o in outcomes] == ["released"]
    assert not marks_of(None, "start", key)
    o = await _occ(db, key)
    assert (o["state"], o["attempt"], o["started_at"]) == ("pending", 0, None)
    assert await attempts(db, key) == []


async def test_the_reaper_counts_an_unwritten_at_least_once_start_as_run_if_its_instant_came_first(
    db: Database,
) -> None:
    """started_at NULL on an expired lease: an AtLeastOnce attempt whose instant (run_at)
    came before its lease expired may have run (it starts with no write, while its lease is
    held): attempt consumed, an attempt row, retried or dead like a started one. One whose
    instant was at or after the expiry never started; nor did an AtMostOnce one or a `job`
    target's (their start is written before they run)."""
    from .test_job_target_lease import JOB

    cases = {
        "ran": ({}, "1 second"),
        "ran-last": ({"retry": {"maxAttempts": 1}}, "1 second"),
        "at-expiry": ({}, "0 seconds"),
        "after-expiry": ({}, "-1 second"),
        "most": ({"delivery": "AtMostOnce"}, "1 second"),
        "job": ({"target": JOB}, "1 second"),
    }
    keys = {}
    for name, (spec, _) in cases.items():
        if "target" in spec:
            await make_job(db, name, schedule=FAR_FUTURE, **spec)
        else:
            await handler_job(db, name, "t-clock", **spec)
        keys[name] = await trigger(db, name)
        await due_in(db, keys[name], 30.0)
    claimed = await dispatch.claim(
        db, pool="default", worker_id="gone", limit=10, lease_seconds=60, ahead_seconds=60
    )
    assert sorted(c.key for c in claimed if c.started_at is None) == sorted(keys.values())
    for name, (_, before) in cases.items():
        await sql(
            db,
            "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second',"
            " run_at = now() - interval '1 second' - %s::interval WHERE idempotency_key = %s",
            before,
            keys[name],
        )
    reaped = {r.idempotency_key: (r.state, r.reason) for r in await maintenance.reap(db, limit=10)}
    assert {n: reaped[k] for n, k in keys.items()} == {
        "ran": ("pending", "LeaseExpired"),
        "ran-last": ("dead", "AttemptsExhausted"),
        "at-expiry": ("pending", "NotStarted"),
        "after-expiry": ("pending", "NotStarted"),
        "most": ("pending", "NotStarted"),
        "job": ("pending", "NotStarted"),
    }
    for name, key in keys.items():
        o = await _occ(db, key)
        ran = name.startswith("ran")
        assert o["attempt"] == (1 if ran else 0), (name, o)
        outcomes = [(a["attempt"], a["outcome"], a["started_at"]) for a in await attempts(db, key)]
        assert outcomes == ([(1, "lease_expired", None)] if ran else []), name


async def test_completions_wait_while_a_burst_is_starting(db: Database, db_url: str) -> None:
    """Starts before completions: 30 attempts claimed ahead, due 10 ms apart, handlers that
    return at once. No completion is written (a success is reported only once written)
    before the last of them has started; then all are written. The hold is bounded by
    completion_hold_seconds, set high here so that no timing matters."""
    n = 30
    names = [f"burst-{i:02d}" for i in range(n)]
    for name in names:
        await handler_job(db, name, "t-seen-completions")
    keys = [await trigger(db, name) for name in names]
    await sql(
        db,
        "UPDATE cronwell_occurrences o SET run_at = clock_timestamp() + interval '3 seconds'"
        " + make_interval(secs => 0.01 * t.i) FROM unnest(%s::text[]) WITH ORDINALITY"
        " AS t(k, i) WHERE o.idempotency_key = t.k",
        keys,
    )
    async with running_worker(db_url, claim_ahead_seconds=10.0, completion_hold_seconds=60.0) as w:
        CONTROL["outcomes"] = w.outcomes
        for key in keys:
            await wait_for(lambda key=key: state_is(db, key, "succeeded"), 30)
    CONTROL.pop("outcomes", None)
    seen = {m["key"]: m["succeeded"] for m in marks_of(None, "start") if m["key"] in keys}
    assert len(seen) == n
    assert [o.claimed.started_at for o in w.outcomes] == [None] * n  # all claimed ahead
    assert set(seen.values()) == {0}, f"completions written while the burst started: {seen}"
    assert sorted(w.results(k)[0] for k in keys) == ["succeeded"] * n


# -- specs at claim time --------------------------------------------------------------------


async def _twins(db: Database) -> None:
    """Jobs twin-a and twin-b share one spec (so one spec hash); other has its own."""
    for name, message in [("twin-a", "same"), ("twin-b", "same"), ("other", "other")]:
        await make_job(db, name, schedule=FAR_FUTURE, target={"log": {"message": message}})
        await trigger(db, name)


async def test_a_claim_sends_one_document_per_unknown_spec_hash_and_none_for_known_ones(
    db: Database,
) -> None:
    await _twins(db)
    claimed = await dispatch.claim(db, pool="default", worker_id="w", limit=10, lease_seconds=30)
    c = {x.name: x for x in claimed}
    assert c["twin-a"].spec_hash == c["twin-b"].spec_hash != c["other"].spec_hash
    assert c["twin-a"].spec is not None and c["other"].spec is not None
    assert c["twin-a"].spec is c["twin-b"].spec  # one document fetched for the shared hash
    assert c["other"].spec["target"]["log"]["message"] == "other"

    await dispatch.succeed(db, [(x.id, x.fence) for x in claimed])
    for name in c:
        await trigger(db, name)
    known = {c["twin-a"].spec_hash}
    again = await dispatch.claim(
        db, pool="default", worker_id="w", limit=10, lease_seconds=30, known_specs=known
    )
    assert {x.name: x.spec is None for x in again} == {
        "twin-a": True,
        "twin-b": True,
        "other": False,
    }


async def test_a_spec_changed_after_the_claim_runs_the_claimed_spec_if_found_else_the_new_one(
    db: Database,
) -> None:
    await _twins(db)
    async with db.transaction() as conn:
        found = await claims.candidates(
            db, pool="default", limit=10, serial=dispatch.SERIAL_ORDER, conn=conn
        )
        rows = await claims.start(
            db, found.ids, worker_id="w", lease_seconds=30, row=dispatch.Claimed, conn=conn
        )
    rows = [r for r in rows if r.name in ("twin-a", "twin-b")]
    claimed_hash = rows[0].spec_hash
    # twin-a's spec changes between the claim and the fetch of its spec
    await make_job(db, "twin-a", schedule=FAR_FUTURE, target={"log": {"message": "new"}})

    async with db.connection() as conn:
        both = await dispatch.attach_specs(db, conn, rows, frozenset())
        only_a = await dispatch.attach_specs(
            db, conn, [r for r in rows if r.name == "twin-a"], frozenset()
        )
    # twin-b still has the claimed spec: both run what was claimed
    for x in both:
        assert x.spec is not None and x.spec_hash == claimed_hash
        assert x.spec["target"]["log"]["message"] == "same"
    # nothing has the claimed spec any more: twin-a runs its current one, under its hash
    (a,) = only_a
    assert a.spec is not None and a.spec["target"]["log"]["message"] == "new"
    assert a.spec_hash != claimed_hash
    # what the attempt must keep was fixed on the occurrence: unchanged by the spec change
    assert (a.timeout_seconds, a.delivery, a.max_attempts) == (
        rows[0].timeout_seconds,
        rows[0].delivery,
        rows[0].max_attempts,
    )


async def test_a_worker_runs_jobs_sharing_a_spec_and_a_changed_spec(
    db: Database, db_url: str
) -> None:
    """Through the worker's cache: twins (one parse), then twin-a after its spec changed
    runs the new target (an unknown handler here, so the change is visible)."""
    await _twins(db)
    async with running_worker(db_url) as w:
        keys = [r["idempotency_key"] for r in await sql(db, "SELECT idempotency_key FROM "
                                                        "cronwell_occurrences")]  # fmt: skip
        for key in keys:
            await wait_for(lambda key=key: state_is(db, key, "succeeded"))
        assert len(w.worker._specs) == 2
        await make_job(db, "twin-a", schedule=FAR_FUTURE, target={"handler": {"name": "t-nope"}})
        key = await trigger(db, "twin-a")
        o = await wait_for(lambda: state_is(db, key, "dead"))
    assert o["reason"] == "UnknownHandler"


_HEARTBEAT_BREAKS = """
CREATE FUNCTION test_break_heartbeats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = OLD.state AND NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
    THEN RAISE EXCEPTION 'heartbeats are broken' USING ERRCODE = 'XX000';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_break_heartbeats BEFORE UPDATE ON cronwell_occurrences
    FOR EACH ROW EXECUTE FUNCTION test_break_heartbeats();
"""


async def test_a_crashed_heartbeat_task_stops_the_worker_at_once(db: Database, db_url: str) -> None:
    """A background task that dies of an unexpected error (not the database being down) is
    noticed while the worker runs: its running attempt is cancelled and run() raises the
    error (the process exits non-zero), instead of the worker claiming on unguarded."""
    from cronwell.settings import WorkerSettings
    from cronwell_worker.runtime import Worker

    await handler_job(db, "blocked", "t-wait-event")
    async with Database(db_url, max_size=10) as wdb:
        w = Worker(wdb, WorkerSettings(lease_seconds=3.0, poll_seconds=0.2))
        task = asyncio.create_task(w.run())
        try:
            key = await trigger(db, "blocked")
            await started(key)
            await sql(db, _HEARTBEAT_BREAKS)
            with pytest.raises(psycopg.errors.InternalError_, match="heartbeats are broken"):
                await asyncio.wait_for(asyncio.shield(task), 15)
        finally:
            if not task.done():
                w.stop()
                w.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 20)
    assert marks_of(None, "cancelled", key), "the running attempt was not cancelled"
    CONTROL.pop(key, None)
