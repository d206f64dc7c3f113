"""Pre-scaling on a real API server with a real store and a real operator process: a burst
of occurrences a few seconds ahead raises the WorkerPool's Deployment (through its scale
subresource) before the burst and lowers it after; an HPA on the same Deployment gets its
minReplicas raised and restored instead; min/max are respected; a missing target is a
condition and one Event.

Deployments exist on a bare API server (no controller-manager): nothing runs pods, but
spec.replicas and the scale subresource behave as in a cluster. A pre-scale lands when its
pods are Ready (the Deployment's status.readyReplicas): where a test needs that, it writes
the status subresource itself, as the missing Deployment controller would
(tests/node/test_prescale.py sees real pods become Ready). Bursts are `runAt` jobs
seconds away (no waiting for a minute boundary); no scheduler or worker is needed, since
the forecast reads the schedules from the store.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cronwell.jobs import apply_job
from cronwell.models import ScheduledJobSpec
from cronwell.prescale import HPA_ANNOTATION
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster, free_port
from cronwell_operator.testing import OperatorProcess, sql
from tests.helpers.kube import running_operator
from tests.helpers.wait import eventually

ROOT = Path(__file__).resolve().parents[2]

#: 20 occurrences at one instant, 1 s each (no history: defaultDurationSeconds), to start
#: within 1 s: 10 slots (two waves) = 5 replicas of 2.
BURST = 20
POOL = {
    "concurrencyPerReplica": 2,
    "startSLOSeconds": 1,
    "defaultDurationSeconds": 1,
    "leadTimeSeconds": 4,
    "scaleDownDelaySeconds": 3,
}
NEEDED = 5
METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("prescale") / "operator.log"
    extra = ("--scale-interval-seconds", "1", "--metrics-port", str(METRICS_PORT))
    with running_operator(kube, ns, store, log, *extra) as op:
        yield op


# ------------------------------------------------------------------------------ helpers


def deployment(kube_api: Any, ns: str, name: str, replicas: int) -> None:
    labels = {"app": name}
    body = client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="worker", image="cronwell:test")]
                ),
            ),
        ),
    )
    client.AppsV1Api(kube_api).create_namespaced_deployment(ns, body)


def mark_ready(kube_api: Any, ns: str, name: str, n: int) -> None:
    """What the Deployment controller and kubelets would report: n pods Ready."""
    status = {"replicas": n, "readyReplicas": n, "availableReplicas": n, "updatedReplicas": n}
    client.AppsV1Api(kube_api).patch_namespaced_deployment_status(name, ns, {"status": status})


def parse_time(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def replicas(kube_api: Any, ns: str, name: str) -> int:
    scale = client.AppsV1Api(kube_api).read_namespaced_deployment_scale(name, ns)
    return int(scale.spec.replicas)


def workerpool(kube: Cluster, ns: str, name: str, target: str, **spec: Any) -> None:
    doc = {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "WorkerPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"scaleTargetRef": {"name": target}, **spec},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(doc))


def pool_status(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    out = kube.kubectl("get", "wp", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def conditions(st: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c.get("reason", ""), c.get("message", ""))
        for c in st.get("conditions") or []
    }


def events(kube: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    out = kube.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
        "-o", "json",
    ).stdout  # fmt: skip
    return [e for e in json.loads(out)["items"] if e["involvedObject"]["kind"] == "WorkerPool"]


def recorded(store: str, ns: str, name: str) -> list[dict[str, Any]]:
    """The pre-scales of WorkerPool ns/name the operator recorded in the store's history."""
    return sql(
        store,
        "SELECT pool, scaled_at, replicas, burst_at, ready_at, landed_before_burst "
        "FROM cronwell_prescales WHERE namespace = %s AND workerpool = %s ORDER BY scaled_at",
        (ns, name),
    )


def burst_at(store: str, pool: str, n: int, lead_seconds: float) -> datetime:
    """n one-shot jobs of `pool` due together at a whole second ~lead_seconds ahead (the
    database's clock); that instant."""
    now: datetime = sql(store, "SELECT now() AS now")[0]["now"]
    at = (now + timedelta(seconds=lead_seconds)).replace(microsecond=0)

    async def go() -> None:
        spec = ScheduledJobSpec.model_validate(
            {"runAt": at.isoformat(), "pool": pool, "target": {"log": {"message": "x"}}}
        )
        async with Database(store, max_size=2) as db:
            for i in range(n):
                await apply_job(db, namespace="jobs", name=f"{pool}-{i}", spec=spec)

    asyncio.run(go())
    return at


