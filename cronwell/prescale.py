"""The pre-scaler's pure planning, next to cronwell.forecast (which says how many replicas
each bucket needs): what the operator's scale loop (cronwell_operator/scaler.py) decides
before it calls the API server. No I/O here.

- `plan_pool`: one tick's plan from the pool's forecast (replicas now, when the plan next
  changes, the next burst);
- `Hold`: what was needed lately, so a pool scales down only scaleDownDelaySeconds after
  its need is gone (each forecast starts now, so past buckets slip out of it into the hold);
- `lookahead_max`: act a few buckets early, so a tick that takes a moment still lands
  before the planned instant;
- `hpa_targets`, `hpa_change`, `hpa_original`, `HpaChange`: when an autoscaling/v2 HPA
  owns the Deployment, raise its minReplicas instead of fighting it (remembering the
  original in HPA_ANNOTATION), and give it back once the need has passed;
- `PreScale`: one scale-up ahead of a burst until its pods are Ready, and whether they
  landed before the burst (lastPreScale.landedBeforeBurst).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic

from cronwell.forecast import Burst, PoolForecast, ReplicaPlan, plan_replicas, upcoming_burst
from cronwell.workerpool import LastPreScale, WorkerPoolSpec

HPA_ANNOTATION = "cronwell.dev/original-min-replicas"
"""Where a raised HPA remembers its own minReplicas (restored when the need has passed)."""


class Hold:
    """Replicas needed in the recent past, so that a pool scales down only once the need
    has been gone for scaleDownDelaySeconds: each forecast starts now, so its buckets slip
    out of it into this memory. A sliding-window maximum over (time, replicas)."""

    def __init__(self) -> None:
        self._q: deque[tuple[datetime, int]] = deque()

    def push(self, t: datetime, replicas: int) -> None:
        if self._q and t < self._q[-1][0]:
            t = self._q[-1][0]  # times only increase
        while self._q and self._q[-1][1] <= replicas:
            self._q.pop()
        self._q.append((t, replicas))

    def value(self, now: datetime, delay: float) -> int:
        """The most replicas needed in [now - delay, now] (0: none remembered)."""
        cutoff = now - timedelta(seconds=delay)
        while self._q and self._q[0][0] < cutoff:
            self._q.popleft()
        return self._q[0][1] if self._q else 0

    def until(self, delay: float) -> datetime | None:
        """When the value held now stops being held (None: nothing is)."""
        return self._q[0][0] + timedelta(seconds=delay) if self._q else None

    def push_past(
        self, start: datetime, resolution: float, need: Sequence[int], cut: datetime
    ) -> None:
        """Remember a previous forecast's needs (bucket i at start + i * resolution) in its
        buckets before `cut`: the next forecast starts at `cut`, so they are out of it."""
        for i, n in enumerate(need):
            t = start + timedelta(seconds=i * resolution)
            if t >= cut:
                break
            self.push(t, n)


def desired_replicas(planned: int, held: int, spec: WorkerPoolSpec) -> int:
    """Replicas to ask for: the plan, or what the hold still keeps, within the pool's
    [minReplicas, maxReplicas]."""
    return min(spec.max_replicas, max(spec.min_replicas, planned, held))


def hpa_targets(hpa: Mapping[str, Any], deployment: str) -> bool:
    """Whether an autoscaling/v2 HPA scales this Deployment."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    group = str(ref.get("apiVersion") or "apps/v1").split("/")[0]
    return ref.get("kind") == "Deployment" and ref.get("name") == deployment and group == "apps"


@dataclass(frozen=True)
class HpaChange:
    min_replicas: int
    original: str | None
    """Value of HPA_ANNOTATION to write (None: remove it)."""

    def patch(self, resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"annotations": {HPA_ANNOTATION: self.original}}
        if resource_version:
            meta["resourceVersion"] = resource_version  # conditional: 409 if it changed
        return {"metadata": meta, "spec": {"minReplicas": self.min_replicas}}


def hpa_original(hpa: Mapping[str, Any]) -> int:
    """The HPA's own minReplicas: what the annotation remembers, else what it shows."""
    remembered = ((hpa.get("metadata") or {}).get("annotations") or {}).get(HPA_ANNOTATION)
    if remembered is not None and str(remembered).isdigit():
        return int(remembered)
    return int((hpa.get("spec") or {}).get("minReplicas") or 1)


