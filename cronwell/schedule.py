"""Schedule math: cron in a time zone with an explicit DST policy, jitter, occurrence keys.

Cron is evaluated on *local wall-clock* time (croniter on naive datetimes), then each local
time is mapped to UTC by the DST policy. Identity always uses the nominal instant; jitter
only moves when an occurrence becomes claimable (invariant 5).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from cronwell.cronexpr import croniter_args, load_zone, uses_hash
from cronwell.models import FallBack, ScheduledJobSpec, SpringForward

# Largest UTC-offset change at a DST/zone transition we look around (real ones are <= 2h).
_MAX_SHIFT = timedelta(hours=3)


def occurrence_key(job_id: uuid.UUID | str, scheduled_for: datetime) -> str:
    """`<job uid>:<nominal instant, UTC ISO-8601>`: the same for every dispatch of it."""
    return f"{job_id}:{format_instant(scheduled_for)}"


def trigger_key(job_id: uuid.UUID | str, trigger_id: str) -> str:
    """Manual triggers are idempotent per trigger id (a `kubectl annotate` value, `--id`)."""
    return f"{job_id}:trigger:{trigger_id}"


def format_instant(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def partition_of(job_id: uuid.UUID | str, partitions: int) -> int:
    """Stable hash of the job uid (not Python's randomised hash())."""
    digest = hashlib.blake2b(str(job_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def jitter_offset(job_id: uuid.UUID | str, jitter_seconds: int) -> timedelta:
    """Deterministic per-job offset in [0, jitter_seconds), millisecond resolution."""
    if jitter_seconds <= 0:
        return timedelta(0)
    digest = hashlib.blake2b(f"jitter:{job_id}".encode(), digest_size=8).digest()
    return timedelta(milliseconds=int.from_bytes(digest, "big") % (jitter_seconds * 1000))


@functools.lru_cache(maxsize=65536)
def _next_local(expr: str, hash_id: str, after: datetime) -> datetime:
    """Next naive local time matching `expr` strictly after naive `after` (cached: a burst
    of jobs sharing a cron asks the same question thousands of times)."""
    it = croniter(expr, after, hash_id=hash_id.encode(), **croniter_args(expr))
    nxt: datetime = it.get_next(datetime)
    return nxt


def _transition_end(tz: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """First UTC instant in (lo, hi] whose offset differs from lo's: the end of a DST gap."""
    base = lo.astimezone(tz).utcoffset()
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == base:
            lo = mid
        else:
            hi = mid
    return hi.replace(microsecond=0)


@dataclass(frozen=True)
class CronSchedule:
    """A cron in a zone with its DST policy; `hash_id` seeds `H` fields (the job uid)."""

    expr: str
    tz: ZoneInfo
    spring_forward: SpringForward = SpringForward.RUN_AT_GAP_END
    fall_back: FallBack = FallBack.RUN_ONCE
    hash_id: str = ""

    def _to_utc(self, local: datetime) -> list[datetime]:
        """UTC instants for a naive local time under the DST policy (0, 1 or 2 of them)."""
        early = local.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        late = local.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        if early == late:
            return [early]
        exists = early.astimezone(self.tz).replace(tzinfo=None) == local
        if exists:  # ambiguous: the wall clock shows this time twice
            return [early] if self.fall_back == FallBack.RUN_ONCE else [early, late]
        # Nonexistent (in a gap). fold=0 uses the offset before the jump, so early > late.
        if self.spring_forward == SpringForward.SKIP:
            return []
        return [_transition_end(self.tz, min(early, late), max(early, late))]

    def next_after(self, t: datetime) -> datetime:
        """The first instant strictly after aware `t`. Local candidates are scanned from
        `_MAX_SHIFT` before `t` so folds that map out of naive order are not missed."""
        local_t = t.astimezone(self.tz).replace(tzinfo=None)
        # Fast path: no offset change around t and the candidate, so local order is UTC order.
        cand = _next_local(self.expr, self.hash_id, local_t)
        cand_utc = cand.replace(tzinfo=self.tz).astimezone(UTC)
        offset = t.astimezone(self.tz).utcoffset()
        if (
            cand_utc > t
            and (t - _MAX_SHIFT).astimezone(self.tz).utcoffset() == offset
            and (cand_utc + _MAX_SHIFT).astimezone(self.tz).utcoffset() == offset
        ):
            return cand_utc
        cursor = local_t - _MAX_SHIFT
        best: datetime | None = None
        while True:
            cursor = _next_local(self.expr, self.hash_id, cursor)
            if best is not None and cursor - _MAX_SHIFT > best.astimezone(self.tz).replace(
                tzinfo=None
            ):
                return best
            for inst in self._to_utc(cursor):
                if inst > t and (best is None or inst < best):
                    best = inst


@dataclass(frozen=True)
class JobSchedule:
    """Everything the scheduler needs to enumerate one job's nominal instants."""

    cron: CronSchedule | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None

    @classmethod
    def from_spec(cls, job_id: uuid.UUID | str, spec: ScheduledJobSpec) -> JobSchedule:
        cron = None
        if spec.schedule is not None:
            cron = CronSchedule(
                expr=spec.schedule,
                tz=load_zone(spec.time_zone),
                spring_forward=SpringForward(spec.dst_policy.spring_forward),
                fall_back=FallBack(spec.dst_policy.fall_back),
                hash_id=str(job_id) if uses_hash(spec.schedule) else "",
            )
        return cls(cron=cron, run_at=spec.run_at, start_at=spec.start_at, end_at=spec.end_at)

    def next_after(self, t: datetime) -> datetime | None:
        """First nominal instant strictly after `t` within startAt/endAt, or None."""
        if self.start_at is not None and t < self.start_at:
            t = self.start_at - timedelta(microseconds=1)
        if self.cron is not None:
            nxt: datetime | None = self.cron.next_after(t)
        else:
            nxt = self.run_at if self.run_at is not None and self.run_at > t else None
        if nxt is not None and self.end_at is not None and nxt > self.end_at:
            return None
        return nxt

    def first_at_or_after(self, t: datetime) -> datetime | None:
        return self.next_after(t - timedelta(microseconds=1))

    def iter_from(self, t: datetime) -> Iterator[datetime]:
        """Instants >= t in order."""
        nxt = self.first_at_or_after(t)
        while nxt is not None:
            yield nxt
            nxt = self.next_after(nxt)
