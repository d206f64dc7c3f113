"""Issue 19 item 6: pre-scaling with real pods. The chart's worker Deployment gets a
WorkerPool (minReplicas 1); a burst of ScheduledJobs a few minutes ahead makes the
in-cluster operator scale it up so that the new worker pods are Ready (readiness probes,
on the node) before the burst's instant; the burst's occurrences start within the start
SLO (measured at the HTTP ledger); the pool scales back after scaleDownDelaySeconds.

Prints the lead (burst instant - last new worker pod Ready, and - the operator's readyAt)
and the start lags. The release, database and ledger are the session's (release.py).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from cronwell.testing.node import Node
from cronwell_operator.testing import wait_until
from tests.node.release import RELEASE, Ledger, _component, _pods

# Setup may build/import the image and install the chart when this module runs alone.
pytestmark = pytest.mark.timeout(1800)

POOL = "default"  # the chart's one pool (jobs without `pool` run there)
WORKERS = f"{RELEASE}-cronwell-worker-{POOL}"
PATH = "/burst"
HOLD = 10.0
"""Seconds each burst occurrence lasts (the ledger holds its request): longer than the SLO,
so every occurrence needs its own slot at the instant."""
CONCURRENCY = 64  # the chart's worker.defaults.concurrency: slots per worker
BURST = 100
"""Occurrences at one instant: 100 slots = 2 workers of 64; one worker would start 36 of
them a HOLD late."""
NEEDED = 2
AHEAD = 150  # seconds from now to the burst
SPEC = {
    "minReplicas": 1,
    "maxReplicas": 3,
    "concurrencyPerReplica": CONCURRENCY,
    "leadTimeSeconds": 90,
    "scaleDownDelaySeconds": 30,
    "startSLOSeconds": 5,
    "defaultDurationSeconds": HOLD,
}


def _deployment(node: Node, ns: str) -> tuple[int, int]:
    dep = json.loads(node.kubectl("-n", ns, "get", "deployment", WORKERS, "-o", "json").stdout)
    return int(dep["spec"].get("replicas") or 0), int(dep["status"].get("readyReplicas") or 0)


def _workers(node: Node, ns: str) -> list[dict[str, Any]]:
    return [p for p in _pods(node, ns) if _component(p) == "worker"]


def _ready_since(pod: dict[str, Any]) -> float | None:
    """When the pod's Ready condition turned True (second precision), None if not Ready."""
    for c in pod["status"].get("conditions", []):
        if c["type"] == "Ready" and c["status"] == "True":
            return _ts(c["lastTransitionTime"])
    return None


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _pool_status(node: Node, ns: str) -> dict[str, Any]:
    out = node.kubectl("-n", ns, "get", "wp", POOL, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


class Sampler:
    """The Deployment's (spec.replicas, readyReplicas) every second, with wall times."""

    def __init__(self, node: Node, ns: str) -> None:
        self.changes: list[tuple[float, tuple[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(node, ns), daemon=True)
        self._thread.start()

    def _run(self, node: Node, ns: str) -> None:
        while not self._stop.is_set():
            value = _deployment(node, ns)
            if not self.changes or self.changes[-1][1] != value:
                self.changes.append((time.time(), value))
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_workers_ready_before_the_burst_then_scaled_back(
    node: Node, release: dict[str, Any], ledger: tuple[str, Ledger], database: dict[str, str]
) -> None:
    ns = release["ns"]
    base, recorded = ledger
    recorded.holds[PATH] = HOLD
    pool = {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "WorkerPool",
        "metadata": {"name": POOL, "namespace": ns},
        "spec": {"scaleTargetRef": {"name": WORKERS}, **SPEC},
    }
    names = [f"burst-{i}" for i in range(BURST)]
    sampler: Sampler | None = None
    try:
        node.kubectl("apply", "-f", "-", input=json.dumps(pool))
        # The pool owns the replicas now: down to minReplicas (after the delay a new
        # leader observes), one worker Ready, the others gone.
        wait_until(
            lambda: _deployment(node, ns) == (1, 1) and len(_workers(node, ns)) == 1,
            300,
            "the worker Deployment down to minReplicas, one worker left",
            interval=1.0,
        )
        before = {p["metadata"]["name"] for p in _workers(node, ns)}
        with psycopg.connect(database["local"]) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        burst = (row[0] + timedelta(seconds=AHEAD)).replace(microsecond=0)
        at = burst.timestamp()
        jobs = [
            {
                "apiVersion": "cronwell.dev/v1alpha1",
                "kind": "ScheduledJob",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "runAt": burst.isoformat(),
                    "target": {"http": {"url": f"{base}{PATH}", "method": "POST"}},
                },
            }
            for name in names
        ]
        sampler = Sampler(node, ns)
        applied = time.time()
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": jobs})
        node.kubectl("apply", "-f", "-", input=manifest)
        print(f"\nprescale: {BURST} jobs due at {burst.isoformat()} applied in "
              f"{time.time() - applied:.1f}s, {at - time.time():.0f}s before it")  # fmt: skip

        # The operator reports the pre-scale once it has seen the pods Ready, or the burst
        # started without them.
        pre = wait_until(
            lambda: (
                (p := _pool_status(node, ns).get("lastPreScale") or {}).get("burstTime")
                and _ts(p["burstTime"]) == at
                and p.get("landedBeforeBurst") is not None
                and p
            ),
            AHEAD + 240,
            "lastPreScale for this burst settled (pods Ready, or the burst started)",
            interval=1.0,
        )
        new = [p for p in _workers(node, ns) if p["metadata"]["name"] not in before]
        ready = [_ready_since(p) for p in new]
        print(f"prescale: lastPreScale {pre}")
        print(f"prescale: new worker pods {[p['metadata']['name'] for p in new]}, Ready at "
              f"{[None if r is None else r - at for r in ready]} s from the burst")  # fmt: skip

        # Every occurrence of the burst reaches the ledger once: start lags from its instant.
        accepted = wait_until(
            lambda: (a := recorded.accepted(PATH)) and len(a) >= BURST and a,
            max(0.0, at - time.time()) + 300,
            f"{BURST} burst effects in the ledger",
            interval=1.0,
        )
        lags = sorted(r["at"] - at for r in accepted.values())
        print(
            f"prescale: start lag over {len(lags)} occurrences: min {lags[0]:.2f}s, "
            f"p50 {lags[len(lags) // 2]:.2f}s, p99 {lags[int(len(lags) * 0.99) - 1]:.2f}s, "
            f"max {lags[-1]:.2f}s (SLO {SPEC['startSLOSeconds']}s)"
        )
        lead_pods = at - max((r for r in ready if r is not None), default=float("nan"))
        lead_op = at - _ts(pre["readyAt"]) if pre.get("readyAt") else float("nan")
        print(f"prescale: lead T - last new pod Ready {lead_pods:.0f}s (pod condition, 1 s "
              f"resolution); T - readyAt (operator) {lead_op:.1f}s")  # fmt: skip

        # Scaled back after the need (the burst's HOLD) plus scaleDownDelaySeconds.
        def up_down() -> tuple[float, float] | None:
            changes = list(sampler.changes) if sampler else []
            up = next((t for t, v in changes if v[0] >= NEEDED), None)
            down = next((t for t, v in changes if up and t > up and v[0] == 1), None)
            return (up, down) if up is not None and down is not None else None

        up, down = wait_until(
            up_down,
            HOLD + SPEC["scaleDownDelaySeconds"] + 240,
            "the pool scaled back to minReplicas",
            interval=1.0,
        )
        sampler.stop()
        seen = [(round(t - at, 1), v) for t, v in sampler.changes]
        print(f"prescale: (s from burst, (replicas, ready)) {seen}")
        print(f"prescale: scaled up {at - up:.0f}s before the burst, back down "
              f"{down - at:.0f}s after it")  # fmt: skip

        assert pre["replicas"] == NEEDED, pre
        assert pre["landedBeforeBurst"] is True, pre
        assert _ts(pre["readyAt"]) <= at, pre
        assert len(new) >= NEEDED - 1 and all(r is not None and r <= at for r in ready), ready
        assert len(accepted) == BURST
        at_burst = [v for t, v in sampler.changes if t <= at][-1]
        assert at_burst == (NEEDED, NEEDED), f"(replicas, ready) at the burst: {at_burst}"
        assert lags[-1] <= SPEC["startSLOSeconds"], lags[-5:]
        assert down >= at + SPEC["scaleDownDelaySeconds"], down - at
    finally:
        if sampler is not None:
            sampler.stop()
        recorded.holds.pop(PATH, None)
        node.kubectl("-n", ns, "delete", "wp", POOL, "--ignore-not-found", check=False)
        node.kubectl("-n", ns, "delete", "sj", *names, "--ignore-not-found", "--wait=false",
                     check=False)  # fmt: skip
        # Back to the chart's replicas for whatever runs next in this session.
        node.kubectl("-n", ns, "scale", "deployment", WORKERS, "--replicas=2", check=False)
