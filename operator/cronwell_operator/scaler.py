"""Pre-scaling: one loop in the leader scales each WorkerPool's Deployment ahead of the bursts
forecast from the schedules (cronwell.forecast), instead of reacting once they are late.

Each tick: list the WorkerPools of the served namespaces, forecast every pool at once from the
store (`fleet_forecast.Forecaster`, the database's clock), plan each pool's replicas
(`prescale.plan_pool`: up leadTimeSeconds before a burst, within [minReplicas, maxReplicas]),
then for each pool:

- read its Deployment's scale subresource and patch `spec.replicas` there when it differs
  (never the Deployment object itself, so GitOps tools can ignore just /spec/replicas);
- or, when an autoscaling/v2 HPA targets the same Deployment, raise the HPA's minReplicas
  instead of fighting it, remembering the original in the annotation
  `cronwell.dev/original-min-replicas`, and restore it when the need has passed;
- hold what was needed for scaleDownDelaySeconds after it (a forecast starts now, so the
  buckets slipping into the past are remembered here);
- until the planned pods are Ready (the Deployment's status.readyReplicas), look every
  READY_POLL_SECONDS and record when they were (lastPreScale.readyAt, landedBeforeBurst);
- write status (desired/current replicas, next burst, the last pre-scale and whether its
  pods were Ready before its burst, conditions Ready and TargetFound) only when it changes, and a
  Warning Event when the target goes missing (once per transition);
- record each pre-scale, and what became known of it, in the store's history
  (cronwell_prescales: status keeps only the latest, the dashboard's forecast shows them).

The decisions without I/O (hold, lookahead, HPA arithmetic, landed-before-burst) are in
cronwell.prescale; this module reads and writes the cluster.

The loop sleeps until the next planned change (at most `scale_interval_seconds`), so a
scale-up lands leadTimeSeconds before its burst however long the interval is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pydantic

from cronwell.conditions import condition
from cronwell.errors import EXPECTED_ERRORS, DatabaseError
from cronwell.fleet_forecast import Forecaster
from cronwell.forecast import PoolForecast, export_metrics
from cronwell.loader import format_validation_error
from cronwell.metrics import Metrics
from cronwell.prescale import (
    HPA_ANNOTATION,
    Hold,
    HpaChange,
    PreScale,
    desired_replicas,
    hpa_change,
    hpa_original,
    hpa_targets,
    plan_pool,
)
from cronwell.schedule import format_instant
from cronwell.store import clock, prescales
from cronwell.store.db import Database
from cronwell.supervise import repeat
from cronwell.workerpool import LastPreScale, NextBurst, PoolCondition, WorkerPoolSpec
from cronwell.workerpool import WorkerPoolStatus as _Status
from cronwell_operator.kube import CRef, Kube, KubeError, KubeNotFound
from cronwell_operator.settings import OperatorSettings
from cronwell_operator.status_build import same_status

_EXPECTED: tuple[type[Exception], ...] = (*EXPECTED_ERRORS, KubeError)
"""What a pre-scale tick retries with backoff: the database or the API server unavailable,
or the API server refusing a request (RBAC, a conflicting change)."""

log = logging.getLogger(__name__)

WAKE_MARGIN_SECONDS = 0.05
"""Wake this long after a planned change, so the next forecast's first bucket is past it."""
READY_POLL_SECONDS = 1.0
"""While a pre-scale's pods are not Ready yet, look this often (so readyAt is this exact)."""


# --------------------------------------------------------------------------------- loop


@dataclass
class _PoolState:
    """What the leader remembers of one WorkerPool between ticks (by uid)."""

    hold: Hold = field(default_factory=Hold)
    last: tuple[datetime, float, list[int]] | None = None
    """The previous forecast's start, resolution and replicas needed per bucket."""
    pre: PreScale | None = None
    acted: int | None = None
    """Replicas last asked of the target (scale or HPA minimum)."""
    seeded: bool = False
    recorded: LastPreScale | None = None
    """The pre-scale as last written to the store's history (written again only once it changed)."""


@dataclass
class _Outcome:
    """One pool's result of a tick, turned into status."""

    desired: int | None = None
    current: int | None = None
    burst: NextBurst | None = None
    found: tuple[str, str, str] = ("Unknown", "NotChecked", "the target was not read yet")
    ready: tuple[str, str, str] = ("Unknown", "NotChecked", "not reconciled yet")
    wake: datetime | None = None


