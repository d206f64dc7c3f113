"""Materialisation planning: which nominal instants of a job become occurrences, which are
recorded as missed, and where the job's cursor (`next_run_at`) moves. Pure logic, so the
misfire policies are tested without a database; the scheduler applies the plan in SQL."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cronwell.models import MisfirePolicy
from cronwell.schedule import JobSchedule

# Bound on instants examined per job per pass, so a job with a per-second schedule after a
# long outage is worked through in chunks instead of stalling a batch.
MAX_INSTANTS_PER_PASS = 10_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_PHASES = 1_000_003
"""Resolution of a job's phase (a prime, so ids' low bits do not line phases up)."""


def visit_reach(
    now: datetime, job_id: uuid.UUID, *, horizon: timedelta, visit: timedelta
) -> datetime:
    """How far a visit at `now` materialises a job: `now + horizon`, back to the job's own
    phase in cycles of (horizon - visit), so that it comes back exactly one cycle later
    whenever it was first visited, and a pool's jobs come back spread over the cycle.
    Without the phase, per-second jobs all reached the same cursor and were all visited
    again in one pass (5,000 of them: 75,000 rows every 15 s, the workers short of CPU
    meanwhile). Always after `now + visit`: a visited job (its next instant within
    `visit`) has that instant materialised."""
    end = now + horizon
    cycle = (horizon - visit) // _US
    if cycle <= 0:
        return end
    phase = job_id.int % _PHASES * cycle // _PHASES
    return end - _US * (((end - _EPOCH) // _US - phase) % cycle)


NEAR_REACH_SECONDS = 5.0
"""How far a visit materialises a job whose next instant is due within NEAR_LEAD_SECONDS
(the scheduler is behind on it: new jobs by the thousand, a takeover after an outage): its
next seconds first, the rest at its next visit (see `near_reach`)."""
NEAR_LEAD_SECONDS = 1.0
"""A job whose next instant is this close is visited near first (`near_reach`). Well under
NEAR_REACH_SECONDS: the revisit comes before the near reach runs out, or every visit
would be near (a pass over 10,000 jobs took longer than half of it, and each came back
every 5 s instead of every 15 s)."""


def near_reach(now: datetime, next_run_at: datetime | None, *, visit: timedelta) -> datetime | None:
    """How far a visit materialises a job whose next instant is within NEAR_LEAD_SECONDS:
    NEAR_REACH_SECONDS; its revisit, due at once but after the jobs whose next instant
    is earlier (the scheduler visits them earliest first), takes it to its phase
    (`visit_reach`). None for the others, and for every job when `visit` is no farther
    than that. Why: 10,000 new per-second jobs at a 30 s horizon were materialised a job
    at a time, 15 to 30 s of each, 220,000 rows before the last job's next second: most
    jobs' first seconds were late and the workers started 2-5 s behind. Near first, every
    job's next seconds come after a fraction of that."""
    near = timedelta(seconds=NEAR_REACH_SECONDS)
    if near >= visit or next_run_at is None:
        return None
    if next_run_at > now + timedelta(seconds=NEAR_LEAD_SECONDS):
        return None
    return now + near


@dataclass
class Plan:
    run: list[datetime] = field(default_factory=list)
    """Nominal instants to materialise as occurrences (including misfire catch-ups)."""
    catchup: set[datetime] = field(default_factory=set)
    """The subset of `run` that were late (dispatched under the misfire policy)."""
    missed: list[datetime] = field(default_factory=list)
    """Late instants not run: recorded as `missed`, never silently dropped."""
    next_run_at: datetime | None = None
    """The first instant not handled by this plan (None: the schedule has ended)."""


def plan_job(
    schedule: JobSchedule,
    next_run_at: datetime,
    *,
    now: datetime,
    horizon: timedelta,
    deadline: timedelta,
    policy: MisfirePolicy,
    max_catchup: int,
    limit: int = MAX_INSTANTS_PER_PASS,
    resumed_at: datetime | None = None,
) -> Plan:
    """Plan instants from `next_run_at` up to `now + horizon`.

    An instant older than `now - deadline` has misfired, and so has one that fell while the
    job was suspended (before `resumed_at`, as Kubernetes CronJob treats a suspension).
    RunOnce runs the latest misfired instant once, RunAll the latest `max_catchup` of them,
    Skip none; the rest are missed. `now` is the database's clock (invariant 6).
    """
    plan = Plan()
    late_before = now - deadline
    if resumed_at is not None and resumed_at > late_before:
        late_before = min(resumed_at, now)
    late: list[datetime] = []
    t: datetime | None = next_run_at
    examined = 0
    while t is not None and t <= now + horizon and examined < limit:
        (late if t < late_before else plan.run).append(t)
        examined += 1
        t = schedule.next_after(t)
    plan.next_run_at = t
    # Late instants are settled when this pass reached past the deadline line; otherwise
    # more late instants follow in the next pass and only the last pass runs catch-ups.
    reached_present = t is None or t >= late_before
    if policy == MisfirePolicy.SKIP or not reached_present:
        keep = 0
    elif policy == MisfirePolicy.RUN_ONCE:
        keep = 1
    else:
        keep = max_catchup
    keep = min(keep, len(late))
    catchups = late[len(late) - keep :]
    plan.missed = late[: len(late) - keep]
    plan.catchup = set(catchups)
    plan.run = catchups + plan.run
    return plan