@dataclass
class Watch:
    """Samples a value every 50 ms in a thread, keeping (wall time, value) at each change."""

    read: Callable[[], Any]
    changes: list[tuple[float, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.read()
            if not self.changes or self.changes[-1][1] != value:
                self.changes.append((time.time(), value))
            time.sleep(0.05)

    def first(self, predicate: Callable[[Any], bool]) -> float | None:
        return next((t for t, v in list(self.changes) if predicate(v)), None)

    def stop(self) -> list[Any]:
        self._stop.set()
        self._thread.join(5)
        return [v for _, v in self.changes]


def metric(name: str, pool: str) -> float | None:
    """One sample of the operator's /metrics for a pool label."""
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'{name}{{pool="{pool}"}} '
    line = next((ln for ln in text.splitlines() if ln.startswith(prefix)), None)
    return float(line.removeprefix(prefix)) if line else None


# -------------------------------------------------------------------------------- tests


def test_replicas_rise_before_the_burst_and_fall_after(
    kube: Cluster, kube_api: Any, ns: str, store: str, operator: OperatorProcess
) -> None:
    deployment(kube_api, ns, "w-burst", 1)
    workerpool(kube, ns, "burst", "w-burst", minReplicas=1, maxReplicas=10, **POOL)
    eventually(
        operator,
        lambda: (
            conditions(pool_status(kube, ns, "burst")).get("TargetFound", ("", "", ""))[0] == "True"
        ),
        "the pool's target found",
        60,
    )
    watch = Watch(lambda: replicas(kube_api, ns, "w-burst"))
    at = burst_at(store, "burst", BURST, 14)
    st = eventually(
        operator,
        lambda: (s := pool_status(kube, ns, "burst")).get("nextBurst") and s,
        "the burst forecast in status",
        30,
    )
    assert st["nextBurst"] == {"time": at.isoformat().replace("+00:00", "Z"), "size": BURST}
    eventually(operator, lambda: watch.first(lambda v: v == NEEDED), "replicas up", 60)
    pre = eventually(
        operator,
        lambda: pool_status(kube, ns, "burst").get("lastPreScale"),
        "lastPreScale in status",
        30,
    )
    # Replicas set is not landed: no pod is Ready yet (nothing runs pods here).
    assert pre.get("landedBeforeBurst") is None and pre.get("readyAt") is None, pre
    marked = time.time()
    mark_ready(kube_api, ns, "w-burst", NEEDED)
    eventually(
        operator,
        lambda: watch.first(lambda v: v == NEEDED) and watch.changes[-1][1] == 1,
        "replicas up for the burst, then back to minReplicas",
        60,
    )
    seen = watch.stop()
    up = watch.first(lambda v: v == NEEDED)
    down = next(t for t, v in watch.changes if v == 1 and up is not None and t > up)
    assert seen == [1, NEEDED, 1], seen
    assert up is not None
    # Up before the burst, and because of it: not earlier than leadTimeSeconds (+ the 1 s
    # the loop acts early, + a second of slack for bucket rounding).
    assert at.timestamp() - POOL["leadTimeSeconds"] - 2 <= up < at.timestamp(), up - at.timestamp()
    # Down only once the need has been gone for scaleDownDelaySeconds.
    assert down >= at.timestamp() + POOL["scaleDownDelaySeconds"], down - at.timestamp()
    st = pool_status(kube, ns, "burst")
    pre = st["lastPreScale"]
    assert pre["replicas"] == NEEDED and pre["landedBeforeBurst"] is True, pre
    assert pre["burstTime"] == at.isoformat().replace("+00:00", "Z")
    # Seen Ready after the test reported the pods Ready (less a little clock rounding)
    # and before the burst.
    assert marked - 0.5 <= parse_time(pre["readyAt"]) <= at.timestamp(), (marked, pre)
    # The store's history holds it too, once however often it was written (the dashboard's
    # forecast shows it after the fact).
    (row,) = recorded(store, ns, "burst")
    assert (row["pool"], row["replicas"], row["landed_before_burst"]) == ("burst", NEEDED, True)
    assert row["scaled_at"].timestamp() == parse_time(pre["time"]), (row, pre)
    assert (row["burst_at"], row["ready_at"].timestamp()) == (at, parse_time(pre["readyAt"]))
    assert (st["desiredReplicas"], st["currentReplicas"]) == (1, 1)
    assert conditions(st)["Ready"][:2] == ("True", "Scaled")
    reasons = [e["reason"] for e in events(kube, ns, "burst")]
    assert reasons.count("Scaled") == 2, reasons
    # The lead achieved, as the pre-scaler measured it: positive, at most lead + the early
    # second (+ one of slack), and the current replicas.
    lead = metric("cronwell_prescale_lead_seconds", "burst")
    assert lead is not None and 0 < lead <= POOL["leadTimeSeconds"] + 2, lead
    assert metric("cronwell_pool_replicas", "burst") == 1


def test_an_hpa_gets_its_minimum_raised_and_restored(
    kube: Cluster, kube_api: Any, ns: str, store: str, operator: OperatorProcess
) -> None:
    deployment(kube_api, ns, "w-hpa", 2)
    auto = client.AutoscalingV2Api(kube_api)
    auto.create_namespaced_horizontal_pod_autoscaler(
        ns,
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "w-hpa"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w-hpa"},
                "minReplicas": 2,
                "maxReplicas": 8,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 70},
                        },
                    }
                ],
            },
        },
    )

    def hpa_state() -> tuple[int, str | None]:
        h = auto.read_namespaced_horizontal_pod_autoscaler("w-hpa", ns)
        return int(h.spec.min_replicas), (h.metadata.annotations or {}).get(HPA_ANNOTATION)

    workerpool(kube, ns, "hpa", "w-hpa", minReplicas=1, maxReplicas=10, **POOL)
    eventually(
        operator,
        lambda: (
            conditions(pool_status(kube, ns, "hpa")).get("Ready", ("", "", ""))[1] == "ScaledByHPA"
        ),
        "the pool sees the HPA",
        60,
    )
    hpa_watch, deploy_watch = Watch(hpa_state), Watch(lambda: replicas(kube_api, ns, "w-hpa"))
    at = burst_at(store, "hpa", BURST, 12)
    eventually(operator, lambda: hpa_watch.first(lambda v: v[0] == NEEDED), "HPA raised", 40)
    eventually(
        operator,
        lambda: hpa_watch.changes[-1][1] == (2, None) and len(hpa_watch.changes) >= 3,
        "HPA minReplicas restored after the burst",
        60,
    )
    hpa_seen, deploy_seen = hpa_watch.stop(), deploy_watch.stop()
    raised = hpa_watch.first(lambda v: v[0] == NEEDED)
    assert raised is not None and raised < at.timestamp()
    assert hpa_seen == [(2, None), (NEEDED, "2"), (2, None)], hpa_seen
    assert deploy_seen == [2], "the HPA owns the replicas: the Deployment is never patched"
    st = pool_status(kube, ns, "hpa")
    # Nothing runs the HPA controller or pods here, so no pod was ever Ready: the
    # pre-scale is reported as not landed before its burst.
    assert st["lastPreScale"]["landedBeforeBurst"] is False
    assert st["lastPreScale"].get("readyAt") is None
    (row,) = recorded(store, ns, "hpa")
    assert (row["replicas"], row["ready_at"], row["landed_before_burst"]) == (NEEDED, None, False)
    reasons = [e["reason"] for e in events(kube, ns, "hpa")]
    assert reasons.count("RaisedHPAMinimum") == 1 and reasons.count("RestoredHPAMinimum") == 1


