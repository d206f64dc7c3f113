"""Status write-back: one writer drains the store's change log into CR status and Events.

Triggers in the store append a row to `cronwell_status_changes` for every change that can
alter a job's status (see migration 0002). The writer, running only in the leader:

1. reads the oldest rows (a batch), and coalesces them per job: 50 changes of one job in a
   pass become one status patch;
2. computes each job's status from the store (`JobStatusBatch`), never from the rows, so a
   re-read row or a missed one cannot make the status wrong, only late;
3. patches the status subresource only when it differs from what the CR shows (a cache of
   the last status seen or written), and posts Events for dead letters, missed runs and
   failed attempts (one Event per reason per job per pass, with a count); with more jobs
   waiting than one chunk, failures go first and a job still running goes last in the
   pass, and one whose run began less than SETTLE_SECONDS ago waits for a later pass, so
   that a burst's CRs are patched once each (when their run has ended), not twice;
4. deletes the rows it handled; rows of a job whose patch failed stay, and that job backs
   off (exponentially, per job): its rows are skipped by the next reads, so a job that
   keeps failing never blocks the jobs behind it, and a pass where every write failed
   waits before the next one instead of looping against the API server.

The store logs changes only while a writer is declared (migration 0014): the writer
declares itself before its first pass and renews the declaration every third of
`declaration_seconds` (30 s by default; a writer that dies leaves the log filling that long,
one that stops withdraws it). Whenever logging may have been off (the first declaration, or
a renewal that came after the previous one expired) the writer resyncs: every CR it knows
is written from the store in the next pass, and so is every CR a handler shows it for the
first time (kopf resumes every CR at start), so no status stays stale for good.

Every patch and Event goes through one token bucket (`status_qps`, `status_burst`): the
API server sees a bounded request rate however large a burst of runs is.

Metrics (the shared `Metrics`): each pass sets the backlog gauge (rows still in the log),
each request counts in `cronwell_operator_api_requests{kind}`, each patch observes the lag
from the job's oldest logged change (the database's clock, offset by the pass's reading of
it) to the patch. The writer runs exactly while this replica leads: it holds the leader
gauge at 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cronwell.errors import EXPECTED_ERRORS
from cronwell.metrics import Metrics
from cronwell.store import clock, gauges, status_changes
from cronwell.store.db import Database
from cronwell.store.status_changes import JobStatus, StatusChange
from cronwell.supervise import repeat, wait_event
from cronwell_operator.kube import CRef, Kube, KubeError, KubeNotFound
from cronwell_operator.ratelimit import JobBackoff, TokenBucket
from cronwell_operator.settings import OperatorSettings
from cronwell_operator.status_build import build_status, events_for, same_status, transition_events

log = logging.getLogger(__name__)

#: How long a job whose run has just begun may wait for its end before it is written as
#: running (see pass_once). Above the workers' claim ahead (2 s by default): an occurrence
#: claimed ahead is logged as running before its instant, and most runs end soon after it.
SETTLE_SECONDS = 5.0


def is_failure(change: StatusChange) -> bool:
    """A dead letter or a failed attempt: written before successes."""
    return change.state == "dead" or (change.state == "pending" and (change.attempt or 0) > 0)


# --------------------------------------------------------------------------------- writer


@dataclass
class WriterStats:
    passes: int = 0
    patches: int = 0
    skipped: int = 0
    events: int = 0
    errors: int = 0
    rows: int = 0


@dataclass
class _Known:
    ref: CRef
    status: dict[str, Any] | None = None  # what the CR shows (None: not known yet)
    spec_error: tuple[int, str] | None = None


@dataclass
class StatusWriter:
    db: Database
    kube: Kube
    settings: OperatorSettings
    stats: WriterStats = field(default_factory=WriterStats)
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        self._known: dict[str, _Known] = {}
        self._touched: set[str] = set()
        self._wake = asyncio.Event()
        self._limiter = TokenBucket(self.settings.status.qps, self.settings.status.burst)
        self._sem = asyncio.Semaphore(self.settings.status.concurrency)
        self._clock_offset = 0.0
        self.backoff = JobBackoff()
        self._covered_until: datetime | None = None  # the declaration's expiry
        self._stragglers: list[str] = []  # unlogged transactions open past the gap wait
        self._declared = asyncio.Event()

    # -- called by the kopf handlers (same event loop)

    def seen(self, ref: CRef, status: Mapping[str, Any] | None) -> None:
        """A handler saw this CR: remember its identity and the status it shows. One seen
        for the first time is written from the store: changes made while no writer was
        declared were not logged (at start, kopf resumes every CR: a full pass)."""
        known = self._known.get(ref.uid)
        if known is None:
            self._known[ref.uid] = _Known(ref, dict(status or {}))
            self.touch(ref.uid)
        elif known.status is None:
            known.status = dict(status or {})

    def set_spec_error(self, ref: CRef, generation: int, message: str | None) -> None:
        known = self._known.setdefault(ref.uid, _Known(ref))
        new = (generation, message) if message else None
        if new != known.spec_error:
            known.spec_error = new
            self.touch(ref.uid)

    def forget(self, uid: str) -> None:
        self._known.pop(uid, None)
        self._touched.discard(uid)

    def touch(self, uid: str) -> None:
        self._touched.add(uid)
        self._wake.set()

    # -- the declaration

    async def declare(self) -> float:
        """Declare this writer in the store (or renew it); seconds until the next renewal.
        If logging may have been off since the last declaration, resync every known CR."""
        s = self.settings
        ttl = s.status.declaration_seconds
        if self._stragglers and not await status_changes.gap_holders(self.db, self._stragglers):
            self._stragglers = []
            self.resync()  # the unlogged transactions waited past the bound have ended
        if self._covered_until is not None:
            until, _ = await status_changes.declare_writer(
                self.db, identity=s.identity, ttl_seconds=ttl, after_gap=False
            )
            # committed before the previous declaration expired: logging never stopped
            if await clock.now(self.db) < self._covered_until:
                self._covered_until = until
                return ttl / 3
        self._covered_until, self._stragglers = await status_changes.declare_writer(
            self.db, identity=s.identity, ttl_seconds=ttl, after_gap=True
        )
        if self._stragglers:
            log.warning(
                "transactions that logged nothing are still open after the declaration's "
                "ttl; resyncing now and again when they end",
                extra={"action": "status_gap_stragglers", "n": len(self._stragglers)},
            )
        self.resync()
        self._declared.set()
        return ttl / 3

    def resync(self) -> None:
        """Write every known CR from the store in the next pass (changes may be unlogged)."""
        log.info(
            "status writer declared: resync",
            extra={"action": "status_resync", "jobs": len(self._known)},
        )
        for uid in self._known:
            self.touch(uid)

    async def retire(self) -> None:
        """Withdraw the declaration (a clean stop): the log stops filling at once."""
        self._covered_until = None
        with contextlib.suppress(TimeoutError, *EXPECTED_ERRORS):
            async with asyncio.timeout(5):
                await status_changes.retire_writer(self.db, identity=self.settings.identity)

    # -- the loop

    async def run(self) -> None:
        log.info("status writer started", extra={"action": "status_writer_start"})
        self.metrics.operator_leader.set(1)
        declaring = asyncio.create_task(
            repeat("status writer declaration", self.declare, interval_seconds=0.0)
        )

        async def step() -> float:
            if declaring.done():
                await declaring  # it failed unexpectedly: so does the writer
            if not self._declared.is_set():  # passes only once changes are logged
                await wait_event(self._declared, self.settings.status.poll_seconds)
                return 0.0
            try:
                busy = await self.pass_once()
            except EXPECTED_ERRORS:
                self.stats.errors += 1
                raise
            if not busy:
                self._wake.clear()
                await wait_event(self._wake, self.settings.status.poll_seconds)
            return 0.0

        try:
            await repeat("status write-back", step, interval_seconds=0.0)
        finally:
            declaring.cancel()
            await asyncio.gather(declaring, return_exceptions=True)
            await self.retire()
            self.metrics.operator_leader.set(0)

    async def pass_once(self) -> bool:
        """One pass; True when the log had a full batch (more is waiting). Jobs with a
        failure (a dead letter or a failed attempt) are written first: the read puts their
        rows first, and before each chunk of writes the pass looks for failures logged
        since it began, so a failure never waits behind a whole batch of successes."""
        s = self.settings
        backlog = await gauges.status_backlog(self.db)
        if backlog is not None:
            self.metrics.operator_status_backlog.set(backlog.n)
            # database clock - local clock: lags are measured on the clock that stamped rows
            self._clock_offset = backlog.now.timestamp() - time.time()
        waiting = self.backoff.waiting(time.monotonic())
        skip = [uuid.UUID(u) for u in waiting]
        rows = await status_changes.read(self.db, limit=s.status.batch_size, skip=skip)
        self.stats.passes += 1
        changes: dict[str, list[StatusChange]] = defaultdict(list)
        for r in rows:
            changes[str(r.job_id)].append(r)
        touched = self._touched - waiting
        self._touched -= touched
        urgent = {str(r.job_id) for r in rows if is_failure(r)}
        queue = sorted(set(changes) | touched, key=lambda u: (u not in urgent, u))
        if not queue:
            return False
        # a chunk: about two seconds of writes at the rate limit
        chunk = max(s.status.concurrency, int(s.status.qps * 2))
        seen = [r.id for r in rows]
        results: list[bool] = []
        deferred: set[str] = set()
        while queue:
            if results:  # failures logged since the pass began jump the queue
                late = await status_changes.read_failures(
                    self.db, limit=s.status.batch_size, skip=skip, seen=seen
                )
                for r in late:
                    u = str(r.job_id)
                    changes[u].append(r)
                    seen.append(r.id)
                if late:
                    first = {str(r.job_id) for r in late}
                    queue = sorted(first) + [u for u in queue if u not in first]
            uids, queue = queue[:chunk], queue[chunk:]
            facts = {
                str(r.id): r
                for r in await status_changes.job_status(self.db, [uuid.UUID(u) for u in uids])
            }
            # A running job would need a second patch when its run ends. With more waiting,
            # it is written once, after the rest of the pass (deferred once, not more); when
            # it comes round again (or in the last chunk) and its changes were all logged
            # moments ago (a burst's run), it is left to a later pass, its rows kept. Not for
            # long: once its oldest change is SETTLE_SECONDS old it is written as running.
            active = {u for u in uids if u not in urgent and u in facts and facts[u].active}
            later = {u for u in active if u not in deferred} if queue else set()
            young = {
                u
                for u in active - later
                if self._oldest_change_age(changes.get(u)) < SETTLE_SECONDS
            }
            if later or young:
                deferred |= later
                queue += sorted(later)
                uids = [u for u in uids if u not in later and u not in young]
                if not uids:
                    continue
            batch = {uid: changes.pop(uid, []) for uid in uids}
            ok = await asyncio.gather(
                *(self._write(uid, facts.get(uid), batch[uid]) for uid in uids)
            )
            results += ok
            now = time.monotonic()
            for uid, good in zip(uids, ok, strict=True):
                if good:
                    self.backoff.succeeded(uid)
                else:
                    self.backoff.failed(uid, now)
                    self._touched.add(uid)
            done = [c.id for uid, good in zip(uids, ok, strict=True) if good for c in batch[uid]]
            if done:
                await status_changes.delete(self.db, done)
            self.stats.rows += len(done)
        # More is waiting only if this pass made progress: a pass where every write failed
        # (the API server is down) waits for the poll interval, not loops at once.
        return len(rows) >= s.status.batch_size and any(results)

    def _oldest_change_age(self, changes: list[StatusChange] | None) -> float:
        """Seconds since the job's oldest unwritten change (the database's clock): the
        oldest, so that a job that is always running (a per-second cron) still waits at
        most SETTLE_SECONDS; infinite for a job with none (touched by a handler)."""
        if not changes:
            return float("inf")
        oldest = min(c.changed_at for c in changes).timestamp()
        return time.time() + self._clock_offset - oldest

    async def _write(self, uid: str, row: JobStatus | None, changes: list[StatusChange]) -> bool:
        """Bring one CR's status up to date; False to retry it next pass."""
        known = self._known.get(uid)
        if row is not None and row.deleted_at is not None:
            return True  # the CR is gone or going: nothing to report on
        if known is None:
            if row is None:
                return True  # no CR known and no job: nothing to write
            known = self._known.setdefault(uid, _Known(CRef(uid, row.namespace, row.name)))
        ref = known.ref
        try:
            async with self._sem:
                if known.status is None:
                    await self._limiter.take()
                    self.metrics.operator_api_requests.labels(kind="status_get").inc()
                    obj = await self.kube.get_scheduledjob(ref.namespace, ref.name)
                    if obj["metadata"]["uid"] != uid:
                        raise KubeNotFound(f"{ref.namespace}/{ref.name} was re-created")
                    known.status = dict(obj.get("status") or {})
                now = datetime.now(UTC)
                status = build_status(
                    row, previous=known.status, spec_error=known.spec_error, now=now
                )
                posts = events_for(changes)
                if same_status(status, known.status):
                    self.stats.skipped += 1
                else:
                    posts = transition_events(known.status, status) + posts
                    await self._limiter.take()
                    self.metrics.operator_api_requests.labels(kind="status_patch").inc()
                    await self.kube.patch_status(ref.namespace, ref.name, status)
                    known.status = {**known.status, **status}
                    self.stats.patches += 1
                    if changes:
                        oldest = min(c.changed_at for c in changes).timestamp()
                        lag = time.time() + self._clock_offset - oldest
                        self.metrics.operator_status_lag.observe(max(0.0, lag))
                for ev in posts:
                    await self._limiter.take()
                    self.metrics.operator_api_requests.labels(kind="event").inc()
                    await self.kube.post_event(
                        ref,
                        type_=ev.type,
                        reason=ev.reason,
                        message=ev.message,
                        instance=self.settings.identity,
                    )
                    self.stats.events += 1
            return True
        except KubeNotFound:
            self.forget(uid)
            return True
        except KubeError as e:
            self.stats.errors += 1
            # 400/403/422 will not get better by retrying the same write: drop these rows
            # (the next change of the job tries again) rather than block the log's head.
            permanent = e.status in (400, 403, 422)
            log.warning(
                "status write failed",
                extra={
                    "action": "status_error",
                    "job": uid,
                    "error": str(e),
                    "retry": not permanent,
                },
            )
            return permanent