def hpa_change(hpa: Mapping[str, Any], desired: int) -> HpaChange | None:
    """What to patch on an HPA so that it keeps at least `desired` replicas (never above its
    maxReplicas), or gets its original minReplicas back once `desired` no longer exceeds it;
    None when it already is so."""
    spec = hpa.get("spec") or {}
    shown = int(spec.get("minReplicas") or 1)
    remembered = ((hpa.get("metadata") or {}).get("annotations") or {}).get(HPA_ANNOTATION)
    original = hpa_original(hpa)
    want = min(desired, int(spec.get("maxReplicas") or desired))
    if want > original:
        if shown == want and remembered == str(original):
            return None
        return HpaChange(want, str(original))
    if remembered is None:
        return None  # never raised by us: the HPA is its owner's
    return HpaChange(original, None)


@dataclass
class PreScale:
    """One scale-up ahead of a burst, until its pods are Ready: the Deployment's
    status.readyReplicas reaches the planned replicas (pods started and passing their
    readiness probes; replicas merely set would say nothing of image pulls or warm-up)."""

    time: datetime
    replicas: int
    burst: datetime | None
    ready_at: datetime | None = None
    late: bool = False
    """Known not to have been Ready before its burst (also when it never is)."""
    verdict: bool | None = None
    """landedBeforeBurst as a previous leader reported it: not measured again."""

    @property
    def settled(self) -> bool:
        return self.verdict is not None

    @property
    def waiting(self) -> bool:
        """Still to be seen Ready, and its burst not started yet (worth looking often)."""
        return self.ready_at is None and not self.settled and not self.late

    def observe(self, ready: int | None, now: datetime) -> float | None:
        """Record the Deployment's Ready pods now (None: unknown); the lead achieved (burst
        - Ready, seconds, negative when late) the first time the planned replicas are Ready."""
        if self.ready_at is not None or self.settled:
            return None
        if ready is not None and ready >= self.replicas:
            self.ready_at = now
            if self.burst is None:
                return None
            return (self.burst - now).total_seconds()
        if self.burst is not None and now > self.burst:
            self.late = True
        return None

    @property
    def landed_before_burst(self) -> bool | None:
        if self.verdict is not None:
            return self.verdict
        if self.ready_at is not None:
            return self.burst is None or self.ready_at <= self.burst
        return False if self.late else None

    def shown(self) -> LastPreScale:
        return LastPreScale(
            time=_second(self.time),
            replicas=self.replicas,
            burst_time=self.burst,
            ready_at=_milli(self.ready_at) if self.ready_at is not None else None,
            landed_before_burst=self.landed_before_burst,
        )

    @classmethod
    def from_status(cls, doc: Mapping[str, Any] | None) -> PreScale | None:
        """The last pre-scale a previous leader reported (settled unless still unknown)."""
        if not doc:
            return None
        try:
            shown = LastPreScale.model_validate(doc)
        except pydantic.ValidationError:
            return None
        return cls(
            shown.time,
            shown.replicas,
            shown.burst_time,
            ready_at=shown.ready_at,
            verdict=shown.landed_before_burst,
        )


@dataclass(frozen=True)
class PoolPlan:
    """What one tick of the scale loop plans for a pool from its forecast."""

    plan: ReplicaPlan
    planned: int
    """Replicas now: the most the plan needs before the next tick can act."""
    change_at: datetime | None
    """When that number next changes (the loop wakes then); None: not in the horizon."""
    burst: Burst | None
    """The next burst the plan scales up for."""
    scale_for: datetime | None
    """The instant a scale-up above minReplicas is for (the burst, else the forecast's
    start); None when nothing above minReplicas is planned."""


def plan_pool(pf: PoolForecast, spec: WorkerPoolSpec, tick_seconds: float) -> PoolPlan:
    """The plan of a tick that takes `tick_seconds`: it acts that many buckets early."""
    plan = plan_replicas(pf, spec, pf.start)
    series = lookahead_max(plan.series, 1 + math.ceil(tick_seconds / pf.resolution))
    nxt = next((i for i in range(1, len(series)) if series[i] != series[0]), None)
    burst = upcoming_burst(pf, plan, spec)
    planned = series[0]
    scale_for = (
        (burst.time if burst is not None else pf.start) if planned > spec.min_replicas else None
    )
    return PoolPlan(
        plan=plan,
        planned=planned,
        change_at=pf.bucket_time(nxt) if nxt is not None else None,
        burst=burst,
        scale_for=scale_for,
    )


def lookahead_max(series: Sequence[int], ahead: int) -> list[int]:
    """out[i] = max(series[i .. i + ahead]): act up to `ahead` buckets early, so a tick that
    takes a moment still lands before the planned instant."""
    return [max(series[i : i + ahead + 1]) for i in range(len(series))]


def _second(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(microsecond=0)


def _milli(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)
