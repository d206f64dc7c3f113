"""Demand forecast per worker pool, the concurrency it needs, and the replicas to plan.

Pure logic (no I/O): `fleet_forecast.Forecaster.forecast` reads the store and calls it. The
operator's WorkerPool loop calls `Forecaster.forecast` then `plan_replicas` and scales the pool's
Deployment ahead of bursts.

The model, precisely:

- **Arrivals.** An occurrence arrives (becomes claimable) at its nominal instant plus the
  job's deterministic jitter (`schedule.jitter_offset`), as the scheduler sets `run_at`.
  Instants come from `JobSchedule` (cron in its zone with the DST policy, or `runAt`,
  bounded by `startAt`/`endAt`). Pending occurrences already due (the backlog) arrive at the
  forecast's start. Arrivals are counted per bucket of `resolution` seconds; for the
  concurrency computation an arrival is placed at the start of its bucket.
- **Durations.** Each job's p90 of its recent successful runs, or the pool's default for
  jobs without history; rounded up to 0.1 s so that equal work groups together.
- **Service.** C identical slots (replicas x concurrency per replica), FIFO: occurrences
  start in arrival order, each on the earliest free slot (the Kiefer-Wolfowitz recursion of
  the G/G/C queue). The start SLO is met when every occurrence starts within `slo` of its
  arrival. `required_concurrency` is the least such C (binary search; feasibility is
  monotone in C and in load).
- **Over time.** The concurrency needed at bucket t is the least C for the arrivals in
  [t - (slo + longest duration), t]: occurrences that arrived earlier have finished by t
  whenever the SLO is met (the window is capped at slo + MAX_WINDOW_SECONDS). Exact for
  bursts further apart than that window; when loads overlap it counts only the window's
  occurrences.
- **Replicas.** ceil(concurrency / concurrencyPerReplica) clamped to [min, max]; the plan at
  t is the largest need in [t - scaleDownDelay, t + leadTime]: up leadTime before a burst,
  held through it, down scaleDownDelay after.

Scale: jobs are grouped by their schedule fields (cron, zone, DST policy, runAt,
startAt/endAt; the job uid too when the cron uses `H`), so each distinct schedule is
enumerated once however many jobs share it.
"""

from __future__ import annotations

import heapq
import math
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import compress, repeat
from operator import eq
from typing import TYPE_CHECKING, Any

import pydantic

from cronwell.cronexpr import uses_hash
from cronwell.errors import SpecError
from cronwell.models import ScheduledJobSpec
from cronwell.schedule import JobSchedule, jitter_offset
from cronwell.workerpool import WorkerPoolSpec

if TYPE_CHECKING:
    from cronwell.metrics import Metrics

DEFAULT_SLO_SECONDS = 5.0
"""WorkerPool startSLOSeconds default."""
DEFAULT_DURATION_SECONDS = 1.0
"""WorkerPool defaultDurationSeconds default."""
DURATION_QUANTUM = 0.1
"""Durations are rounded up to a multiple of this (seconds) before grouping."""
HISTORY_RUNS = 20
"""Recent successful runs per job whose p90 duration is the job's estimate."""
MAX_WINDOW_SECONDS = 900.0
"""Longest duration the per-bucket window covers (bounds the work for hour-long jobs)."""
_EPS = 1e-6


@dataclass(frozen=True)
class ForecastJob:
    """One live job as the forecast sees it: the stored (camelCase) spec document."""

    id: str
    pool: str
    spec: Mapping[str, Any]
    duration: float | None = None
    """p90 of recent runs in seconds; None: the pool's default."""

    @classmethod
    def of(
        cls, job_id: uuid.UUID | str, spec: ScheduledJobSpec, duration: float | None = None
    ) -> ForecastJob:
        return cls(str(job_id), spec.pool, spec.model_dump(mode="json", by_alias=True), duration)


