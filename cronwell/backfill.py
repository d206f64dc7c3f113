"""Backfill: run the instants of a past window that never ran, under their real keys.

Every nominal instant of the job's schedule in the window (its zone, DST policy and
startAt/endAt, from `JobSchedule`, as the scheduler enumerates them) gets the key the
scheduler would have given it (`schedule.occurrence_key`, invariant 5). So:

- an instant with no occurrence gets one (origin `backfill`, pending, claimable now);
- an instant recorded `missed` (misfire policy) becomes pending again, exactly once: only
  rows still `missed` match, and they stop being missed here;
- an instant that already has any other occurrence (succeeded, dead, running, pending,
  skipped, cancelled, waiting) is left alone: the unique key makes the insert a no-op.

Backfilled occurrences all become claimable now (no spreading): workers take them in
batches at their own concurrency. Jobs whose concurrencyPolicy serialises runs (everything
but Allow) get the backfill with overlap BufferAll, so the window runs one instant at a
time, oldest first, instead of being skipped or replaced by the job's own policy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cronwell import dispatch, schedule
from cronwell.errors import CronwellError, JobNotFound
from cronwell.models import ConcurrencyPolicy, ScheduledJobSpec
from cronwell.store import backfill as store_backfill
from cronwell.store import claims, clock, history_partitions
from cronwell.store.db import Database

DEFAULT_MAX_INSTANTS = 10_000


class BackfillError(CronwellError):
    """A backfill request that cannot be honoured as given (the message says what to do)."""


class BackfillCountChanged(BackfillError):
    """The window would now create or reopen a different number of occurrences than the
    caller confirmed (the dashboard's confirm step): nothing was written."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(
            f"the window would now run {found} instant(s), not the {expected} confirmed: "
            "nothing was changed; review and confirm again"
        )
        self.expected, self.found = expected, found


@dataclass
class BackfillResult:
    """What a backfill found in the window and what it did (or would do, dry run)."""

    namespace: str
    name: str
    start: datetime
    end: datetime
    instants: list[datetime] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    """Keys of the occurrences created (dry run: that would be)."""
    reopened: list[str] = field(default_factory=list)
    """Keys of missed instants made pending again (dry run: that would be)."""
    present: Counter[str] = field(default_factory=Counter)
    """Instants left alone because they already have an occurrence, by its state."""
    dry_run: bool = False


def backfill_overlap(policy: str) -> str:
    """Serial jobs run a backfill one instant at a time, in order; Allow jobs in parallel."""
    return policy if policy == ConcurrencyPolicy.ALLOW.value else ConcurrencyPolicy.BUFFER_ALL.value


def window_instants(
    sched: schedule.JobSchedule, start: datetime, end: datetime, limit: int
) -> list[datetime]:
    """Nominal instants in [start, end]; BackfillError past `limit` (checked while
    enumerating, so a per-second cron over a year costs `limit` steps, not 31M)."""
    out: list[datetime] = []
    for t in sched.iter_from(start):
        if t > end:
            break
        out.append(t)
        if len(out) > limit:
            raise BackfillError(
                f"the window {schedule.format_instant(start)} .. "
                f"{schedule.format_instant(end)} has more than {limit} instants: "
                "narrow it (--from/--to), backfill it in parts, or raise --max"
            )
    return out


