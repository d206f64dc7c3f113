"""The pre-scaler's pure parts: the scale-down hold, the HPA decision, whether a pre-scale
landed before its burst, acting a little early, and conditions (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwell.conditions import condition
from cronwell.forecast import PoolForecast, concurrency_timeline, plan_replicas, upcoming_burst
from cronwell.prescale import (
    HPA_ANNOTATION,
    Hold,
    HpaChange,
    PreScale,
    desired_replicas,
    hpa_change,
    hpa_original,
    hpa_targets,
    lookahead_max,
    plan_pool,
)
from cronwell.workerpool import PoolCondition, WorkerPoolSpec

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# ------------------------------------------------------------------------------- hold


def test_hold_keeps_the_largest_need_for_the_delay_then_lets_go() -> None:
    h = Hold()
    assert h.value(at(0), 10) == 0 and h.until(10) is None
    h.push(at(0), 1)
    h.push(at(1), 5)
    h.push(at(2), 1)
    assert h.value(at(2), 10) == 5
    assert h.until(10) == at(11)  # the 5 needed at t=1 is held until 11
    assert h.value(at(10.9), 10) == 5
    assert h.value(at(11.1), 10) == 1  # then the 1 needed at t=2
    assert h.until(10) == at(12)
    assert h.value(at(12.5), 10) == 0


def test_a_larger_later_need_replaces_older_smaller_ones() -> None:
    h = Hold()
    h.push(at(0), 3)
    h.push(at(5), 4)
    assert h.value(at(14), 10) == 4  # held from t=5, not t=0
    assert h.value(at(15.5), 10) == 0


def test_hold_remembers_only_the_buckets_before_the_cut() -> None:
    h = Hold()
    h.push_past(at(0), 5, [2, 7, 4, 9], at(10))  # buckets at 0, 5 | 10, 15: two are past
    assert h.value(at(10), 60) == 7 and h.until(60) == at(65)


def test_desired_is_the_plan_or_the_hold_within_the_pool_bounds() -> None:
    spec = WorkerPoolSpec.model_validate(
        {"scaleTargetRef": {"name": "w"}, "minReplicas": 2, "maxReplicas": 6}
    )
    assert desired_replicas(3, 5, spec) == 5
    assert desired_replicas(4, 0, spec) == 4
    assert desired_replicas(0, 1, spec) == 2
    assert desired_replicas(9, 3, spec) == 6


def test_hold_times_never_go_backwards() -> None:
    h = Hold()
    h.push(at(5), 2)
    h.push(at(3), 3)  # an older bucket pushed late counts from the latest time
    assert h.value(at(14), 10) == 3 and h.until(10) == at(15)


# -------------------------------------------------------------------------------- HPA


def hpa(min_: int | None = 1, max_: int = 10, original: str | None = None, **ref: str) -> Any:
    meta: dict[str, Any] = {"name": "h", "resourceVersion": "42"}
    if original is not None:
        meta["annotations"] = {HPA_ANNOTATION: original}
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "workers"} | ref
    spec: dict[str, Any] = {"scaleTargetRef": target, "maxReplicas": max_}
    if min_ is not None:
        spec["minReplicas"] = min_
    return {"metadata": meta, "spec": spec}


def test_which_hpa_targets_the_deployment() -> None:
    assert hpa_targets(hpa(), "workers")
    assert not hpa_targets(hpa(), "other")
    assert not hpa_targets(hpa(kind="StatefulSet"), "workers")
    assert not hpa_targets(hpa(apiVersion="example.com/v1"), "workers")


def test_raise_the_minimum_remembering_the_original() -> None:
    change = hpa_change(hpa(min_=2), 6)
    assert change == HpaChange(6, "2")
    assert change.patch("42") == {
        "metadata": {"annotations": {HPA_ANNOTATION: "2"}, "resourceVersion": "42"},
        "spec": {"minReplicas": 6},
    }


def test_already_raised_is_left_alone_and_follows_the_need() -> None:
    assert hpa_change(hpa(min_=6, original="2"), 6) is None
    assert hpa_change(hpa(min_=6, original="2"), 4) == HpaChange(4, "2")
    assert hpa_change(hpa(min_=4, original="2"), 8) == HpaChange(8, "2")


def test_restore_once_the_need_has_passed() -> None:
    change = hpa_change(hpa(min_=6, original="2"), 2)
    assert change == HpaChange(2, None)
    assert change.patch(None) == {
        "metadata": {"annotations": {HPA_ANNOTATION: None}},  # merge patch: removes it
        "spec": {"minReplicas": 2},
    }


def test_an_hpa_we_never_raised_is_its_owners() -> None:
    assert hpa_change(hpa(min_=3), 2) is None
    assert hpa_change(hpa(min_=3), 3) is None
    assert hpa_change(hpa(min_=None), 1) is None  # minReplicas defaults to 1


def test_never_above_the_hpas_maximum() -> None:
    assert hpa_change(hpa(min_=1, max_=5), 9) == HpaChange(5, "1")
    assert hpa_change(hpa(min_=5, max_=5, original="1"), 9) is None


def test_a_garbled_annotation_falls_back_to_the_shown_minimum() -> None:
    assert hpa_original(hpa(min_=3, original="lots")) == 3
    assert hpa_original(hpa(min_=3, original="2")) == 2


# ------------------------------------------------------------------ landed before burst
# Landed means Ready: the Deployment's status.readyReplicas at the planned replicas, not
# spec.replicas set.


def test_replicas_set_but_pods_not_ready_has_not_landed() -> None:
    pre = PreScale(at(0), 4, burst=at(60))
    assert pre.observe(0, at(1)) is None  # spec.replicas may be 4 already: no pod Ready
    assert pre.observe(3, at(2)) is None
    assert pre.landed_before_burst is None and pre.ready_at is None and pre.waiting
    assert pre.shown().ready_at is None and pre.shown().landed_before_burst is None


def test_a_pre_scale_whose_pods_are_ready_before_its_burst() -> None:
    pre = PreScale(at(0), 4, burst=at(60))
    assert pre.observe(1, at(1)) is None and pre.landed_before_burst is None
    assert pre.observe(4, at(2.5)) == 57.5
    assert pre.landed_before_burst is True and pre.ready_at == at(2.5) and not pre.waiting
    assert pre.observe(4, at(3)) is None  # measured once
    assert pre.ready_at == at(2.5)
    shown = pre.shown()
    assert (shown.replicas, shown.burst_time, shown.landed_before_burst) == (4, at(60), True)
    assert shown.ready_at == at(2.5)


def test_more_ready_than_planned_counts() -> None:
    pre = PreScale(at(0), 4, burst=at(60))
    assert pre.observe(6, at(5)) == 55.0 and pre.landed_before_burst is True


def test_unknown_readiness_decides_nothing_before_the_burst() -> None:
    pre = PreScale(at(0), 4, burst=at(10))
    assert pre.observe(None, at(5)) is None and pre.landed_before_burst is None
    pre.observe(None, at(11))
    assert pre.landed_before_burst is False  # the burst started and nothing was seen Ready


def test_pods_ready_late_is_false_and_a_negative_lead() -> None:
    pre = PreScale(at(0), 4, burst=at(10))
    pre.observe(2, at(9))
    assert pre.landed_before_burst is None
    pre.observe(2, at(11))
    assert pre.landed_before_burst is False and not pre.waiting  # the burst started without it
    assert pre.observe(5, at(13)) == -3.0
    assert pre.landed_before_burst is False and pre.ready_at == at(13)


def test_ready_at_the_burst_instant_is_in_time() -> None:
    pre = PreScale(at(0), 2, burst=at(10))
    assert pre.observe(2, at(10)) == 0.0 and pre.landed_before_burst is True


def test_ready_at_is_shown_to_the_millisecond() -> None:
    pre = PreScale(at(0.4), 2, burst=at(10))
    pre.observe(2, at(3.1234567))
    shown = pre.shown()
    assert shown.time == at(0) and shown.ready_at == at(3.123)


def test_pre_scale_restored_from_status() -> None:
    assert PreScale.from_status(None) is None
    assert PreScale.from_status({"time": "garbage"}) is None
    doc = {"time": "2026-03-01T12:00:00Z", "replicas": 3, "burstTime": "2026-03-01T12:01:00Z"}
    pending = PreScale.from_status(doc)
    assert pending is not None and pending.landed_before_burst is None and pending.waiting
    assert pending.observe(3, at(30)) == 30.0
    settled = PreScale.from_status(doc | {"landedBeforeBurst": False})
    assert settled is not None and settled.landed_before_burst is False
    assert settled.observe(3, at(30)) is None
    landed = PreScale.from_status(
        doc | {"landedBeforeBurst": True, "readyAt": "2026-03-01T12:00:40.250Z"}
    )
    assert landed is not None and landed.landed_before_burst is True
    assert landed.ready_at == at(40.25) and landed.shown().ready_at == at(40.25)
    assert landed.observe(0, at(70)) is None and landed.landed_before_burst is True
    # Written before readyAt existed: the verdict is kept, no Ready instant is made up.
    old = PreScale.from_status(doc | {"landedBeforeBurst": True})
    assert old is not None and old.landed_before_burst is True and old.shown().ready_at is None


# ------------------------------------------------------------------------- planning


def spec(**over: Any) -> WorkerPoolSpec:
    return WorkerPoolSpec.model_validate({"scaleTargetRef": {"name": "w"}} | over)


def burst_forecast(at_second: int, k: int, n: int = 60) -> PoolForecast:
    counts = [0] * n
    counts[at_second] = k
    pf = PoolForecast("p", T0, 1.0, counts)
    pf.arrivals[(at_second, 1.0)] = k
    return pf


def test_lookahead_acts_early_by_that_many_buckets() -> None:
    assert lookahead_max([1, 1, 1, 4, 4, 1, 1], 1) == [1, 1, 4, 4, 4, 1, 1]
    assert lookahead_max([1, 1, 1, 4], 0) == [1, 1, 1, 4]


def test_upcoming_burst_is_the_next_one_to_start() -> None:
    s = spec(minReplicas=1, maxReplicas=10, concurrencyPerReplica=2, startSLOSeconds=1,
             leadTimeSeconds=5, scaleDownDelaySeconds=0)  # fmt: skip
    pf = burst_forecast(20, 20)
    concurrency_timeline(pf, s.start_slo_seconds)
    plan = plan_replicas(pf, s, pf.start)
    burst = upcoming_burst(pf, plan, s)
    assert burst is not None and (burst.time, burst.size, burst.replicas) == (at(20), 20, 5)
    assert plan.series.index(5) == 15  # up leadTimeSeconds before


def test_a_tick_plans_replicas_now_when_they_change_and_the_burst() -> None:
    s = spec(minReplicas=1, maxReplicas=10, concurrencyPerReplica=2, startSLOSeconds=1,
             leadTimeSeconds=5, scaleDownDelaySeconds=0)  # fmt: skip
    pf = burst_forecast(20, 20)
    concurrency_timeline(pf, s.start_slo_seconds)
    quiet = plan_pool(pf, s, tick_seconds=0.0)
    assert (quiet.planned, quiet.scale_for) == (1, None)  # nothing above minReplicas yet
    assert quiet.change_at == at(14)  # one bucket early: up at 15, a tick acts by 14
    assert quiet.burst is not None and quiet.burst.time == at(20)
    slow = plan_pool(pf, s, tick_seconds=3.0)  # a slow tick acts 1 + 3 buckets early
    assert slow.change_at == at(11)
    soon = burst_forecast(3, 20)
    concurrency_timeline(soon, s.start_slo_seconds)
    busy = plan_pool(soon, s, tick_seconds=0.0)
    assert (busy.planned, busy.scale_for) == (5, at(3))  # within the lead time: up now


def test_a_burst_under_way_is_not_the_next_one() -> None:
    s = spec(concurrencyPerReplica=2, startSLOSeconds=1, leadTimeSeconds=0)
    pf = burst_forecast(0, 20)
    concurrency_timeline(pf, s.start_slo_seconds)
    plan = plan_replicas(pf, s, pf.start)
    assert plan.next_burst is not None and plan.next_burst.time == T0
    assert upcoming_burst(pf, plan, s) is None


# ------------------------------------------------------------------------ conditions


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    first = condition(
        PoolCondition, "TargetFound", "False", "TargetNotFound", "gone", 1, {}, at(0.7)
    )
    assert first.last_transition_time == at(0)
    prev = {"TargetFound": {"status": "False", "lastTransitionTime": "2026-03-01T12:00:00Z"}}
    again = condition(
        PoolCondition, "TargetFound", "False", "TargetNotFound", "gone", 2, prev, at(30)
    )
    assert again.last_transition_time == at(0) and again.observed_generation == 2
    flipped = condition(PoolCondition, "TargetFound", "True", "Found", "ok", 2, prev, at(30))
    assert flipped.last_transition_time == at(30)


@pytest.mark.parametrize("status", ["True", "False", "Unknown"])
def test_condition_statuses(status: str) -> None:
    assert condition(PoolCondition, "Ready", status, "R", "m", None, {}, T0).status == status
