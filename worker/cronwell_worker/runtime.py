"""The worker: claims due occurrences of one pool, runs them under leases renewed by
heartbeats, completes them conditionally on their fence, retries with backoff, and
dead-letters after the last attempt.

A heartbeat that renews nothing means the lease was taken over: the attempt is cancelled at
once and can never be recorded as a success (its fence is stale, invariant 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

from cronwell import dispatch
from cronwell.dispatch import Claimed
from cronwell.errors import LeaseLost
from cronwell.handlers import Context
from cronwell.models import Delivery, RetryPolicy, ScheduledJobSpec
from cronwell.scheduler import process_id
from cronwell.settings import WorkerSettings
from cronwell.store.db import Database
from cronwell_worker import targets

log = logging.getLogger("cronwell.worker")


@dataclass
class Outcome:
    """What happened to one attempt (for the live view, tests and metrics)."""

    claimed: Claimed
    result: str  # succeeded | retry | dead | lease_lost | stale
    error: str | None = None
    finished_monotonic: float = field(default_factory=time.monotonic)


def backoff_seconds(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: base * factor^(attempt-1), capped, times [0.5, 1)."""
    base = min(policy.max_delay_seconds,
               policy.initial_delay_seconds * policy.factor ** max(0, attempt - 1))
    return base * (0.5 + 0.5 * (rng or random).random())


@dataclass
class _Running:
    claimed: Claimed
    ctx: Context
    task: asyncio.Task[None] | None = None