async def backfill(
    db: Database,
    *,
    namespace: str,
    name: str,
    start: datetime,
    end: datetime,
    max_instants: int = DEFAULT_MAX_INSTANTS,
    dry_run: bool = False,
    expect: int | None = None,
    retention_seconds: float | None = None,
) -> BackfillResult:
    """Backfill [start, end] (aware datetimes) of one live job; see the module docstring.
    With `expect`, refuse (BackfillCountChanged, nothing written) unless exactly that many
    instants would be created or reopened: what a dry run showed is what runs."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("backfill needs timezone-aware datetimes")
    if start > end:
        raise BackfillError(
            f"--from {schedule.format_instant(start)} is after --to "
            f"{schedule.format_instant(end)}: give the earlier instant first"
        )
    if max_instants < 1:
        raise BackfillError("--max must be at least 1")
    result = BackfillResult(namespace, name, start, end, dry_run=dry_run)
    async with db.transaction() as conn:
        job = await store_backfill.get_job(db, namespace=namespace, name=name, conn=conn)
        if job is None:
            raise JobNotFound(
                f"no ScheduledJob {namespace}/{name} in the store "
                "(check the name and -n NAMESPACE: `cronwell jobs` lists them)"
            )
        if job.suspended:
            raise BackfillError(
                f"{namespace}/{name} is suspended ({job.suspended_reason or 'spec.suspend'}): "
                "backfilled runs would start at once anyway; resume it first "
                "(`cronwell resume`), then backfill"
            )
        # The job's claims wait while the backfill writes (the row lock keeps the
        # materialiser and edits of the job out; claims take only this one).
        await claims.lock_jobs(db, [job.id], conn=conn)
        now = await clock.now(db, conn)
        if end > now:
            raise BackfillError(
                f"--to {schedule.format_instant(end)} is in the future (database clock: "
                f"{schedule.format_instant(now)}): backfill only covers past instants; "
                "run it now with `cronwell trigger`, or let the schedule run it"
            )
        spec = ScheduledJobSpec.model_validate(job.spec)
        sched = schedule.JobSchedule.from_spec(job.id, spec)
        result.instants = window_instants(sched, start, end, max_instants)
        if not result.instants:
            return result
        await _within_retention(db, result.instants, now, retention_seconds, dry_run=dry_run)
        keys = [schedule.occurrence_key(job.id, t) for t in result.instants]
        existing = await store_backfill.existing_states(db, keys=keys, conn=conn)
        if expect is not None:
            found = sum(1 for k in keys if existing.get(k, "missed") == "missed")
            if found != expect:
                raise BackfillCountChanged(expect, found)
        if dry_run:
            result.created = [k for k in keys if k not in existing]
            result.reopened = [k for k in keys if existing.get(k) == "missed"]
        else:
            run = store_backfill.RunSettings(
                job_id=job.id,
                pool=spec.pool,
                overlap=backfill_overlap(spec.concurrency_policy),
                delivery=spec.delivery,
                max_attempts=spec.retry.max_attempts,
                timeout_seconds=spec.timeout_seconds,
            )
            result.reopened = await store_backfill.reopen(db, run, keys=keys, conn=conn)
            missing = [(k, t) for k, t in zip(keys, result.instants, strict=True)
                       if k not in existing]  # fmt: skip
            if missing:
                result.created = await store_backfill.insert(
                    db,
                    run,
                    keys=[k for k, _ in missing],
                    scheduled_for=[t for _, t in missing],
                    conn=conn,
                )
            if result.reopened:
                await store_backfill.uncount_missed(
                    db, job_id=job.id, n=len(result.reopened), conn=conn
                )
            if result.created or result.reopened:
                await dispatch.notify_due(db, conn, [(spec.pool, now)])
        reopened = set(result.reopened)
        result.present = Counter(s for k, s in existing.items() if k not in reopened)
    return result


async def _within_retention(
    db: Database,
    instants: list[datetime],
    now: datetime,
    retention_seconds: float | None,
    *,
    dry_run: bool,
) -> None:
    """Refuse instants older than the store-wide retention (their partition is dropped, or
    would be at once); create the partitions the others need (an insert outside every
    partition fails). Runs its DDL on connections of its own."""
    if retention_seconds is None:
        from cronwell.settings import SchedulerSettings

        retention_seconds = SchedulerSettings().retention_seconds
    oldest = now - timedelta(seconds=retention_seconds)
    first, last = min(instants), max(instants)
    if first < oldest:
        raise BackfillError(
            f"the instant {schedule.format_instant(first)} is older than the retention "
            f"({retention_seconds:g}s; history before {schedule.format_instant(oldest)} is "
            "dropped by whole partitions): narrow the window (--from) to the retention, or "
            "raise CRONWELL_RETENTION_SECONDS"
        )
    if not dry_run:
        await history_partitions.ensure_partitions(db, first, last + timedelta(seconds=1))
