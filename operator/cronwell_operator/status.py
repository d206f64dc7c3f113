"""Status write-back: one writer drains the store's change log into CR status and Events.

Triggers in the store append a row to `cronwell_status_changes` for every change that can
alter a job's status (see migration 0002). The writer, running only in the leader:

1. reads the oldest rows (a batch), and coalesces them per job: 50 changes of one job in a
   pass become one status patch;
2. computes each job's status from the store (`JobStatusBatch`), never from the rows, so a
   re-read row or a missed one cannot make the status wrong, only late;
3. patches the status subresource only when it differs from what the CR shows (a cache of
   the last status seen or written), and posts Events for dead letters, missed runs and
   failed attempts (one Event per reason per job per pass, with a count);
4. deletes the rows it handled; rows of a job whose patch failed stay, and that job backs
   off (exponentially, per job): its rows are skipped by the next reads, so a job that
   keeps failing never blocks the jobs behind it, and a pass where every write failed
   waits before the next one instead of looping against the API server.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from cronwell.errors import EXPECTED_ERRORS
from cronwell.metrics import Metrics
from cronwell.models import Condition, LastResult, RunCounters, ScheduledJobStatus
from cronwell.store import gauges
from cronwell.store.db import Database
from cronwell.supervise import Backoff, repeat
from cronwell_operator.kube import CRef, Kube, KubeError, KubeNotFound
from cronwell_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Condition)

_RESULTS = {
    "succeeded": LastResult.SUCCEEDED,
    "dead": LastResult.DEAD,
    "missed": LastResult.MISSED,
    "skipped": LastResult.SKIPPED,
    "cancelled": LastResult.CANCELLED,
}


# ----------------------------------------------------------------------------- pure parts


def format_duration(seconds: float | None) -> str | None:
    """Go-style durations, as kubectl shows them: 850ms, 12.5s, 3m4s, 2h0m5s."""
    if seconds is None:
        return None
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{seconds:.1f}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


def _utc(t: datetime | None) -> datetime | None:
    return t.astimezone(UTC).replace(microsecond=0) if t is not None else None


def condition(
    model: type[C],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
    now: datetime,
) -> C:
    """A `model` condition that keeps its lastTransitionTime while its status does not
    change (ScheduledJob and WorkerPool conditions alike)."""
    prev = previous.get(type_)
    since = now
    if prev is not None and prev.get("status") == status and prev.get("lastTransitionTime"):
        since = datetime.fromisoformat(str(prev["lastTransitionTime"]).replace("Z", "+00:00"))
    return model(
        type=type_,
        status=status,
        reason=reason,
        message=message[:2000],
        last_transition_time=since,
        observed_generation=generation,
    )


def build_status(
    row: Mapping[str, Any] | None,
    *,
    previous: Mapping[str, Any] | None,
    spec_error: tuple[int, str] | None,
    now: datetime,
) -> dict[str, Any]:
    """The status to write (camelCase JSON; None removes a field in a merge patch).

    `row` is a JobStatusBatch row (None: the store has no live job for the CR), `previous`
    the status the CR shows (for condition transition times), `spec_error` the generation
    and message of a spec the store refused.
    """
    prev_conditions = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    now = now.replace(microsecond=0)
    gen = int(row["generation"]) if row is not None else None
    invalid = spec_error is not None and (gen is None or spec_error[0] > gen)

    def cond(type_: str, ok: bool, reason: str, message: str) -> Condition:
        status = "True" if ok else "False"
        return condition(Condition, type_, status, reason, message, gen, prev_conditions, now)

    if row is None:
        status = ScheduledJobStatus(
            conditions=[
                cond(
                    "Ready",
                    False,
                    "InvalidSpec" if invalid else "NotReconciled",
                    spec_error[1] if spec_error and invalid else "not in the store yet",
                )
            ]
        )
        return _dump(status)

    suspended, why = bool(row["suspended"]), row["suspended_reason"]
    failures = int(row["consecutive_failures"])
    if invalid and spec_error is not None:
        ready = cond("Ready", False, "InvalidSpec", spec_error[1])
    elif suspended and why == "SuspendedAfterFailures":
        ready = cond(
            "Ready",
            False,
            "SuspendedAfterFailures",
            f"suspended after {failures} dead-lettered runs in a row: fix the cause, then "
            "change the spec (e.g. toggle spec.suspend) or run `cronwell resume`",
        )
    elif suspended:
        ready = cond("Ready", True, "Suspended", "suspended: no run is scheduled")
    elif row["schedule_done"]:
        ready = cond("Ready", True, "Completed", "no further run is scheduled")
    else:
        ready = cond("Ready", True, "Scheduled", "the store runs this generation")

    if suspended:
        # The store's reasons that are also condition reasons; anything else is the spec's.
        reason = why if why in {"SuspendedAfterFailures", "Manual", "Paused"} else "Spec"
        susp = cond("Suspended", True, reason, f"suspended ({reason})")
    else:
        susp = cond("Suspended", False, "Active", "runs are scheduled")

    last_fail, last_ok = row["last_failure_time"], row["last_successful_time"]
    if last_fail is not None and (last_ok is None or last_fail > last_ok):
        failing = cond(
            "Failing",
            True,
            "AttemptFailed",
            f"last attempt failed at {_iso(last_fail)}: {row['last_error'] or 'unknown error'}",
        )
    else:
        failing = cond("Failing", False, "NoFailures", "no attempt failed since the last success")

    if failures > 0:
        dead_reason = (row["last_reason"] if row["last_state"] == "dead" else None) or (
            "DeadLettered"
        )
        dead = cond(
            "DeadLettered",
            True,
            dead_reason,
            f"{failures} run(s) in a row dead-lettered"
            + (f"; latest {row['last_key']}" if row["last_state"] == "dead" else ""),
        )
    else:
        dead = cond("DeadLettered", False, "NoDeadLetters", "the latest run was not dead-lettered")

    status = ScheduledJobStatus(
        observed_generation=gen,
        next_schedule_time=_utc(row["next_schedule_time"]),
        last_schedule_time=_utc(row["last_schedule_time"]),
        last_successful_time=_utc(last_ok),
        last_failure_time=_utc(last_fail),
        last_result=_RESULTS.get(row["last_state"] or ""),
        last_duration=format_duration(
            float(row["last_duration_seconds"])
            if row["last_duration_seconds"] is not None
            else None
        ),
        consecutive_failures=failures,
        active=int(row["active"] or 0),
        counters=RunCounters(
            succeeded=int(row["succeeded"] or 0),
            failed=int(row["failed"] or 0),
            dead=int(row["dead"] or 0),
            missed=int(row["missed_total"] or 0),
            skipped=int(row["skipped"] or 0),
        ),
        conditions=[ready, susp, failing, dead],
    )
    return _dump(status)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _dump(status: ScheduledJobStatus) -> dict[str, Any]:
    # kopf's bookkeeping (status.kopf) is never touched; every other field is ours.
    doc: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude={"kopf"})
    return doc


def same_status(ours: Mapping[str, Any], shown: Mapping[str, Any] | None) -> bool:
    """Would patching `ours` change what the CR shows? (None fields mean absent.)"""
    shown = shown or {}
    for key, value in ours.items():
        if value is None:
            if shown.get(key) is not None:
                return False
        elif _norm(shown.get(key)) != _norm(value):
            return False
    return True


def _norm(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


@dataclass(frozen=True)
class EventSpec:
    type: str
    reason: str
    message: str


def events_for(changes: Iterable[Mapping[str, Any]]) -> list[EventSpec]:
    """Warning Events for one job's changes in a pass: dead letters, missed runs and failed
    attempts, one Event per reason with a count (never one per row)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for ch in changes:
        state = ch.get("state")
        if state == "dead":
            by_kind["DeadLettered"].append(ch)
        elif state == "missed":
            by_kind["MissedRun"].append(ch)
        elif state == "pending" and (ch.get("attempt") or 0) > 0:
            by_kind["AttemptFailed"].append(ch)
    out = []
    for reason, rows in by_kind.items():
        latest = max(rows, key=lambda r: r["id"])
        when = _iso(latest["scheduled_for"]) if latest.get("scheduled_for") else "?"
        detail = latest.get("error") or latest.get("reason") or ""
        if reason == "DeadLettered":
            msg = f"{len(rows)} run(s) dead-lettered; latest {when}"
        elif reason == "MissedRun":
            msg = f"{len(rows)} run(s) missed; latest {when}"
        else:
            msg = f"{len(rows)} attempt(s) failed and will be retried; latest {when}"
            msg += f" (attempt {latest.get('attempt')})"
        out.append(EventSpec("Warning", reason, f"{msg}: {detail}" if detail else msg))
    return out


