"""One supervisor for the background tasks of a process (kopf's `aiotasks.guard` is the
model): a task that dies is noticed at once, not when the process shuts down.

- `repeat()` runs one step of a loop forever. Expected errors (`EXPECTED_ERRORS`: the
  database or the API server unavailable) are logged as one line and retried with
  exponential backoff; anything else propagates.
- `Supervisor` runs a process's tasks. The first task to fail with an unexpected error is
  logged with its traceback, the others are cancelled and the error is raised, so the
  process exits non-zero and Kubernetes restarts it instead of it limping on (a worker
  whose self-fencing watchdog died must not keep claiming).
- `wait_event()` waits for an event at most so long. Not `asyncio.wait_for`: on Python 3.11
  it swallows a cancellation that arrives as the awaited thing completes (CPython
  gh-86296), and a loop cancelled at shutdown then runs on forever. Ruff bans it here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

from cronwell.errors import EXPECTED_ERRORS
from cronwell.liveness import Liveness

log = logging.getLogger(__name__)


class Backoff:
    """Exponential backoff for retries: 0 after a success, then first, 2x first, ... up
    to `max_seconds`."""

    def __init__(self, first_seconds: float = 0.5, max_seconds: float = 30.0):
        self.first = first_seconds
        self.max = max_seconds
        self.failures = 0

    def success(self) -> None:
        self.failures = 0

    def failure(self) -> float:
        """Count a failure; the delay before the next try."""
        self.failures += 1
        return float(min(self.max, self.first * 2 ** (self.failures - 1)))


RETRY_MAX_SECONDS = 2.0
"""The longest a loop waits between tries through an outage: once the database is back,
work resumes within about this (a 30 s cap added up to 44 s before the first
materialisation after a 90 s outage)."""


async def repeat(
    name: str,
    step: Callable[[], Awaitable[float | None]],
    *,
    interval_seconds: float,
    backoff: Backoff | None = None,
    expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS,
    live: Liveness | None = None,
) -> NoReturn:
    """Run `step` forever: sleep what it returns (None: `interval_seconds`) after a success;
    after an expected error log one line and back off; let anything else propagate.
    `live` hears when a step starts and when one succeeds (liveness means progress)."""
    backoff = backoff or Backoff(max_seconds=RETRY_MAX_SECONDS)
    while True:
        if live is not None:
            live.waiting(name)
        try:
            delay = await step()
            if live is not None:
                live.progressed(name)
        except expected as e:
            delay = backoff.failure()
            log.warning(
                f"{name} failed; retrying in {delay:.1f}s: {e}",
                extra={"action": "task_retry", "task": name, "retry_in": delay},
            )
        else:
            backoff.success()
            if delay is None:
                delay = interval_seconds
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `event` is set or `seconds` pass (None: no limit); True when it is set.
    A cancellation always propagates (see the module's docstring)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


class Supervisor:
    """The background tasks of one process, watched while they run."""

    def __init__(self, owner: str):
        self.owner = owner
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self.tasks.append(task)
        return task

    async def wait(self, until: Awaitable[Any] | None = None) -> None:
        """Until `until` completes (e.g. a stop event) or a task ends: a task that raised
        is logged with its traceback and re-raised; one that returned is a bug too."""
        stopper = asyncio.ensure_future(until) if until is not None else None
        waiting: set[asyncio.Future[Any]] = set(self.tasks)
        if stopper is not None:
            waiting.add(stopper)
        try:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopper is not None and not stopper.done():
                stopper.cancel()
        for t in done:
            if t.cancelled() or not isinstance(t, asyncio.Task):
                continue
            exc = t.exception()
            if t is stopper and exc is None:
                continue
            if exc is None:
                exc = RuntimeError(f"background task {t.get_name()} of {self.owner} ended")
            log.error(
                f"background task {t.get_name()} of {self.owner} crashed; stopping",
                exc_info=exc,
                extra={"action": "task_crashed", "task": t.get_name()},
            )
            raise exc

    async def stop(self, seconds: float = 10.0) -> None:
        """Cancel every task and wait for them to end, cancelling again each second a task
        that swallowed its cancellation (third-party code on Python 3.11 can: see
        `wait_event`). One still running after `seconds` is logged by name and left behind:
        a process stopping must not hang on it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pending = {t for t in self.tasks if not t.done()}
        while pending:
            for t in pending:
                t.cancel()
            left = max(0.0, deadline - loop.time())
            _, pending = await asyncio.wait(pending, timeout=min(1.0, left))
            if not pending:
                break
            give_up = loop.time() >= deadline
            (log.error if give_up else log.warning)(
                f"background tasks of {self.owner} "
                + (
                    "ignored their cancellation; leaving them behind"
                    if give_up
                    else "still running after their cancellation; cancelling them again"
                ),
                extra={
                    "action": "task_stuck" if give_up else "task_cancel_again",
                    "tasks": sorted(t.get_name() for t in pending),
                },
            )
            if give_up:
                return
        # Retrieve the tasks' exceptions, so none is reported as never retrieved.
        await asyncio.gather(*self.tasks, return_exceptions=True)