def test_a_refused_history_write_neither_stops_the_scaling_nor_is_lost(
    kube: Cluster, kube_api: Any, ns: str, store: str, operator: OperatorProcess
) -> None:
    """The store refuses the pre-scale's row (a trigger, as a role without INSERT would):
    the pool is scaled and its status written all the same, the refusal is one warning,
    and once the store accepts it again a later tick records the row."""
    deployment(kube_api, ns, "w-flaky", 1)
    workerpool(kube, ns, "flaky", "w-flaky", minReplicas=1, maxReplicas=10, **POOL)
    eventually(
        operator,
        lambda: conditions(pool_status(kube, ns, "flaky")).get("TargetFound", ("",))[0] == "True",
        "the pool's target found",
        60,
    )
    sql(
        store,
        "CREATE FUNCTION e2e_refuse() RETURNS trigger LANGUAGE plpgsql "
        "AS $$BEGIN RAISE EXCEPTION 'refused by the test'; END$$",
    )
    sql(
        store,
        "CREATE TRIGGER e2e_refuse BEFORE INSERT ON cronwell_prescales FOR EACH ROW "
        "WHEN (NEW.pool = 'flaky') EXECUTE FUNCTION e2e_refuse()",
    )
    try:
        burst_at(store, "flaky", BURST, 10)
        eventually(operator, lambda: replicas(kube_api, ns, "w-flaky") == NEEDED, "scaled up", 40)
        # Settled (no pod is Ready here: not landed once the burst came), so the status
        # changes no more: only a retry can record it now.
        pre = eventually(
            operator,
            lambda: (
                (p := pool_status(kube, ns, "flaky").get("lastPreScale"))
                and p.get("landedBeforeBurst") is False
                and p
            ),
            "the settled pre-scale in status",
            40,
        )
        assert "refused by the test" in operator.output()
        assert recorded(store, ns, "flaky") == []
    finally:
        sql(store, "DROP TRIGGER e2e_refuse ON cronwell_prescales")
        sql(store, "DROP FUNCTION e2e_refuse()")
    rows = eventually(operator, lambda: recorded(store, ns, "flaky"), "recorded once accepted", 30)
    assert [(r["scaled_at"].timestamp(), r["landed_before_burst"]) for r in rows] == [
        (parse_time(pre["time"]), False)
    ]


