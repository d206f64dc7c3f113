"""Misfire planning: RunOnce, RunAll, Skip, hours of downtime, bounds, one-shots."""

from __future__ import annotations

import math
import random
import uuid
from datetime import UTC, datetime, timedelta

from cronwell.cronexpr import load_zone
from cronwell.models import MisfirePolicy
from cronwell.plan import NEAR_LEAD_SECONDS, NEAR_REACH_SECONDS, near_reach, plan_job, visit_reach
from cronwell.schedule import CronSchedule, JobSchedule


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


def every_minute(
    start_at: datetime | None = None, end_at: datetime | None = None, expr: str = "* * * * *"
) -> JobSchedule:
    return JobSchedule(CronSchedule(expr, load_zone("UTC")), None, start_at, end_at)


NOW = utc(2026, 6, 1, 12, 0, 10)
H30 = timedelta(seconds=30)
D60 = timedelta(seconds=60)


def plan(policy: MisfirePolicy, next_run_at: datetime, **kw: object) -> object:
    sched = kw.pop("schedule", every_minute())
    return plan_job(
        sched,
        next_run_at,
        now=NOW,
        horizon=H30,
        deadline=D60,  # type: ignore
        policy=policy,
        max_catchup=kw.pop("max_catchup", 100),
        **kw,
    )  # type: ignore


def test_on_time_materialises_within_horizon() -> None:
    p = plan(MisfirePolicy.RUN_ONCE, utc(2026, 6, 1, 12, 0))
    assert p.run == [utc(2026, 6, 1, 12, 0)] and not p.missed and not p.catchup
    assert p.next_run_at == utc(2026, 6, 1, 12, 1)


def test_three_hours_down_run_once() -> None:
    p = plan(MisfirePolicy.RUN_ONCE, utc(2026, 6, 1, 9, 0))
    # 9:00 .. 11:59 are older than now-60s (11:59:10): 180 late, the latest runs once
    assert len(p.missed) == 179
    assert p.catchup == {utc(2026, 6, 1, 11, 59)}
    assert p.run == [utc(2026, 6, 1, 11, 59), utc(2026, 6, 1, 12, 0)]
    assert p.missed[0] == utc(2026, 6, 1, 9, 0) and p.missed[-1] == utc(2026, 6, 1, 11, 58)


def test_three_hours_down_run_all_bounded_by_max_catchup() -> None:
    p = plan(MisfirePolicy.RUN_ALL, utc(2026, 6, 1, 9, 0), max_catchup=10)
    assert len(p.catchup) == 10 and len(p.missed) == 170
    assert max(p.missed) < min(p.catchup)  # the most recent ones run


def test_three_hours_down_skip() -> None:
    p = plan(MisfirePolicy.SKIP, utc(2026, 6, 1, 9, 0))
    assert len(p.missed) == 180 and not p.catchup
    assert p.run == [utc(2026, 6, 1, 12, 0)]


def test_every_instant_accounted_for() -> None:
    """run + missed covers every nominal instant from the cursor to the horizon, once."""
    for policy in MisfirePolicy:
        p = plan(policy, utc(2026, 6, 1, 9, 0))
        got = sorted(p.run + p.missed)
        assert got == [utc(2026, 6, 1, 9, 0) + timedelta(minutes=i) for i in range(181)]


def test_long_outage_is_worked_through_in_chunks() -> None:
    sched = every_minute(expr="* * * * * *")  # every second, 3 hours down
    cursor, missed, runs, passes = utc(2026, 6, 1, 9, 0, 10), 0, [], 0
    while True:
        passes += 1
        p = plan_job(
            sched,
            cursor,
            now=NOW,
            horizon=H30,
            deadline=D60,
            policy=MisfirePolicy.RUN_ONCE,
            max_catchup=1,
            limit=2000,
        )
        missed += len(p.missed)
        runs += [t for t in p.run if t in p.catchup]
        assert p.next_run_at is not None
        cursor = p.next_run_at
        if cursor > NOW:
            break
    assert passes > 5
    assert runs == [NOW - D60 - timedelta(seconds=1)]  # one catch-up, the latest late one
    late = (NOW - D60 - utc(2026, 6, 1, 9, 0, 10)).total_seconds()
    assert missed == late - 1


