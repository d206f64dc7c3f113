"""The forecast math: demand vs brute-force enumeration, required concurrency vs an
independent simulation, and the replica plan's bounds and timing."""

from __future__ import annotations

import heapq
import math
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cronwell.forecast import (
    DemandCache,
    ForecastJob,
    PoolForecast,
    _required,
    concurrency_timeline,
    demand,
    export_metrics,
    meets_slo,
    plan_replicas,
    required_concurrency,
)
from cronwell.metrics import Metrics
from cronwell.models import ScheduledJobSpec
from cronwell.schedule import JobSchedule, jitter_offset
from cronwell.workerpool import WorkerPool, WorkerPoolSpec


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)  # type: ignore[arg-type,misc]


def spec(**kw: Any) -> ScheduledJobSpec:
    kw.setdefault("target", {"log": {}})
    return ScheduledJobSpec.model_validate(kw)


# --------------------------------------------------------------------------- demand


def brute_counts(
    jobs: list[tuple[str, ScheduledJobSpec]], start: datetime, horizon: int
) -> dict[str, Counter[int]]:
    """Each job on its own: JobSchedule.iter_from, plus its jitter, bucketed by second."""
    out: dict[str, Counter[int]] = {}
    end = start + timedelta(seconds=horizon)
    for jid, s in jobs:
        sched = JobSchedule.from_spec(jid, s)
        jit = jitter_offset(jid, s.jitter_seconds)
        for inst in sched.iter_from(start - timedelta(seconds=s.jitter_seconds)):
            if inst >= end:
                break
            t = inst + jit
            if start <= t < end:
                out.setdefault(s.pool, Counter())[int((t - start).total_seconds())] += 1
    return out


JOBS = [
    spec(schedule="*/7 * * * *"),
    spec(schedule="*/7 * * * *", jitterSeconds=90),
    spec(schedule="*/7 * * * *", jitterSeconds=90, pool="reports"),
    spec(schedule="30 2 * * *", timeZone="Europe/Paris"),  # in the spring gap
    spec(schedule="30 2 * * *", timeZone="Europe/Paris", dstPolicy={"fallBack": "RunTwice"}),
    spec(schedule="*/20 * * * * *", jitterSeconds=3),
    spec(schedule="H/10 * * * *", timeZone="America/New_York"),
    spec(schedule="H/10 * * * *", timeZone="America/New_York"),
    spec(schedule="0 * * * *", timeZone="Asia/Kolkata", startAt="2026-03-29T01:10:00Z"),
    spec(schedule="* * * * *", endAt="2026-10-25T00:40:00Z"),
    spec(runAt="2026-03-29T01:30:00Z"),
    spec(runAt="2026-10-25T01:30:00Z", jitterSeconds=60, pool="reports"),
]


@pytest.mark.parametrize(
    "start",
    [utc(2026, 3, 28, 23, 55), utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 0, 30)],
    ids=["spring-forward", "fall-back", "fall-back-inside"],
)
def test_demand_matches_brute_force_with_jitter_and_dst(start: datetime) -> None:
    jobs = [(str(uuid.uuid4()), s) for s in JOBS]
    horizon = 3 * 3600
    got = demand([ForecastJob.of(j, s) for j, s in jobs], start, horizon)
    want = brute_counts(jobs, start, horizon)
    assert want, "the fixture should produce occurrences"
    assert set(got) == set(want)
    for pool, pf in got.items():
        assert len(pf.counts) == horizon
        assert {i: c for i, c in enumerate(pf.counts) if c} == dict(want[pool]), pool
        assert sum(pf.arrivals.values()) == sum(pf.counts)


def test_demand_groups_jobs_sharing_a_schedule() -> None:
    s = spec(schedule="0 * * * *")
    jobs = [ForecastJob.of(uuid.uuid4(), s, duration=2.0) for _ in range(5000)]
    got = demand(jobs, utc(2026, 1, 1, 0, 30), 3600, resolution=10)
    pf = got["default"]
    assert len(pf.counts) == 360 and pf.counts[180] == 5000 and sum(pf.counts) == 5000
    assert pf.arrivals == Counter({(180, 2.0): 5000})


