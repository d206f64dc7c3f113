"""Schedule math: cron in a time zone with an explicit DST policy, `@every`, jitter,
occurrence keys. The one schedule engine: the scheduler, forecast, backfill, the webhook's
rate cap and `cronwell apply` all ask `JobSchedule`.

A cron is walked on *local wall-clock* time, field by field (month, day, hour, minute,
second), jumping to the next allowed value of each; every local match is mapped to UTC by
the DST policy, by its definition: a local time that does not exist (spring forward) runs
at the end of the gap (`RunAtGapEnd`, all such times of one gap merge into that instant)
or not at all (`Skip`); a local time that occurs twice (fall back) runs at its first
occurrence (`RunOnce`) or at both (`RunTwice`). Identity always uses the nominal instant;
jitter only moves when an occurrence becomes claimable (invariant 5).
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from cronwell import cronexpr
from cronwell.cronexpr import load_zone, uses_hash
from cronwell.models import FallBack, ScheduledJobSpec, SpringForward

# Largest UTC-offset change at a DST/zone transition we look around (real ones are <= 2h).
_MAX_SHIFT = timedelta(hours=3)
_SECOND = timedelta(seconds=1)
_TINY = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LOOKAHEAD_YEARS = 400
"""How far a walk looks for the next instant: the Gregorian calendar repeats every 400
years, so an expression with no day in that span has none ever."""


def occurrence_key(job_id: uuid.UUID | str, scheduled_for: datetime) -> str:
    """`<job uid>:<nominal instant, UTC ISO-8601>`: the same for every dispatch of it."""
    return f"{job_id}:{format_instant(scheduled_for)}"


def trigger_key(job_id: uuid.UUID | str, trigger_id: str) -> str:
    """Manual triggers are idempotent per trigger id (a `kubectl annotate` value, `--id`)."""
    return f"{job_id}:trigger:{trigger_id}"


def key_job(key: str) -> str:
    """The job uid an occurrence's key begins with (occurrence_key, trigger_key)."""
    return key.split(":", 1)[0]


def format_instant(t: datetime) -> str:
    return _format_utc(t.astimezone(UTC))