@dataclass
class PoolForecast:
    """One pool's demand over [start, start + len(counts) * resolution)."""

    pool: str
    start: datetime
    resolution: float
    counts: list[int]
    """Occurrences arriving in each bucket (scheduled, not the backlog)."""
    backlog: int = 0
    """Pending occurrences already due at `start`."""
    arrivals: Counter[tuple[int, float]] = field(default_factory=Counter)
    """(bucket, duration) -> occurrences; the backlog is in bucket 0."""
    concurrency: list[int] = field(default_factory=list)
    """Concurrency needed per bucket (filled by `concurrency_timeline`)."""

    def bucket_time(self, i: int) -> datetime:
        return self.start + timedelta(seconds=i * self.resolution)

    @property
    def horizon_seconds(self) -> float:
        return len(self.counts) * self.resolution

    def due(self) -> list[int]:
        """Occurrences due per bucket: the arrivals, and the backlog in bucket 0 (due now)."""
        due = list(self.counts)
        if due:
            due[0] += self.backlog
        return due


@dataclass(frozen=True, slots=True)
class Window:
    """A run of buckets summarised for a table: its start, the occurrences due in it, and
    the most concurrency and replicas any of its buckets needs."""

    time: datetime
    due: int
    concurrency: int
    replicas: int


def windows(pf: PoolForecast, replicas: Sequence[int], step: int) -> list[Window]:
    """`pf` and its planned `replicas` per `step` buckets (`cronwell forecast`'s table and
    the dashboard's per-minute one)."""
    due = pf.due()
    return [
        Window(
            pf.bucket_time(i),
            sum(due[i : i + step]),
            max(pf.concurrency[i : i + step]),
            max(replicas[i : i + step]),
        )
        for i in range(0, len(due), step)
    ]


def _quantise(d: float) -> float:
    if d <= 0:
        return 0.0
    return round(math.ceil(d / DURATION_QUANTUM - 1e-9) * DURATION_QUANTUM, 6)