def test_backlog_arrives_at_the_start_with_the_default_duration() -> None:
    got = demand([], utc(2026, 1, 1), 60, backlog={"p": 7}, default_duration={"p": 0.25})
    assert got["p"].backlog == 7 and sum(got["p"].counts) == 0
    assert got["p"].arrivals == Counter({(0, 0.3): 7})  # rounded up to 0.1 s


# ---------------------------------------------------------------------- concurrency


def simulate(arrivals: list[float], durations: list[float], c: int, slo: float) -> bool:
    """Independent check: one item at a time, FIFO by arrival, earliest free slot."""
    slots = [0.0] * c
    heapq.heapify(slots)
    for a, d in sorted(zip(arrivals, durations, strict=True)):
        start = max(a, heapq.heappop(slots))
        if start - a > slo + 1e-6:
            return False
        heapq.heappush(slots, start + d)
    return True


loads = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from([0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 7.0])),
    min_size=1,
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(load=loads, slo=st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]))
def test_required_concurrency_is_minimal_and_meets_the_slo(
    load: list[tuple[int, float]], slo: float
) -> None:
    arr = [float(a) for a, _ in load]
    dur = [d for _, d in load]
    c = required_concurrency(arr, dur, slo)
    assert c >= 1
    assert simulate(arr, dur, c, slo)
    assert meets_slo(arr, dur, slo, c)
    if c > 1:
        assert not simulate(arr, dur, c - 1, slo)


@settings(max_examples=150, deadline=None)
@given(load=loads, slo=st.sampled_from([0.0, 1.0, 5.0]), hint=st.integers(1, 100))
def test_a_hint_never_changes_the_answer(
    load: list[tuple[int, float]], slo: float, hint: int
) -> None:
    groups = sorted((float(a), d, 3) for a, d in load)
    assert _required(groups, slo, hint=hint) == _required(groups, slo)


@settings(max_examples=100, deadline=None)
@given(load=loads, extra=loads, slo=st.sampled_from([0.0, 1.0, 5.0]))
def test_required_concurrency_is_monotone_in_load(
    load: list[tuple[int, float]], extra: list[tuple[int, float]], slo: float
) -> None:
    def rc(items: list[tuple[int, float]]) -> int:
        return required_concurrency([float(a) for a, _ in items], [d for _, d in items], slo)

    assert rc(load + extra) >= rc(load)
    # ... and in duration
    longer = [(a, d * 2) for a, d in load]
    assert rc(longer) >= rc(load)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 5000),
    d=st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0]),
    slo=st.sampled_from([0.0, 1.0, 5.0, 30.0]),
    others=loads,
)
def test_required_concurrency_never_below_the_burst_bound(
    n: int, d: float, slo: float, others: list[tuple[int, float]]
) -> None:
    arr = [10.0, *(float(a) for a, _ in others)]
    dur = [d, *(x for _, x in others)]
    counts = [n, *([1] * len(others))]
    c = required_concurrency(arr, dur, slo, counts)
    assert c >= math.ceil(n / (math.floor(slo / d) + 1))


def test_burst_alone_needs_exactly_the_bound() -> None:
    assert required_concurrency([0.0], [1.0], 5.0, [1000]) == math.ceil(1000 / 6)
    assert required_concurrency([0.0], 1.0, 5.0, [50_000]) == 8334
    assert required_concurrency([], 1.0, 5.0) == 0
    assert required_concurrency([0.0, 0.0], 0.0, 0.0) == 1  # instant work