def test_end_at_stops_the_schedule() -> None:
    p = plan(
        MisfirePolicy.RUN_ONCE,
        utc(2026, 6, 1, 12, 0),
        schedule=every_minute(end_at=utc(2026, 6, 1, 12, 0, 5)),
    )
    assert p.run == [utc(2026, 6, 1, 12, 0)] and p.next_run_at is None


def test_start_at_delays_the_first_instant() -> None:
    s = every_minute(start_at=utc(2026, 6, 1, 13, 0))
    assert s.first_at_or_after(NOW) == utc(2026, 6, 1, 13, 0)


def test_one_shot_in_the_past_runs_once_as_catch_up() -> None:
    one = JobSchedule(None, utc(2026, 6, 1, 11, 0), None, None)
    p = plan(MisfirePolicy.RUN_ONCE, utc(2026, 6, 1, 11, 0), schedule=one)
    assert p.run == [utc(2026, 6, 1, 11, 0)] and p.catchup and p.next_run_at is None
    p = plan(MisfirePolicy.SKIP, utc(2026, 6, 1, 11, 0), schedule=one)
    assert p.missed == [utc(2026, 6, 1, 11, 0)] and not p.run


# -- how far a visit reaches (plan.visit_reach) ---------------------------------------------

VISIT = timedelta(seconds=15)


def test_a_visit_reaches_past_the_visit_line_and_never_past_the_horizon() -> None:
    for i in range(2000):
        job = uuid.UUID(int=random.Random(i).getrandbits(128))
        now = NOW + timedelta(microseconds=random.Random(-i).randrange(10**8))
        reach = visit_reach(now, job, horizon=H30, visit=VISIT)
        assert now + VISIT < reach <= now + H30


def test_a_per_second_job_comes_back_once_a_cycle_and_jobs_come_back_spread_over_it() -> None:
    """Each job is visited again one cycle (horizon - visit) after its last reach, whenever
    its first visit was; 3,000 per-second jobs first visited in one pass come back spread
    over the 15 one-second ticks of the cycle, not all in one."""
    rng = random.Random(7)
    jobs = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(3000)]
    per_tick: dict[int, int] = {}
    for job in jobs:
        reach = visit_reach(NOW, job, horizon=H30, visit=VISIT)
        cursor = reach.replace(microsecond=0) + timedelta(seconds=1)  # the next whole second
        # the first tick at which the cursor is within the visit line
        back = math.ceil((cursor - VISIT - NOW).total_seconds())
        per_tick[back] = per_tick.get(back, 0) + 1
        tick = NOW + timedelta(seconds=back)
        again = visit_reach(tick, job, horizon=H30, visit=VISIT)
        assert again - reach == H30 - VISIT
    assert set(per_tick) <= set(range(1, 17))
    assert max(per_tick.values()) < 3 * 3000 / 15


def test_a_job_whose_next_instant_is_within_the_lead_is_visited_near_first() -> None:
    """Within NEAR_LEAD_SECONDS of its next instant (a new job, a scheduler behind on it),
    a visit reaches NEAR_REACH_SECONDS; farther, or with no next instant, or when the
    visit line is no farther than that anyway, the job's phase (visit_reach)."""
    lead = timedelta(seconds=NEAR_LEAD_SECONDS)
    near = NOW + timedelta(seconds=NEAR_REACH_SECONDS)
    for next_run_at in (NOW - timedelta(hours=3), NOW, NOW + lead):
        assert near_reach(NOW, next_run_at, visit=VISIT) == near
    assert near_reach(NOW, NOW + lead + timedelta(microseconds=1), visit=VISIT) is None
    assert near_reach(NOW, None, visit=VISIT) is None
    short = timedelta(seconds=NEAR_REACH_SECONDS)  # horizon 10 s: visit 5 s
    assert near_reach(NOW, NOW, visit=short) is None