def _schedule_key(job_id: str, s: Mapping[str, Any]) -> tuple[Any, ...]:
    cron = s.get("schedule")
    dst = s.get("dstPolicy") or {}
    return (
        cron,
        s.get("runAt"),
        s.get("timeZone", "UTC"),
        dst.get("springForward"),
        dst.get("fallBack"),
        s.get("startAt"),
        s.get("endAt"),
        job_id if cron is not None and uses_hash(cron) else None,
    )


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What the forecast derives from one job's spec (its schedule group and jitter): kept
    per (job, spec hash) by `DemandCache`, so a job's spec is read again only when it
    changes."""

    key: tuple[Any, ...]
    jitter_ms: int
    spec: Mapping[str, Any]

    @classmethod
    def of(cls, job_id: str, spec: Mapping[str, Any]) -> JobDemand:
        jit = int(spec.get("jitterSeconds") or 0)
        jms = jitter_offset(job_id, jit) // timedelta(milliseconds=1) if jit else 0
        return cls(_schedule_key(job_id, spec), jms, spec)


def _per_job(spec: Mapping[str, Any]) -> bool:
    """Whether a spec's demand depends on the job's id (jitter, or `H` in its cron)."""
    cron = spec.get("schedule")
    return bool(spec.get("jitterSeconds")) or (cron is not None and uses_hash(cron))


class DemandCache:
    """The incremental state of a forecast loop: the spec documents by hash (equal hashes
    are equal specs), the demand of each spec that does not depend on the job (most: one
    per hash), each id-dependent job's `JobDemand` (jitter, `H`) until its hash changes,
    each schedule group's parsed schedule, and the concurrency of windows already solved.
    Nothing is derived twice from the same spec; what is no longer seen is dropped."""

    def __init__(self) -> None:
        self.specs: dict[str, Mapping[str, Any]] = {}
        self.jobs: dict[str, tuple[str, JobDemand]] = {}
        """id-dependent jobs: id -> (spec hash, demand)."""
        self.classes: dict[str, int] = {}
        """spec hash -> its demand class (index in `demands`), -1 when it depends on the job."""
        self.demands: list[JobDemand] = []
        self._index: dict[tuple[Any, ...], int] = {}
        self.schedules: dict[tuple[Any, ...], JobSchedule] = {}
        self.memo: dict[tuple[Any, ...], int] = {}
        """`concurrency_timeline` windows solved (shifted to start at 0) -> concurrency."""
        self._known: list[tuple[str, Sequence[str], Sequence[str]]] | None = None
        """The last pools whose every spec was known (`unknown` had nothing to ask for)."""
        self._last: tuple[list[Any], dict[str, float | None], list[Any]] | None = None
        """The last `demand` call's (pools, durations, entries): equal pools and durations
        give equal entries, so a tick where no job changed skips counting 100k jobs."""

    def _class(self, jd: JobDemand) -> int:
        """The class of a job-independent demand: specs of one schedule share it."""
        c = self._index.get(jd.key)
        if c is None:
            c = self._index[jd.key] = len(self.demands)
            self.demands.append(jd)
        return c

    def unknown(self, pools: Iterable[tuple[str, Sequence[str], Sequence[str]]]) -> dict[str, str]:
        """Of each pool's (ids, spec hashes), the hashes whose spec is needed -> a job having it."""
        pools = list(pools)
        if pools == self._known:  # the same jobs and hashes as when all were known
            return {}
        out: dict[str, str] = {}
        for _, ids, hashes in pools:
            missing = set(hashes).difference(self.classes).difference(self.specs)
            if missing:
                for job_id, h in zip(ids, hashes, strict=True):
                    if h in missing:
                        out.setdefault(h, job_id)
        self._known = None if out else pools
        return out

    def demand(
        self,
        pools: Iterable[tuple[str, Sequence[str], Sequence[str]]],
        durations: Mapping[str, float | None],
        start: datetime,
        horizon_seconds: float,
        resolution: float = 1,
        *,
        backlog: Mapping[str, int] | None = None,
        default_duration: float | Mapping[str, float] = DEFAULT_DURATION_SECONDS,
    ) -> dict[str, PoolForecast]:
        """`demand` of each pool's jobs, given as (pool, ids, spec hashes) with each job's
        p90 in `durations` (absent: the pool's default); a job whose spec is not in `specs`
        is left out. Jobs of equal (spec hash, duration) are counted together (in C)."""
        pools = list(pools)
        last = self._last
        if last is not None and last[0] == pools and last[1] == durations:
            entries = last[2]  # no job, spec or p90 changed since: the same entries
        else:
            entries = self._entries(pools, durations)
            self._last = (pools, dict(durations), entries)
        out, keys = _demand(
            entries, start, horizon_seconds, resolution, backlog, default_duration, self.schedules
        )
        self.schedules = {k: v for k, v in self.schedules.items() if k in keys}
        if len(self.memo) > 100_000:
            self.memo.clear()
        return out

    def _entries(
        self,
        pools: Iterable[tuple[str, Sequence[str], Sequence[str]]],
        durations: Mapping[str, float | None],
    ) -> list[tuple[str, float | None, JobDemand, int]]:
        """`demand`'s (pool, duration, JobDemand, jobs) entries, classifying new hashes
        and dropping what is no longer seen."""
        old, jobs = self.jobs, {}
        used: set[str] = set()
        entries: list[tuple[str, float | None, JobDemand, int]] = []
        classes = self.classes
        for pool, ids, hashes in pools:
            new = set(hashes)
            used |= new
            new.difference_update(classes)
            for h in new:
                spec = self.specs.get(h)
                if spec is not None:
                    if _per_job(spec):
                        classes[h] = -1
                    else:  # its class is all it takes: the document is not kept
                        classes[h] = self._class(JobDemand.of("", spec))
                        del self.specs[h]
            # jobs of the same demand class and p90, counted in C
            counted = Counter(zip(map(classes.get, hashes), map(durations.get, ids), strict=True))
            for (c, dur), k in counted.items():
                if c is not None and c >= 0:
                    entries.append((pool, dur, self.demands[c], k))
            if any(c == -1 for c, _ in counted):
                flags = map(eq, repeat(-1), map(classes.get, hashes))  # in C
                per_job = compress(zip(ids, hashes, strict=True), flags)
                for job_id, h in per_job:
                    c0 = old.get(job_id)
                    if c0 is None or c0[0] != h:
                        c0 = (h, JobDemand.of(job_id, self.specs[h]))
                    jobs[job_id] = c0
                    entries.append((pool, durations.get(job_id), c0[1], 1))
        self.jobs = jobs
        self.specs = {h: s for h, s in self.specs.items() if h in used}  # id-dependent only
        if len(self.classes) > len(used):
            self.classes = {h: c for h, c in self.classes.items() if h in used}
        return entries