def test_concurrency_timeline_separates_bursts_from_steady_load() -> None:
    pf = PoolForecast("p", utc(2026, 1, 1), 1.0, [0] * 120)
    for i in range(120):  # 2/s lasting 1 s
        pf.counts[i] += 2
        pf.arrivals[(i, 1.0)] += 2
    pf.counts[60] += 600  # a burst at t=60
    pf.arrivals[(60, 1.0)] += 600
    conc = concurrency_timeline(pf, 5.0)
    assert conc[10] == 2  # 2/s of 1 s work: two slots, one would fall ever further behind
    assert conc[60] >= 100 and conc[60] == max(conc)
    assert conc[59] < 10 and conc[75] < 10  # only the window around the burst is high


# ------------------------------------------------------------------------- replicas


def pool_spec(**kw: Any) -> WorkerPoolSpec:
    return WorkerPoolSpec.model_validate({"scaleTargetRef": {"name": "w"}, **kw})


@settings(max_examples=100, deadline=None)
@given(
    conc=st.lists(st.integers(0, 5000), min_size=1, max_size=400),
    lo=st.integers(0, 5),
    span=st.integers(0, 20),
    lead=st.integers(0, 120),
    down=st.integers(0, 200),
)
def test_plan_respects_bounds_lead_time_and_delay(
    conc: list[int], lo: int, span: int, lead: int, down: int
) -> None:
    s = pool_spec(
        minReplicas=lo,
        maxReplicas=max(1, lo + span),
        concurrencyPerReplica=64,
        leadTimeSeconds=lead,
        scaleDownDelaySeconds=down,
    )
    pf = PoolForecast("p", utc(2026, 1, 1), 1.0, [0] * len(conc), concurrency=list(conc))
    plan = plan_replicas(pf, s, pf.start)
    assert all(lo <= r <= max(1, lo + span) for r in plan.series)
    for i, c in enumerate(conc):
        need = min(max(1, lo + span), max(lo, math.ceil(c / 64)))
        # ready leadTime before the need, held scaleDownDelay after it
        for j in range(max(0, i - lead), min(len(conc), i + down + 1)):
            assert plan.series[j] >= need
    assert plan.replicas == plan.series[0]


def test_plan_scales_up_lead_time_before_the_burst_and_reports_it() -> None:
    start = utc(2026, 1, 1)
    pf = PoolForecast("p", start, 1.0, [0] * 600)
    pf.counts[300] = 50_000
    pf.arrivals[(300, 1.0)] = 50_000
    concurrency_timeline(pf, 5.0)
    s = pool_spec(minReplicas=2, maxReplicas=200, leadTimeSeconds=60, scaleDownDelaySeconds=120)
    plan = plan_replicas(pf, s, start)
    want = math.ceil(8334 / 64)
    assert plan.replicas == 2
    assert plan.series[239] == 2 and plan.series[240] == want  # 60 s ahead
    assert plan.series[300 + 5 + 120] == want  # held through it and the delay
    assert plan.series[599] == 2
    assert plan.next_burst is not None
    assert plan.next_burst.time == start + timedelta(seconds=300)
    assert plan.next_burst.size == 50_000 and plan.next_burst.replicas == want
    # later, inside the lead time: the plan wants the burst's replicas now
    assert plan_replicas(pf, s, start + timedelta(seconds=250)).replicas == want


def test_export_metrics() -> None:
    m = Metrics(CollectorRegistry())
    pf = PoolForecast("p", utc(2026, 1, 1), 1.0, [3, 4], backlog=2, concurrency=[1, 1])
    export_metrics(m, pf, plan_replicas(pf, pool_spec(minReplicas=3), pf.start))
    assert m.registry.get_sample_value("cronwell_forecast_demand", {"pool": "p"}) == 9
    assert m.registry.get_sample_value("cronwell_planned_replicas", {"pool": "p"}) == 3


# ----------------------------------------------------------------------- WorkerPool