class Worker:
    def __init__(self, db: Database, settings: WorkerSettings, *,
                 worker_id: str | None = None,
                 on_outcome: Callable[[Outcome], None] | None = None):
        self.db = db
        self.settings = settings
        self.id = worker_id or process_id("worker")
        self.on_outcome = on_outcome
        self.running: dict[str, _Running] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._done: list[tuple[str, int, asyncio.Future[bool]]] = []
        self._flush_now = asyncio.Event()
        self._last_heartbeat_ok = time.monotonic()
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stop(); then drain within the grace period and release what is left."""
        self._http = httpx.AsyncClient(follow_redirects=False)
        tasks = [asyncio.create_task(c(), name=c.__name__) for c in
                 (self._listen, self._heartbeat_loop, self._complete_loop, self._registry_loop)]
        log.info("worker started", extra={"action": "worker_start", "worker": self.id,
                                           "pool": self.settings.pool})
        try:
            await self._claim_loop()
        finally:
            await self._drain()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._flush()
            with contextlib.suppress(Exception):
                await self.db.execute("ProcessDelete", {"id": self.id})
            await self._http.aclose()
            log.info("worker stopped", extra={"action": "worker_stop", "worker": self.id})

    def stop(self) -> None:
        """First call: stop claiming and drain. Second call: cancel running attempts."""
        if self._stopping.is_set():
            for r in list(self.running.values()):
                if r.task is not None:
                    r.task.cancel()
        self._stopping.set()
        self._wake.set()

    async def _drain(self) -> None:
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_seconds)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- claiming ---------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            free = s.concurrency - len(self.running)
            claimed: list[Claimed] = []
            delay = s.poll_seconds
            try:
                if free > 0:
                    want = min(free, s.claim_batch_size)
                    claimed = await dispatch.claim(self.db, pool=s.pool, worker_id=self.id,
                                                   limit=want, lease_seconds=s.lease_seconds)
                    for c in claimed:
                        self._start(c)
                    if len(claimed) == want:
                        continue
                    row = await self.db.fetchone("OccurrenceNextDue", {"pool": s.pool})
                    if row and row["next_due"] is not None:
                        delay = (row["next_due"] - row["db_now"]).total_seconds()
            except Exception as e:
                log.warning("claim failed", extra={"action": "claim_failed", "error": str(e)})
                delay = 1.0
            self._wake.clear()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(delay, s.poll_seconds))

    async def _listen(self) -> None:
        """LISTEN cronwell_due on a dedicated connection; wake the claim loop when a batch
        for our pool lands (it then asks the database when the batch is due)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.db.url, autocommit=True)
                async with conn:
                    await conn.execute("LISTEN cronwell_due")
                    self._wake.set()  # anything notified while we were not listening
                    async for n in conn.notifies():
                        with contextlib.suppress(ValueError):
                            if self.settings.pool in json.loads(n.payload):
                                self._wake.set()
            except (psycopg.Error, OSError) as e:
                log.info("listen connection lost; polling until it is back",
                         extra={"action": "listen_lost", "error": str(e)})
                await asyncio.sleep(1.0)

    # -- running ----------------------------------------------------------------------

    def _start(self, c: Claimed) -> None:
        ctx = Context(key=c.key, fence=c.fence, scheduled_for=c.scheduled_for,
                      attempt=c.attempt, namespace=c.namespace, name=c.name, db=self.db)
        r = _Running(c, ctx)
        self.running[c.key] = r
        r.task = asyncio.create_task(self._execute(r), name=f"attempt {c.key}")

    async def _execute(self, r: _Running) -> None:
        c, ctx = r.claimed, r.ctx
        extra = {"job": f"{c.namespace}/{c.name}", "key": c.key, "attempt": c.attempt,
                 "fence": c.fence}
        try:
            spec = ScheduledJobSpec.model_validate(c.spec)
        except Exception as e:
            await self._failed(c, targets.TargetError(
                f"stored spec is invalid: {e}", retryable=False, sent=False,
                reason="InvalidTarget"), extra)
            return
        try:
            assert self._http is not None
            await asyncio.wait_for(
                targets.run(spec.target, ctx, self._http, c.timeout_seconds), c.timeout_seconds)
        except (asyncio.CancelledError, LeaseLost):
            ctx.cancelled.set()
            log.warning("attempt aborted: lease lost or cancelled", extra=extra)
            self._report(Outcome(c, "lease_lost"))
            self.running.pop(c.key, None)
            return
        except TimeoutError:
            await self._failed(c, targets.TargetError(
                f"attempt timed out after {c.timeout_seconds}s", reason="Timeout"), extra,
                outcome="timeout", retry=spec.retry)
            return
        except targets.TargetError as e:
            await self._failed(c, e, extra, retry=spec.retry)
            return
        except Exception as e:
            await self._failed(c, targets.TargetError(f"{type(e).__name__}: {e}"), extra,
                               retry=spec.retry)
            return
        if ctx.completed_in_transaction:
            ok = True
        else:
            ok = await self._complete(c.key, c.fence)
        self._report(Outcome(c, "succeeded" if ok else "stale"))
        if not ok:
            log.warning("completion rejected: fence is stale", extra=extra)
        self.running.pop(c.key, None)

    async def _failed(self, c: Claimed, e: targets.TargetError, extra: dict[str, Any], *,
                      outcome: str = "failed", retry: RetryPolicy | None = None) -> None:
        at_most_once = c.delivery == Delivery.AT_MOST_ONCE
        retry_ok = e.retryable and c.attempt < c.max_attempts and (e.sent is False or
                                                                   not at_most_once)
        reason = "Ambiguous" if at_most_once and e.sent and e.retryable else e.reason
        if retry_ok:
            state, delay = "pending", backoff_seconds(retry or RetryPolicy(), c.attempt)
        else:
            state, delay = "dead", 0.0
            if e.retryable and reason != "Ambiguous":
                reason = "AttemptsExhausted"
        try:
            new = await dispatch.fail(self.db, key=c.key, fence=c.fence, next_state=state,
                                      reason=reason, error=str(e), delay_seconds=delay,
                                      outcome=outcome)
        except Exception as db_error:
            log.error("could not record failure; the lease will expire and be reaped",
                      extra=extra | {"error": str(db_error)})
            new = None
        log.warning("attempt failed", extra=extra | {"error": str(e), "next": new or "stale",
                                                     "retry_in": round(delay, 3)})
        self._report(Outcome(c, "retry" if new == "pending" else ("dead" if new else "stale"),
                             error=str(e)))
        self.running.pop(c.key, None)
        self._wake.set()

    def _report(self, outcome: Outcome) -> None:
        self._wake.set()
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    # -- completion batching ----------------------------------------------------------

    async def _complete(self, key: str, fence: int) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._done.append((key, fence, fut))
        self._flush_now.set()
        return await fut

    async def _complete_loop(self) -> None:
        while True:
            await self._flush_now.wait()
            await asyncio.sleep(self.settings.complete_flush_seconds)
            self._flush_now.clear()
            await self._flush()

    async def _flush(self) -> None:
        """Write every pending completion in one fenced statement."""
        batch, self._done = self._done, []
        if not batch:
            return
        for attempt in range(30):
            try:
                ok = await dispatch.succeed(self.db, [(k, f) for k, f, _ in batch])
                break
            except Exception as e:
                log.warning("completion write failed; retrying",
                            extra={"action": "complete_retry", "error": str(e)})
                await asyncio.sleep(min(2.0, 0.1 * 2 ** attempt))
        else:
            ok = set()
        for k, _, fut in batch:
            if not fut.done():
                fut.set_result(k in ok)

    # -- heartbeats -------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            await self.heartbeat_once()

    async def heartbeat_once(self) -> None:
        lease = self.settings.lease_seconds
        held = [(k, r.claimed.fence) for k, r in self.running.items()]
        try:
            alive = await dispatch.heartbeat(self.db, worker_id=self.id, running=held,
                                             lease_seconds=lease)
            self._last_heartbeat_ok = time.monotonic()
        except Exception as e:
            log.warning("heartbeat failed", extra={"action": "heartbeat_failed",
                                                    "error": str(e)})
            # Self-fence: past our lease without a renewal, another worker may own them.
            if time.monotonic() - self._last_heartbeat_ok > lease * 0.9:
                self._abort([k for k, _ in held], "no heartbeat within the lease")
            return
        self._abort([k for k, _ in held if k not in alive], "lease lost")

    def _abort(self, keys: list[str], why: str) -> None:
        for k in keys:
            r = self.running.get(k)
            if r is None or r.task is None or r.task.done():
                continue
            log.warning("LeaseLost: aborting attempt", extra={
                "action": "lease_lost", "key": k, "fence": r.claimed.fence,
                "attempt": r.claimed.attempt, "why": why})
            r.ctx.cancelled.set()
            r.task.cancel()

    async def _registry_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.db.execute("ProcessHeartbeat", {
                    "id": self.id, "role": "worker", "pool": self.settings.pool,
                    "hostname": socket.gethostname(), "pid": os.getpid(),
                    "version": _version(), "concurrency": self.settings.concurrency,
                    "running": len(self.running)})
            await asyncio.sleep(5.0)


def _version() -> str:
    from cronwell import __version__

    return __version__