@dataclass
class _Group:
    rep: JobDemand
    members: Counter[tuple[str, float, int]] = field(default_factory=Counter)
    """(pool, duration, jitter in ms) -> jobs."""
    max_jitter_ms: int = 0


def _default_for(pool: str, default: float | Mapping[str, float]) -> float:
    if isinstance(default, Mapping):
        return float(default.get(pool, DEFAULT_DURATION_SECONDS))
    return float(default)


def demand(
    jobs: Iterable[ForecastJob],
    start: datetime,
    horizon_seconds: float,
    resolution: float = 1,
    *,
    backlog: Mapping[str, int] | None = None,
    default_duration: float | Mapping[str, float] = DEFAULT_DURATION_SECONDS,
) -> dict[str, PoolForecast]:
    """Per pool, the occurrences arriving in each `resolution`-second bucket of
    [start, start + horizon) (nominal instant + jitter), plus the backlog already due."""
    entries = [(j.pool, j.duration, JobDemand.of(j.id, j.spec), 1) for j in jobs]
    return _demand(entries, start, horizon_seconds, resolution, backlog, default_duration, {})[0]


def _demand(
    entries: Iterable[tuple[str, float | None, JobDemand, int]],
    start: datetime,
    horizon_seconds: float,
    resolution: float,
    backlog: Mapping[str, int] | None,
    default_duration: float | Mapping[str, float],
    schedules: dict[tuple[Any, ...], JobSchedule],
) -> tuple[dict[str, PoolForecast], set[tuple[Any, ...]]]:
    """`demand` of (pool, duration, JobDemand, jobs) entries; `schedules` caches each group's
    parsed schedule (None: a spec this version refuses). Also returns the group keys seen."""
    if resolution <= 0 or horizon_seconds <= 0:
        raise ValueError("resolution and horizon must be positive")
    start = start.astimezone(UTC)
    n = math.ceil(horizon_seconds / resolution - 1e-9)
    horizon = n * resolution
    end = start + timedelta(seconds=horizon)
    # the resolution in whole milliseconds (0: not whole)
    rms = round(resolution * 1000) if float(resolution * 1000).is_integer() else 0
    out: dict[str, PoolForecast] = {}

    def pool_forecast(pool: str) -> PoolForecast:
        pf = out.get(pool)
        if pf is None:
            pf = out[pool] = PoolForecast(pool, start, resolution, [0] * n)
        return pf

    groups: dict[tuple[Any, ...], _Group] = {}
    quantised: dict[tuple[str, float | None], float] = {}
    for pool, dur, jd, k in entries:
        g = groups.get(jd.key)
        if g is None:
            g = groups[jd.key] = _Group(jd)
        q = quantised.get((pool, dur))
        if q is None:
            d = dur if dur is not None else _default_for(pool, default_duration)
            q = quantised[(pool, dur)] = _quantise(d)
        g.members[(pool, q, jd.jitter_ms)] += k
        if jd.jitter_ms > g.max_jitter_ms:
            g.max_jitter_ms = jd.jitter_ms

    for key, g in groups.items():
        sched = schedules.get(key)
        if sched is None:
            try:
                rep_id = key[-1] or ""
                sched = JobSchedule.from_spec(rep_id, ScheduledJobSpec.model_validate(g.rep.spec))
            except (pydantic.ValidationError, SpecError):
                continue  # a stored spec this version refuses: the scheduler parks its jobs
            schedules[key] = sched
        offsets = [
            (inst - start).total_seconds()
            for inst in sched.between(start - timedelta(milliseconds=g.max_jitter_ms), end)
        ]
        if not offsets:
            continue
        whole = [round(o / resolution) for o in offsets]
        if rms and all(w * resolution == o for w, o in zip(whole, offsets, strict=True)):
            # Offsets on bucket edges: an arrival's bucket is the offset's plus the job's
            # whole buckets of jitter, so jobs are counted by those (exact, integer math).
            by_shift: Counter[tuple[str, float, int]] = Counter()
            for (pool, dur, jms), cnt in g.members.items():
                by_shift[(pool, dur, jms // rms)] += cnt
            for (pool, dur, shift), cnt in by_shift.items():
                pf = pool_forecast(pool)
                counts, arrivals = pf.counts, pf.arrivals
                for w in whole:
                    b = w + shift
                    if 0 <= b < n:
                        counts[b] += cnt
                        arrivals[(b, dur)] += cnt
            continue
        for (pool, dur, jms), cnt in g.members.items():
            pf = pool_forecast(pool)
            counts, arrivals = pf.counts, pf.arrivals
            j = jms / 1000.0
            for off in offsets:
                t = off + j
                if 0 <= t < horizon:
                    b = min(int(t // resolution), n - 1)
                    counts[b] += cnt
                    arrivals[(b, dur)] += cnt

    for pool, k in (backlog or {}).items():
        if k > 0:
            pf = pool_forecast(pool)
            pf.backlog += k
            pf.arrivals[(0, _quantise(_default_for(pool, default_duration)))] += k
    return out, set(groups)


# ------------------------------------------------------------------------ concurrency


def _meets_slo(groups: Sequence[tuple[float, float, int]], c: int, slo: float) -> bool:
    """FIFO with `c` slots: does every occurrence start within `slo` of its arrival?
    `groups` are (arrival, duration, count) sorted by arrival. Slots are a heap of
    (free at, how many), so a burst of identical occurrences costs one step per wave."""
    free: list[tuple[float, int]] = [(-math.inf, c)]
    for a, d, k in groups:
        idle = 0
        while free and free[0][0] <= a:
            idle += heapq.heappop(free)[1]
        if idle:
            heapq.heappush(free, (a, idle))
        while k > 0:
            f, m = heapq.heappop(free)
            if f - a > slo + _EPS:
                return False
            if d <= 0:  # instant work: the slot is free again at once
                heapq.heappush(free, (f, m))
                break
            use = min(m, k)
            heapq.heappush(free, (f + d, use))
            if m > use:
                heapq.heappush(free, (f, m - use))
            k -= use
    return True


def _required(
    groups: Sequence[tuple[float, float, int]], slo: float, hint: int | None = None
) -> int:
    total = sum(k for _, _, k in groups)
    if total == 0:
        return 0
    # Lower bound: k identical arrivals at once fit in floor(slo/d)+1 waves of C.
    lo = max(math.ceil(k / (math.floor(slo / d + _EPS) + 1)) if d > 0 else 1 for _, d, k in groups)
    hi = total  # every occurrence on its own slot starts on arrival
    lo = min(lo, hi)
    if hint is not None and lo < hint < hi:
        # Gallop from the previous answer (neighbouring windows need similar concurrency).
        if _meets_slo(groups, hint, slo):
            hi, step = hint, 1
            while hi - step > lo and _meets_slo(groups, hi - step, slo):
                hi, step = hi - step, step * 2
            lo = max(lo, hi - step + 1) if hi - step > lo else lo
        else:
            lo, step = hint + 1, 1
            while lo + step < hi and not _meets_slo(groups, lo + step, slo):
                lo, step = lo + step + 1, step * 2
            hi = min(hi, lo + step) if lo + step < hi else hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _meets_slo(groups, mid, slo):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _grouped(
    arrivals: Sequence[float], durations: Sequence[float] | float, counts: Sequence[int] | None
) -> list[tuple[float, float, int]]:
    if isinstance(durations, int | float):
        durs: Sequence[float] = [float(durations)] * len(arrivals)
    else:
        durs = durations
    if len(durs) != len(arrivals) or (counts is not None and len(counts) != len(arrivals)):
        raise ValueError("arrivals, durations and counts must have the same length")
    g: Counter[tuple[float, float]] = Counter()
    for i, (a, d) in enumerate(zip(arrivals, durs, strict=True)):
        g[(float(a), max(0.0, float(d)))] += 1 if counts is None else counts[i]
    return sorted((a, d, k) for (a, d), k in g.items() if k > 0)


def required_concurrency(
    arrivals: Sequence[float],
    durations: Sequence[float] | float,
    slo_seconds: float,
    counts: Sequence[int] | None = None,
) -> int:
    """The least concurrency C such that, with C slots and FIFO start order, every
    occurrence starts within `slo_seconds` of its arrival. `arrivals` in seconds (any
    order), `durations` per arrival (or one for all), `counts` occurrences per arrival
    (default 1 each). 0 when there is nothing to run."""
    if slo_seconds < 0:
        raise ValueError("slo_seconds must be >= 0")
    return _required(_grouped(arrivals, durations, counts), slo_seconds)


def meets_slo(
    arrivals: Sequence[float],
    durations: Sequence[float] | float,
    slo_seconds: float,
    concurrency: int,
    counts: Sequence[int] | None = None,
) -> bool:
    """Whether `concurrency` FIFO slots start every occurrence within the SLO."""
    if concurrency <= 0:
        return not any(k for _, _, k in _grouped(arrivals, durations, counts))
    return _meets_slo(_grouped(arrivals, durations, counts), concurrency, slo_seconds)


def concurrency_timeline(
    pf: PoolForecast, slo_seconds: float, memo: dict[tuple[Any, ...], int] | None = None
) -> list[int]:
    """Concurrency needed in each bucket of `pf` (see the module docstring); also stored
    in `pf.concurrency`. `memo` keeps the windows solved, shifted to start at bucket 0 (the
    answer does not depend on where a window starts): the next forecast, a second later,
    solves only the windows that changed."""
    n = len(pf.counts)
    res = pf.resolution
    by_bucket: dict[int, list[tuple[float, float, int]]] = {}
    longest = 0.0
    for (b, d), k in pf.arrivals.items():
        by_bucket.setdefault(b, []).append((b * res, d, k))
        longest = max(longest, d)
    for xs in by_bucket.values():
        xs.sort()
    window = math.ceil((slo_seconds + min(longest, MAX_WINDOW_SECONDS)) / res - 1e-9)
    conc = [0] * n
    present: deque[int] = deque()
    last = 0
    for i in range(n):
        changed = False
        if i in by_bucket:
            present.append(i)
            changed = True
        while present and present[0] < i - window:
            present.popleft()
            changed = True
        if not present:
            last = 0
            continue
        if changed:
            groups = sorted(x for b in present for x in by_bucket[b])
            if memo is None:
                last = _required(groups, slo_seconds, hint=last or None)
            else:
                first = present[0]
                key = (
                    slo_seconds,
                    res,
                    *((b - first, d, k) for b in present for _, d, k in by_bucket[b]),
                )
                got = memo.get(key)
                if got is None:
                    got = memo[key] = _required(groups, slo_seconds, hint=last or None)
                last = got
        conc[i] = last
    pf.concurrency = conc
    return conc


# --------------------------------------------------------------------------- replicas


@dataclass(frozen=True)
class Burst:
    time: datetime
    """Start of the first bucket that needs more than minReplicas."""
    size: int
    """Occurrences arriving in that run of buckets (plus the backlog if it starts now)."""
    replicas: int
    """The most replicas it needs."""


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: int
    """Replicas wanted now."""
    next_burst: Burst | None
    series: list[int]
    """Planned replicas per bucket of the forecast."""
    need: list[int]
    """Replicas the concurrency alone needs per bucket (no lead time or delay)."""


def replicas_for(concurrency: int, spec: WorkerPoolSpec) -> int:
    return min(
        spec.max_replicas,
        max(spec.min_replicas, math.ceil(concurrency / spec.concurrency_per_replica)),
    )


def _window_max(values: Sequence[int], back: int, ahead: int) -> list[int]:
    """out[i] = max(values[i - back .. i + ahead]) (clipped), with a monotonic deque."""
    n = len(values)
    out = [0] * n
    dq: deque[int] = deque()
    nxt = 0
    for i in range(n):
        while nxt < n and nxt <= i + ahead:
            while dq and values[dq[-1]] <= values[nxt]:
                dq.pop()
            dq.append(nxt)
            nxt += 1
        while dq[0] < i - back:
            dq.popleft()
        out[i] = values[dq[0]]
    return out


def plan_replicas(timeline: PoolForecast, spec: WorkerPoolSpec, now: datetime) -> ReplicaPlan:
    """Replicas over time for a pool whose `concurrency_timeline` is computed: up
    `leadTimeSeconds` before a burst, held through it, down `scaleDownDelaySeconds` after;
    always within [minReplicas, maxReplicas]."""
    n = len(timeline.counts)
    if n and len(timeline.concurrency) != n:
        raise ValueError("compute concurrency_timeline(timeline, slo) first")
    res = timeline.resolution
    # per distinct concurrency, not per bucket: 3,600 buckets hold a few dozen values
    by_conc = {c: replicas_for(c, spec) for c in set(timeline.concurrency)}
    need = list(map(by_conc.__getitem__, timeline.concurrency))
    if not n:
        return ReplicaPlan(spec.min_replicas, None, [], [])
    ahead = math.ceil(spec.lead_time_seconds / res - 1e-9)
    back = math.ceil(spec.scale_down_delay_seconds / res - 1e-9)
    series = _window_max(need, back, ahead)
    idx = min(n - 1, max(0, math.floor((now - timeline.start).total_seconds() / res)))
    burst = None
    j = next((k for k in range(idx, n) if need[k] > spec.min_replicas), None)
    if j is not None:
        e = j
        while e < n and need[e] > spec.min_replicas:
            e += 1
        size = sum(timeline.counts[j:e]) + (timeline.backlog if j == 0 else 0)
        burst = Burst(timeline.bucket_time(j), size, max(need[j:e]))
    return ReplicaPlan(series[idx], burst, series, need)


def upcoming_burst(timeline: PoolForecast, plan: ReplicaPlan, spec: WorkerPoolSpec) -> Burst | None:
    """The first burst that starts after the forecast's first bucket: `plan.next_burst`
    unless that one is already under way (its start would then move with every forecast,
    since the past is not in the timeline)."""
    need, lo = plan.need, spec.min_replicas
    for j in range(1, len(need)):
        if need[j] > lo and need[j - 1] <= lo:
            e = j
            while e < len(need) and need[e] > lo:
                e += 1
            return Burst(timeline.bucket_time(j), sum(timeline.counts[j:e]), max(need[j:e]))
    return None


def export_metrics(metrics: Metrics, pf: PoolForecast, plan: ReplicaPlan) -> None:
    """Set the forecast gauges of one pool."""
    metrics.forecast_demand.labels(pf.pool).set(sum(pf.counts) + pf.backlog)
    metrics.planned_replicas.labels(pf.pool).set(plan.replicas)
