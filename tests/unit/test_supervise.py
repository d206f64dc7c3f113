"""The background-task supervisor: expected errors are retried with backoff, anything else
stops the process; the status writer's per-job backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from cronwell.errors import DatabaseUnavailable
from cronwell.supervise import Backoff, Supervisor, repeat, wait_event
from cronwell_operator.ratelimit import JobBackoff


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    b = Backoff(first_seconds=0.5, max_seconds=3)
    assert [b.failure() for _ in range(5)] == [0.5, 1, 2, 3, 3]
    b.success()
    assert b.failure() == 0.5


async def test_repeat_retries_expected_errors_in_one_line_and_raises_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def step() -> float:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise DatabaseUnavailable("database connection failed: refused")
        raise KeyError("a bug")

    with caplog.at_level(logging.WARNING), pytest.raises(KeyError, match="a bug"):
        await repeat("test loop", step, interval_seconds=0, backoff=Backoff(0.001, 0.01))
    assert calls == 3
    retries = [r for r in caplog.records if "test loop failed" in r.getMessage()]
    assert len(retries) == 2 and all(r.exc_info is None for r in retries)
    assert "refused" in retries[0].getMessage()


async def test_supervisor_raises_the_first_crash_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def healthy() -> None:
        await asyncio.sleep(3600)

    async def crashes() -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("watchdog bug")

    sup = Supervisor("test process")
    sup.spawn(healthy(), "heartbeat")
    sup.spawn(crashes(), "watchdog")
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="watchdog bug"):
        await asyncio.wait_for(sup.wait(asyncio.Event().wait()), 5)
    await sup.stop()
    assert all(t.done() for t in sup.tasks)
    (rec,) = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert "watchdog" in rec.getMessage() and rec.exc_info is not None


async def test_supervisor_returns_when_stopped() -> None:
    stop = asyncio.Event()
    sup = Supervisor("test process")
    sup.spawn(asyncio.sleep(3600), "idle")
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await asyncio.wait_for(sup.wait(stop.wait()), 5)
    await sup.stop()


async def test_wait_event_passes_on_a_cancellation_that_arrives_as_the_event_is_set() -> None:
    """The shape of the scheduler's and the worker's loops. `asyncio.wait_for` on Python 3.11
    returns the event's result here and the cancelled loop runs on forever (gh-86296)."""
    wake = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            wake.clear()
            await wait_event(wake, 1.0)
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    wake.set()
    await asyncio.sleep(0)  # the event's waiter completes; the loop has not resumed yet
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=3)
    assert done and task.cancelled(), f"the cancelled loop ran {rounds} more round(s)"


async def test_wait_event_says_whether_the_event_was_set() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, ev.set)
    assert await wait_event(ev, 5) is True
    assert await wait_event(ev, None) is True


async def test_stop_cancels_again_a_task_that_swallowed_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    swallowed = 0

    async def swallows_once() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise

    sup = Supervisor("test process")
    task = sup.spawn(swallows_once(), "stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        async with asyncio.timeout(5):
            await sup.stop()
    assert task.cancelled() and swallowed == 2
    (rec,) = [r for r in caplog.records if "cancelling them again" in r.getMessage()]
    assert rec.tasks == ["stubborn"]  # type: ignore[attr-defined]


async def test_stop_leaves_behind_a_task_that_never_ends_and_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def never_ends() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    sup = Supervisor("test process")
    sup.spawn(asyncio.sleep(3600), "idle")
    stuck = sup.spawn(never_ends(), "deaf")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        async with asyncio.timeout(5):
            await sup.stop(seconds=0.3)
    (rec,) = [r for r in caplog.records if "ignored their cancellation" in r.getMessage()]
    assert rec.tasks == ["deaf"]  # type: ignore[attr-defined]
    assert sup.tasks[0].cancelled() and not stuck.done()
    release.set()
    stuck.cancel()
    await asyncio.wait([stuck], timeout=5)
    assert stuck.done()


def test_a_failing_job_backs_off_alone() -> None:
    jobs = JobBackoff(first_seconds=1, max_seconds=8)
    assert jobs.failed("a", now=100.0) == 1
    assert jobs.waiting(100.5) == {"a"}
    assert jobs.waiting(101.5) == set()
    assert jobs.failed("a", now=101.5) == 2  # the next failure waits longer
    assert jobs.waiting(103.0) == {"a"}
    jobs.succeeded("a")
    assert jobs.waiting(103.0) == set()