@functools.lru_cache(maxsize=4096)
def _format_utc(t: datetime) -> str:
    """Cached by the UTC instant (a batch's occurrences share a few): not by a local time,
    which compares and hashes alike at both passes of a fall-back."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


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


@functools.lru_cache(maxsize=4096)
def _month_shape(year: int, month: int) -> tuple[int, int]:
    """(days in the month, weekday of its 1st with 0 = Sunday)."""
    wd, length = calendar.monthrange(year, month)
    return length, (wd + 1) % 7


@functools.lru_cache(maxsize=4096)
def _transition(tz: ZoneInfo, hour: datetime) -> tuple[datetime, timedelta, timedelta] | None:
    """The UTC-offset change in (hour - 3h, hour + 4h]: (its instant, offset before,
    offset after), or None. Cached per zone and whole UTC hour."""
    lo = int((hour - _MAX_SHIFT).timestamp())
    hi = int((hour + _MAX_SHIFT + timedelta(hours=1)).timestamp())
    before = datetime.fromtimestamp(lo, tz).utcoffset()
    after = datetime.fromtimestamp(hi, tz).utcoffset()
    if before is None or after is None or before == after:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC), before, after


def _transition_near(tz: ZoneInfo, t: datetime) -> tuple[datetime, timedelta, timedelta]:
    tr = _transition(tz, t.astimezone(UTC).replace(minute=0, second=0, microsecond=0))
    assert tr is not None, "an offset change was seen near t"
    return tr


_ANSWERS: dict[tuple[CronSchedule, datetime], datetime | None] = {}
"""Recent answers of CronSchedule.next_after, by equal cron and UTC instant; emptied when
full (_ANSWERS_SIZE, a few MB), which only costs walks again."""
_ANSWERS_SIZE = 16_384


class Schedule(Protocol):
    def next_after(self, t: datetime) -> datetime | None: ...


@dataclass(frozen=True)
class CronSchedule:
    """A cron in a zone with its DST policy; `hash_id` seeds `H` fields (the job uid)."""

    expr: str
    tz: ZoneInfo
    spring_forward: SpringForward = SpringForward.RUN_AT_GAP_END
    fall_back: FallBack = FallBack.RUN_ONCE
    hash_id: str = ""
    _c: cronexpr.Cron = field(init=False, repr=False, compare=False)
    _tables: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.expr, self.tz, self.spring_forward, self.fall_back, self.hash_id)
        object.__setattr__(self, "_hash", hash(fields))
        c = cronexpr.parse(self.expr, self.hash_id)
        if not isinstance(c, cronexpr.Cron):
            raise ValueError(f"{self.expr!r} is not a cron expression (use EverySchedule)")
        object.__setattr__(self, "_c", c)
        object.__setattr__(
            self,
            "_tables",
            tuple(
                cronexpr._next_table(v, n)
                for v, n in ((c.months, 13), (c.hours, 24), (c.minutes, 60), (c.seconds, 60))
            ),
        )

    def _next_local(self, after: datetime) -> datetime | None:
        """The first matching wall-clock time strictly after naive `after`, jumping field by
        field; None if there is none within LOOKAHEAD_YEARS."""
        nmon, nhour, nmin, nsec = self._tables
        c = self._c
        y, mo, d, h, mi = after.year, after.month, after.day, after.hour, after.minute
        s = after.second + 1  # whole seconds strictly after `after`
        stop = y + LOOKAHEAD_YEARS
        while True:
            m2 = nmon[mo]
            if m2 < 0:
                y += 1
                if y > stop or y > 9999:
                    return None
                mo, d, h, mi, s = nmon[1], 1, 0, 0, 0
                continue
            if m2 != mo:
                mo, d, h, mi, s = m2, 1, 0, 0, 0
            d2 = c.day_table(*_month_shape(y, mo))[d] if d <= 32 else 0
            if d2 == 0:
                mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
                continue
            if d2 != d:
                d, h, mi, s = d2, 0, 0, 0
            h2 = nhour[h]
            if h2 < 0:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if h2 != h:
                h, mi, s = h2, 0, 0
            mi2 = nmin[mi]
            if mi2 < 0:
                h, mi, s = h + 1, 0, 0
                continue
            if mi2 != mi:
                mi, s = mi2, 0
            s2 = nsec[s]
            if s2 < 0:
                mi, s = mi + 1, 0
                continue
            return datetime(y, mo, d, h, mi, s2)

    def _first_from(self, t: datetime, after: datetime | None) -> datetime | None:
        """Walk local times strictly after naive `after` (None: none left); the first
        instant, under the policy, that is later than `t`. Instants of successive local
        times never decrease under RunOnce (a repeated time maps to its first pass, a gap
        time to the gap's end), so the first one later than `t` is the earliest."""
        tz = self.tz
        stop = after.year + LOOKAHEAD_YEARS if after is not None else 0
        while after is not None:
            local = self._next_local(after)
            if local is None or local.year > stop:  # e.g. every match skipped in a gap
                return None
            off0 = tz.utcoffset(local)
            off1 = tz.utcoffset(local.replace(fold=1))
            if off0 is None or off1 is None:
                raise ValueError(f"zone {tz} has no UTC offset")
            if off0 >= off1:  # exists once (==), or twice (>): its first pass
                inst = (local - off0).replace(tzinfo=UTC)
            else:  # in a spring-forward gap
                end, _, after_off = _transition_near(tz, (local - off1).replace(tzinfo=UTC))
                if self.spring_forward == SpringForward.SKIP:
                    after = (end + after_off).replace(tzinfo=None) - _TINY
                    continue
                inst = end
            if inst > t:
                return inst
            after = local
        return None

    def _second_pass(self, lo: datetime, hi: datetime, off: timedelta) -> datetime | None:
        """RunTwice: the first local time in (lo, hi) of a repeated range, at its second
        pass (offset `off`)."""
        local = self._next_local(lo)
        if local is None or local >= hi:
            return None
        return (local - off).replace(tzinfo=UTC)

    def next_after(self, t: datetime) -> datetime | None:
        """The first instant strictly after aware `t` (None: none within LOOKAHEAD_YEARS).
        Recent answers are kept (_ANSWERS): the jobs with one cron ask for the same
        instants (10,000 per-second jobs: one walk an instant, not one a job; 4 us each)."""
        t = t.astimezone(UTC)  # aware arithmetic below must be elapsed time, not wall time
        key = (self, t)  # the UTC instant: local times are alike at both passes of a fall-back
        found = _ANSWERS.get(key)
        if found is None and key not in _ANSWERS:
            if len(_ANSWERS) >= _ANSWERS_SIZE:
                _ANSWERS.clear()
            found = _ANSWERS[key] = self._walk(t)
        return found

    def __hash__(self) -> int:
        return self._hash

    def _walk(self, t: datetime) -> datetime | None:
        lt = t.astimezone(self.tz)
        wall = lt.replace(tzinfo=None)
        twice = self.fall_back == FallBack.RUN_TWICE
        if lt.fold:  # t is in the second pass of a fall-back: skip the rest of its range
            end, before, after = _transition_near(self.tz, t)
            repeat_end = (end + before).replace(tzinfo=None)
            if twice:
                second = self._second_pass(wall, repeat_end, after)
                if second is not None:
                    return second
            return self._first_from(t, max(wall, repeat_end - _TINY))
        first = self._first_from(t, wall)
        if twice and first is not None:
            off_t = lt.utcoffset()
            later = (t + _MAX_SHIFT).astimezone(self.tz).utcoffset()
            if off_t is not None and later is not None and later < off_t:
                # a fall-back within _MAX_SHIFT: second passes of times before `wall`
                end, before, after = _transition_near(self.tz, t + _MAX_SHIFT)
                start = max(
                    (t + after).replace(tzinfo=None), (end + after).replace(tzinfo=None) - _TINY
                )
                second = self._second_pass(start, (end + before).replace(tzinfo=None), after)
                if second is not None and t < second < first:
                    return second
        return first


@dataclass(frozen=True)
class EverySchedule:
    """`@every DURATION`: anchor + k * period for whole k; the anchor is the job's startAt,
    else the Unix epoch, so instants (and keys) do not depend on when the job was applied
    and never move with the zone or DST (a period is elapsed time)."""

    period: timedelta
    anchor: datetime = _EPOCH

    def next_after(self, t: datetime) -> datetime | None:
        return self.anchor + ((t - self.anchor) // self.period + 1) * self.period


@dataclass(frozen=True)
class JobSchedule:
    """Everything the scheduler needs to enumerate one job's nominal instants."""

    cron: Schedule | None
    """The recurring schedule (a cron or `@every`), or None for a one-shot."""
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None

    @classmethod
    def from_spec(cls, job_id: uuid.UUID | str, spec: ScheduledJobSpec) -> JobSchedule:
        cron: Schedule | None = None
        if spec.schedule is not None:
            parsed = cronexpr.parse(spec.schedule)
            if isinstance(parsed, cronexpr.Every):
                cron = EverySchedule(timedelta(seconds=parsed.seconds), spec.start_at or _EPOCH)
            else:
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

    def between(self, lo: datetime, hi: datetime) -> list[datetime]:
        """Instants in [lo, hi), in order."""
        out: list[datetime] = []
        for inst in self.iter_from(lo):
            if inst >= hi:
                break
            out.append(inst)
        return out