def test_min_and_max_are_respected(
    kube: Cluster, kube_api: Any, ns: str, store: str, operator: OperatorProcess
) -> None:
    deployment(kube_api, ns, "w-min", 1)
    deployment(kube_api, ns, "w-max", 1)
    workerpool(kube, ns, "floor", "w-min", minReplicas=3, maxReplicas=6, **POOL)
    workerpool(kube, ns, "ceiling", "w-max", minReplicas=1, maxReplicas=3, **POOL)
    # No jobs in pool "floor": it is raised to its minimum at once and stays there.
    eventually(operator, lambda: replicas(kube_api, ns, "w-min") == 3, "raised to min", 60)
    watch = Watch(lambda: replicas(kube_api, ns, "w-max"))
    at = burst_at(store, "ceiling", BURST, 10)  # needs 5 replicas, max is 3
    eventually(operator, lambda: watch.first(lambda v: v == 3), "scaled up to max", 40)
    eventually(
        operator,
        lambda: time.time() > at.timestamp() + 1 and watch.changes[-1][1] == 1,
        "back to min after the burst",
        60,
    )
    assert watch.stop() == [1, 3, 1]
    assert replicas(kube_api, ns, "w-min") == 3
    st = pool_status(kube, ns, "ceiling")
    assert st["lastPreScale"]["replicas"] == 3


def test_missing_target_is_a_condition_and_one_event(
    kube: Cluster, kube_api: Any, ns: str, operator: OperatorProcess
) -> None:
    workerpool(kube, ns, "lost", "w-nowhere", minReplicas=2, maxReplicas=4)
    st = eventually(
        operator,
        lambda: (
            (s := pool_status(kube, ns, "lost"))
            and conditions(s).get("TargetFound", ("", "", ""))[0] == "False"
            and s
        ),
        "TargetFound=False",
        60,
    )
    _, reason, message = conditions(st)["TargetFound"]
    assert reason == "TargetNotFound"
    assert f"Deployment {ns}/w-nowhere not found" in message
    assert "spec.scaleTargetRef.name" in message
    assert conditions(st)["Ready"][:2] == ("False", "TargetNotFound")
    eventually(operator, lambda: events(kube, ns, "lost"), "a TargetNotFound Event", 30)
    time.sleep(3)  # three more ticks (1 s each) still make one Event: once per transition
    evs = events(kube, ns, "lost")
    assert [(e["type"], e["reason"]) for e in evs] == [("Warning", "TargetNotFound")]
    assert "w-nowhere" in evs[0]["message"]
    # The Deployment appears: found, and raised to minReplicas.
    deployment(kube_api, ns, "w-nowhere", 1)
    st = eventually(
        operator,
        lambda: (
            (s := pool_status(kube, ns, "lost"))
            and conditions(s).get("TargetFound", ("", "", ""))[0] == "True"
            and s
        ),
        "TargetFound=True once the Deployment exists",
        30,
    )
    assert replicas(kube_api, ns, "w-nowhere") == 2
    assert [e["reason"] for e in events(kube, ns, "lost")].count("TargetNotFound") == 1