def spec_error_reason(message: str) -> str:
    """The Event reason of a refused spec: specific where Kubernetes CronJob has one."""
    if "spec.timeZone" in message:
        return "UnknownTimeZone"
    if "spec.schedule" in message:
        return "InvalidSchedule"
    return "InvalidSpec"


# Ready=False reasons that are failures the user must act on (each posts one Warning).
_FAILING_READY = {"InvalidSpec", "SuspendedAfterFailures"}


def transition_events(
    previous: Mapping[str, Any] | None, status: Mapping[str, Any]
) -> list[EventSpec]:
    """A Warning Event when the Ready condition enters a failure (a refused spec, a
    suspension after failures) or its message changes: once per transition, never per
    pass or per metadata-only edit (the CR's own status is the memory, so a restarted
    operator does not post it again)."""
    prev = _ready(previous)
    new = _ready(status)
    if new.get("status") != "False" or new.get("reason") not in _FAILING_READY:
        return []
    if (prev.get("reason"), prev.get("message")) == (new.get("reason"), new.get("message")):
        return []
    message = str(new.get("message") or "")
    reason = str(new["reason"])
    if reason == "InvalidSpec":
        reason = spec_error_reason(message)
    return [EventSpec("Warning", reason, message)]


def _ready(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return {}


# --------------------------------------------------------------------------- rate limiting


class TokenBucket:
    """`rate` requests per second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


# --------------------------------------------------------------------------------- writer


@dataclass
class WriterStats:
    passes: int = 0
    patches: int = 0
    skipped: int = 0
    events: int = 0
    errors: int = 0
    rows: int = 0


class JobBackoff:
    """Per-job retry times after failed status writes (monotonic seconds)."""

    def __init__(self, first_seconds: float = 1.0, max_seconds: float = 60.0):
        self.first, self.max = first_seconds, max_seconds
        self._jobs: dict[str, tuple[Backoff, float]] = {}

    def failed(self, uid: str, now: float) -> float:
        """Record a failure; seconds until the job is tried again."""
        b = self._jobs.get(uid, (Backoff(self.first, self.max), 0.0))[0]
        delay = b.failure()
        self._jobs[uid] = (b, now + delay)
        return delay

    def succeeded(self, uid: str) -> None:
        self._jobs.pop(uid, None)

    def waiting(self, now: float) -> set[str]:
        """Jobs not to be tried now."""
        return {uid for uid, (_, at) in self._jobs.items() if at > now}


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
        self._limiter = TokenBucket(self.settings.status_qps, self.settings.status_burst)
        self._sem = asyncio.Semaphore(self.settings.status_concurrency)
        self._clock_offset = 0.0
        self.backoff = JobBackoff()

    # -- called by the kopf handlers (same event loop)

    def seen(self, ref: CRef, status: Mapping[str, Any] | None) -> None:
        """A handler saw this CR: remember its identity and the status it shows."""
        known = self._known.get(ref.uid)
        if known is None:
            self._known[ref.uid] = _Known(ref, dict(status or {}))
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

    # -- the loop

    async def run(self) -> None:
        log.info("status writer started", extra={"action": "status_writer_start"})
        self.metrics.operator_leader.set(1)

        async def step() -> float:
            try:
                busy = await self.pass_once()
            except EXPECTED_ERRORS:
                self.stats.errors += 1
                raise
            if not busy:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.status_poll_seconds)
            return 0.0

        try:
            await repeat("status write-back", step, interval_seconds=0.0)
        finally:
            self.metrics.operator_leader.set(0)

    async def pass_once(self) -> bool:
        """One pass; True when the log had a full batch (more is waiting)."""
        s = self.settings
        backlog = await gauges.status_backlog(self.db)
        if backlog is not None:
            self.metrics.operator_status_backlog.set(backlog.n)
            # database clock - local clock: lags are measured on the clock that stamped rows
            self._clock_offset = backlog.now.timestamp() - time.time()
        waiting = self.backoff.waiting(time.monotonic())
        rows = await self.db.fetch(
            "StatusChangesRead",
            {"limit": s.status_batch_size, "skip": [uuid.UUID(u) for u in waiting]},
        )
        self.stats.passes += 1
        changes: dict[str, list[Any]] = defaultdict(list)
        for r in rows:
            changes[str(r["job_id"])].append(r)
        touched = self._touched - waiting
        self._touched -= touched
        uids = sorted(set(changes) | touched)
        if not uids:
            return False
        facts = {
            str(r["id"]): r
            for r in await self.db.fetch("JobStatusBatch", {"ids": [uuid.UUID(u) for u in uids]})
        }
        results = await asyncio.gather(
            *(self._write(uid, facts.get(uid), changes.get(uid, [])) for uid in uids)
        )
        done = [r["id"] for uid, ok in zip(uids, results, strict=True) if ok for r in changes[uid]]
        now = time.monotonic()
        for uid, ok in zip(uids, results, strict=True):
            if ok:
                self.backoff.succeeded(uid)
            else:
                self.backoff.failed(uid, now)
                self._touched.add(uid)
        if done:
            await self.db.execute("StatusChangesDelete", {"ids": done})
        self.stats.rows += len(done)
        # More is waiting only if this pass made progress: a pass where every write failed
        # (the API server is down) waits for the poll interval, not loops at once.
        return len(rows) >= s.status_batch_size and any(results)

    async def _write(self, uid: str, row: Any, changes: list[Any]) -> bool:
        """Bring one CR's status up to date; False to retry it next pass."""
        known = self._known.get(uid)
        if row is not None and row["deleted_at"] is not None:
            return True  # the CR is gone or going: nothing to report on
        if known is None:
            if row is None:
                return True  # no CR known and no job: nothing to write
            known = self._known.setdefault(uid, _Known(CRef(uid, row["namespace"], row["name"])))
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
                        oldest = min(c["changed_at"] for c in changes).timestamp()
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