def test_workerpool_defaults_and_validation() -> None:
    wp = WorkerPool.model_validate(
        {
            "apiVersion": "cronwell.dev/v1alpha1",
            "kind": "WorkerPool",
            "metadata": {"name": "reports"},
            "spec": {"scaleTargetRef": {"name": "cw-worker-reports"}, "maxReplicas": 20},
        }
    )
    assert wp.pool == "reports"
    s = wp.spec
    assert (s.scale_target_ref.api_version, s.scale_target_ref.kind) == ("apps/v1", "Deployment")
    assert (s.min_replicas, s.max_replicas, s.concurrency_per_replica) == (1, 20, 64)
    assert (s.lead_time_seconds, s.scale_down_delay_seconds, s.start_slo_seconds) == (60, 120, 5)
    assert s.default_duration_seconds == 1.0
    assert s.model_dump(by_alias=True)["startSLOSeconds"] == 5.0
    assert pool_spec(startSLOSeconds=2).start_slo_seconds == 2
    with pytest.raises(
        ValueError, match=r"must be >= spec.minReplicas \(maxReplicas 2 < minReplicas 3\)"
    ):
        pool_spec(minReplicas=3, maxReplicas=2)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        pool_spec(replicas=3)


def test_png_without_matplotlib_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from cronwell.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = CliRunner().invoke(
        main,
        [
            "--database-url",
            "postgresql://x@127.0.0.1:1/x",
            "forecast",
            "--png",
            str(tmp_path / "f.png"),
        ],
    )
    assert r.exit_code == 1
    assert "pip install matplotlib" in r.output


def test_a_stored_spec_this_version_refuses_is_left_out_not_fatal() -> None:
    """The scaler's forecast reads stored specs; one that no longer validates (an older
    version's `R` cron) must not stop the forecast of the others."""
    good = ForecastJob.of(uuid.uuid4(), spec(schedule="* * * * *"))
    bad = ForecastJob(str(uuid.uuid4()), "default", {**good.spec, "schedule": "R * * * *"})
    got = demand([good, bad], utc(2026, 1, 1), 600)
    assert sum(got["default"].counts) == 10


def test_demand_cache_between_calls_sees_every_change() -> None:
    """DemandCache reuses its counted jobs while pools and p90s equal the previous call's:
    a job added, re-specced or removed, or a p90 changed in place (the Forecaster updates
    its dict in place), shows in the next call as in a cache of its own."""
    docs = {
        h: spec(schedule=c, **kw).model_dump(mode="json", by_alias=True)
        for h, c, kw in (
            ("m", "* * * * *", {}),
            ("f", "*/5 * * * *", {}),
            ("j", "* * * * *", {"jitterSeconds": 30}),
        )
    }
    ids = [str(uuid.uuid4()) for _ in range(4)]
    start = utc(2026, 1, 1, 0, 0, 10)

    def run(cache: DemandCache, pools: list[Any], durations: dict[str, float | None]) -> Any:
        for h in cache.unknown(pools):
            cache.specs[h] = docs[h]
        out = cache.demand(pools, durations, start, 900)
        for pf in out.values():
            concurrency_timeline(pf, 5.0, cache.memo)
        return {p: (pf.counts, pf.arrivals, pf.concurrency) for p, pf in out.items()}

    cache = DemandCache()
    durations: dict[str, float | None] = {ids[0]: 4.0}
    pools: list[Any] = [("a", ids[:2], ["m", "j"])]
    first = run(cache, pools, durations)
    assert run(cache, [("a", list(ids[:2]), ["m", "j"])], durations) == first
    steps: list[tuple[list[Any], dict[str, float | None]]] = [
        ([("a", ids[:3], ["m", "j", "m"])], durations),  # added
        ([("a", ids[:3], ["m", "j", "f"])], durations),  # spec changed
        ([("a", ids[:3], ["m", "j", "f"]), ("b", ids[3:], ["j"])], durations),  # new pool
        ([("a", ids[1:3], ["j", "f"]), ("b", ids[3:], ["j"])], durations),  # removed
    ]
    for pools, durs in steps:
        got = run(cache, pools, durs)
        assert got == run(DemandCache(), pools, dict(durs))
        assert got != first
        first = got
    durations[ids[1]] = 40.0  # a p90 changed in the same dict
    assert run(cache, pools, durations) == run(DemandCache(), pools, dict(durations)) != first