@dataclass
class ScalerStats:
    ticks: int = 0
    scale_patches: int = 0
    hpa_patches: int = 0
    status_patches: int = 0
    events: int = 0
    errors: int = 0


class Scaler:
    """The pre-scaling loop (leader only; started by runner.Operator next to the status
    writer)."""

    def __init__(
        self, db: Database, kube: Kube, settings: OperatorSettings, metrics: Metrics
    ) -> None:
        self.db = db
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.stats = ScalerStats()
        self._state: dict[str, _PoolState] = {}
        self._raised: set[tuple[str, str]] = set()  # (namespace, HPA) we raised
        self._labels: set[str] = set()
        self._sem = asyncio.Semaphore(max(1, settings.status.concurrency))
        self._tick_seconds = 0.0
        self._crd_missing = False
        self._ready_unknown: set[str] = set()  # pools whose Deployment could not be read
        self._forecaster = Forecaster()  # per-job demand kept between ticks

    async def run(self) -> None:
        """Tick forever. The database or the API server down, or the API server refusing
        a request (RBAC, a conflicting change): one line, retried with backoff; any other
        error is a bug and stops the operator."""
        log.info("pre-scaler started", extra={"action": "prescale_start"})

        async def step() -> float:
            t0 = time.monotonic()
            try:
                return await self.tick()
            except _EXPECTED:
                self.stats.errors += 1
                raise
            finally:
                self._tick_seconds = time.monotonic() - t0

        await repeat(
            "pre-scale tick",
            step,
            interval_seconds=self.settings.scaling.interval_seconds,
            expected=_EXPECTED,
        )

    async def _db_now(self) -> tuple[datetime, float]:
        return await clock.now(self.db), time.monotonic()

    async def tick(self) -> float:
        """One pass over every WorkerPool; seconds until the next one."""
        s = self.settings
        self.stats.ticks += 1
        try:
            items = await self.kube.list_workerpools(s.namespaces)
        except KubeNotFound:
            if not self._crd_missing:
                log.info(
                    "the WorkerPool CRD is not installed: nothing to pre-scale",
                    extra={"action": "prescale_idle"},
                )
            self._crd_missing = True
            return s.scaling.interval_seconds
        self._crd_missing = False
        specs: dict[str, WorkerPoolSpec] = {}
        parsed: list[tuple[dict[str, Any], WorkerPoolSpec | str]] = []
        for obj in items:
            try:
                spec = WorkerPoolSpec.model_validate(obj.get("spec") or {})
            except pydantic.ValidationError as e:
                parsed.append((obj, format_validation_error(e)))
                continue
            parsed.append((obj, spec))
            specs.setdefault(obj["metadata"]["name"], spec)
        # Read-only, and fine a few seconds stale (db.reads: the read replica, if any); the
        # clock and every write (the pre-scale history) stay on the primary.
        forecasts = await self._forecaster.forecast(
            self.db.reads, s.scaling.forecast_horizon_seconds, pools=specs
        )
        base, mono = await self._db_now()

        def now() -> datetime:
            return base + timedelta(seconds=time.monotonic() - mono)

        hpas: dict[str, list[dict[str, Any]] | KubeError] = {}
        for ns in sorted(
            {o["metadata"]["namespace"] for o, _ in parsed} | {n for n, _ in self._raised}
        ):
            try:
                hpas[ns] = await self.kube.list_hpas(ns)
            except KubeError as e:
                hpas[ns] = e

        async def one(obj: dict[str, Any], spec: WorkerPoolSpec | str) -> datetime | None:
            async with self._sem:
                return await self._pool(obj, spec, forecasts, hpas, now)

        wakes = await asyncio.gather(*(one(o, sp) for o, sp in parsed))
        await self._restore_orphans(parsed, hpas)
        self._forget(
            {o["metadata"]["uid"] for o, _ in parsed}, {o["metadata"]["name"] for o, _ in parsed}
        )
        delay = s.scaling.interval_seconds
        t = now()
        for w in wakes:
            if w is not None:
                delay = min(delay, (w - t).total_seconds() + WAKE_MARGIN_SECONDS)
        return max(WAKE_MARGIN_SECONDS, delay)

    async def _pool(
        self,
        obj: dict[str, Any],
        spec: WorkerPoolSpec | str,
        forecasts: Mapping[str, PoolForecast],
        hpas: Mapping[str, list[dict[str, Any]] | KubeError],
        now: Callable[[], datetime],
    ) -> datetime | None:
        meta = obj["metadata"]
        ref = CRef(meta["uid"], meta["namespace"], meta["name"])
        shown = dict(obj.get("status") or {})
        state = self._state.setdefault(ref.uid, _PoolState())
        if state.pre is None and not state.seeded:
            state.pre = PreScale.from_status(shown.get("lastPreScale"))
        out = _Outcome()
        if isinstance(spec, str):
            out.ready = ("False", "InvalidSpec", spec)
        else:
            try:
                await self._scale(
                    ref, spec, forecasts.get(ref.name), hpas.get(ref.namespace), state, out, now
                )
            except KubeError as e:
                out.ready = ("False", "ScaleFailed", str(e))
                self._failed(ref, "pre-scale failed", "prescale_error", e)
        await self._write(ref, obj, shown, state, out, now())
        return out.wake

    async def _scale(
        self,
        ref: CRef,
        spec: WorkerPoolSpec,
        pf: PoolForecast | None,
        hpa_list: list[dict[str, Any]] | KubeError | None,
        state: _PoolState,
        out: _Outcome,
        now: Callable[[], datetime],
    ) -> None:
        target = spec.scale_target_ref.name
        what = f"Deployment {ref.namespace}/{target}"
        t = now()
        planned, burst_for_scale = spec.min_replicas, None
        if pf is not None:
            pp = plan_pool(pf, spec, self._tick_seconds)
            plan = pp.plan
            export_metrics(self.metrics, pf, plan)
            planned, burst_for_scale = pp.planned, pp.scale_for
            if pp.change_at is not None:
                out.wake = pp.change_at
            if pp.burst is not None:
                out.burst = NextBurst(time=pp.burst.time, size=pp.burst.size)
        else:
            self.metrics.forecast_demand.labels(ref.name).set(0)
            self.metrics.planned_replicas.labels(ref.name).set(spec.min_replicas)
        # What the previous forecast needed in buckets now past goes into the hold.
        if state.last is not None:
            state.hold.push_past(*state.last, pf.start if pf is not None else t)
        state.last = (pf.start, pf.resolution, plan.need) if pf is not None else None

        try:
            current = await self.kube.read_deployment_scale(ref.namespace, target)
        except KubeNotFound:
            msg = (
                f"{what} not found: create it, or set spec.scaleTargetRef.name to the "
                "Deployment that runs this pool's workers"
            )
            out.found = ("False", "TargetNotFound", msg)
            out.ready = ("False", "TargetNotFound", msg)
            return
        except KubeError as e:
            if e.status == 403:
                msg = (
                    f"the operator may not read the scale of {what} (HTTP 403): grant its "
                    f"ServiceAccount get and patch on deployments/scale in {ref.namespace}"
                )
                out.found = ("False", "Forbidden", msg)
                out.ready = ("False", "Forbidden", msg)
                return
            raise
        out.found = ("True", "Found", f"{what} has a scale subresource")
        delay = spec.scale_down_delay_seconds
        if not state.seeded:
            # A new leader never scales down sooner than scaleDownDelaySeconds.
            state.hold.push(t, min(current, spec.max_replicas))
            state.seeded = True
        desired = desired_replicas(planned, state.hold.value(t, delay), spec)
        until = state.hold.until(delay)
        if until is not None and desired > planned and (out.wake is None or until < out.wake):
            out.wake = until
        out.desired = desired

        before = state.acted if state.acted is not None else current
        if burst_for_scale is not None and desired > before and planned > spec.min_replicas:
            state.pre = PreScale(t, desired, burst_for_scale)

        hpa = (
            None
            if isinstance(hpa_list, KubeError)
            else next((h for h in hpa_list or [] if hpa_targets(h, target)), None)
        )
        if isinstance(hpa_list, KubeError) and hpa_list.status != 403:
            raise hpa_list
        if hpa is not None:
            await self._via_hpa(ref, hpa, desired, current, state, out)
        else:
            if current != desired:
                before = current
                current = await self.kube.patch_deployment_scale(ref.namespace, target, desired)
                self.stats.scale_patches += 1
                log.info(
                    "scaled",
                    extra={"action": "prescale_scale", "object": f"{ref.namespace}/{ref.name}",
                           "replicas": desired, "from": before},
                )  # fmt: skip
                await self._event(
                    ref,
                    "Normal",
                    "Scaled",
                    f"scaled {what} from {before} to {desired} replicas"
                    + (
                        f" ahead of a burst at {format_instant(burst_for_scale)}"
                        if burst_for_scale is not None and desired > before
                        else ""
                    ),
                )
            out.ready = ("True", "Scaled", f"{what} is at {current} replicas as planned")
        state.acted = desired
        out.current = current
        self.metrics.pool_replicas.labels(ref.name).set(current)
        self._labels.add(ref.name)
        if state.pre is not None and not state.pre.settled and state.pre.ready_at is None:
            ready = await self._ready_replicas(ref, target)
            t = now()
            lead = state.pre.observe(ready, t)
            if lead is not None:
                self.metrics.prescale_lead.labels(ref.name).set(lead)
            if state.pre.waiting:
                poll = t + timedelta(seconds=READY_POLL_SECONDS)
                out.wake = poll if out.wake is None else min(out.wake, poll)

    async def _ready_replicas(self, ref: CRef, target: str) -> int | None:
        """The Deployment's Ready pods; None when it cannot be read (RBAC without get on
        deployments: the pre-scale's landing stays unknown rather than failing the pool)."""
        try:
            ready = await self.kube.read_deployment_ready(ref.namespace, target)
        except KubeError as e:
            if e.status not in (403, 404):
                raise
            if ref.uid not in self._ready_unknown:
                self._ready_unknown.add(ref.uid)  # once per pool, not every poll
                log.warning(
                    f"cannot read Deployment {ref.namespace}/{target} (HTTP {e.status}): "
                    "whether its pods are Ready stays unknown; grant the operator's "
                    "ServiceAccount get on that Deployment",
                    extra={"action": "prescale_ready_unknown",
                           "object": f"{ref.namespace}/{ref.name}", "error": str(e)},
                )  # fmt: skip
            return None
        self._ready_unknown.discard(ref.uid)
        return ready

    async def _via_hpa(
        self,
        ref: CRef,
        hpa: dict[str, Any],
        desired: int,
        current: int,
        state: _PoolState,
        out: _Outcome,
    ) -> None:
        meta = hpa.get("metadata") or {}
        name = meta.get("name", "")
        change = hpa_change(hpa, desired)
        shown_min = int((hpa.get("spec") or {}).get("minReplicas") or 1)
        if change is not None:
            await self.kube.patch_hpa(
                ref.namespace, name, change.patch(meta.get("resourceVersion"))
            )
            self.stats.hpa_patches += 1
            raised = change.original is not None
            if raised:
                self._raised.add((ref.namespace, name))
            else:
                self._raised.discard((ref.namespace, name))
            verb = "raised" if raised else "restored"
            await self._event(
                ref,
                "Normal",
                "RaisedHPAMinimum" if raised else "RestoredHPAMinimum",
                f"{verb} minReplicas of HorizontalPodAutoscaler {ref.namespace}/{name} from "
                f"{shown_min} to {change.min_replicas}",
            )
            shown_min = change.min_replicas
        original = hpa_original(hpa)
        note = f" (cronwell raised it from {original})" if shown_min > original else ""
        out.ready = (
            "True",
            "ScaledByHPA",
            f"HorizontalPodAutoscaler {ref.namespace}/{name} scales the Deployment; its "
            f"minReplicas is {shown_min}{note}; the Deployment is at {current}",
        )

    async def _restore_orphans(
        self,
        parsed: Sequence[tuple[dict[str, Any], Any]],
        hpas: Mapping[str, list[dict[str, Any]] | KubeError],
    ) -> None:
        """Give HPAs we raised back their minimum when no WorkerPool targets them any more
        (the pool was deleted or retargeted)."""
        owned = {
            (o["metadata"]["namespace"], sp.scale_target_ref.name)
            for o, sp in parsed
            if isinstance(sp, WorkerPoolSpec)
        }
        for ns, found in hpas.items():
            if isinstance(found, KubeError):
                continue
            for hpa in found:
                meta = hpa.get("metadata") or {}
                ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
                if HPA_ANNOTATION not in (meta.get("annotations") or {}):
                    continue
                if (ns, ref.get("name")) in owned:
                    continue
                change = HpaChange(hpa_original(hpa), None)
                with contextlib.suppress(KubeError):
                    await self.kube.patch_hpa(
                        ns, meta["name"], change.patch(meta.get("resourceVersion"))
                    )
                    self.stats.hpa_patches += 1
                    self._raised.discard((ns, meta["name"]))
                    log.info(
                        "restored an HPA no WorkerPool targets",
                        extra={"action": "prescale_hpa_restore", "object": f"{ns}/{meta['name']}"},
                    )

    def _forget(self, uids: set[str], names: set[str]) -> None:
        for uid in set(self._state) - uids:
            del self._state[uid]
        m = self.metrics
        for name in self._labels - names:
            for gauge in (m.pool_replicas, m.prescale_lead, m.forecast_demand, m.planned_replicas):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
        self._labels &= names

    async def _write(
        self,
        ref: CRef,
        obj: Mapping[str, Any],
        shown: dict[str, Any],
        state: _PoolState,
        out: _Outcome,
        now: datetime,
    ) -> None:
        gen = obj["metadata"].get("generation")
        prev = {c.get("type"): c for c in shown.get("conditions") or []}
        found = condition(PoolCondition, "TargetFound", *out.found, gen, prev, now)
        ready = condition(PoolCondition, "Ready", *out.ready, gen, prev, now)
        status = _Status(
            observed_generation=gen,
            desired_replicas=out.desired,
            current_replicas=out.current,
            next_burst=out.burst,
            last_pre_scale=state.pre.shown() if state.pre is not None else None,
            conditions=[ready, found],
        )
        await self._record(ref, state, status.last_pre_scale)
        doc: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude={"kopf"})
        was = prev.get("TargetFound") or {}
        if found.status == "False" and (was.get("status"), was.get("reason")) != (
            "False",
            found.reason,
        ):
            await self._event(ref, "Warning", found.reason, found.message)
        if same_status(doc, shown):
            return
        try:
            await self.kube.patch_workerpool_status(ref.namespace, ref.name, doc)
            self.stats.status_patches += 1
        except KubeError as e:
            self._failed(ref, "WorkerPool status write failed", "prescale_status_error", e)

    async def _record(self, ref: CRef, state: _PoolState, pre: LastPreScale | None) -> None:
        """Keep the pre-scale in the store's history when it changed (as status shows it, so
        a new leader reading it back from status updates the same row). A database error is
        a warning and a retry next tick: the history must never stop the scaling."""
        if pre is None or pre == state.recorded:
            return
        row = prescales.PreScaleRecord(
            namespace=ref.namespace,
            workerpool=ref.name,
            pool=ref.name,
            scaled_at=pre.time,
            replicas=pre.replicas,
            burst_at=pre.burst_time,
            ready_at=pre.ready_at,
            landed_before_burst=pre.landed_before_burst,
        )
        try:
            await prescales.record(self.db, row)
        except DatabaseError as e:
            msg = "pre-scale not recorded in the store (retried next tick)"
            self._failed(ref, msg, "prescale_record_error", e)
            return
        state.recorded = pre

    def _failed(self, ref: CRef, message: str, action: str, e: Exception) -> None:
        """Count and log a failure of one pool's tick that the next tick retries."""
        self.stats.errors += 1
        log.warning(
            message,
            extra={"action": action, "object": f"{ref.namespace}/{ref.name}", "error": str(e)},
        )

    async def _event(self, ref: CRef, type_: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(
                ref,
                type_=type_,
                reason=reason,
                message=message,
                instance=self.settings.identity,
                kind=self.kube.WP_KIND,
            )
            self.stats.events += 1
        except KubeError as e:
            log.warning(
                "Event not posted", extra={"action": "prescale_event_error", "error": str(e)}
            )
