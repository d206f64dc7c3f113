"""High availability: two operator replicas, one coordination Lease. The standby does
nothing until the leader dies (kill -9: it takes over once the Lease expires) or steps down
(SIGTERM: the Lease is released and the standby takes over at its next retry)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import (
    FAST_LEASE_ARGS,
    OperatorProcess,
    sql,
    wait_until,
)
from tests.helpers.kube import (  # fixtures: a namespace and a database per test
    namespace_per_test,  # noqa: F401
    store_per_test,  # noqa: F401
)

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 3.0  # FAST_LEASE_ARGS


def apply(kube: Cluster, ns: str, name: str) -> str:
    manifest = (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        'spec:\n  schedule: "0 6 * * *"\n  target: {log: {}}\n'
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    obj = json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout)
    return str(obj["metadata"]["uid"])


def live(store: str, uid: str) -> bool:
    rows = sql(store, "SELECT deleted_at FROM cronwell_jobs WHERE id = %s", (uid,))
    return bool(rows) and rows[0]["deleted_at"] is None


def lease(kube: Cluster, name: str) -> dict[str, Any]:
    out = kube.kubectl("get", "lease", name, "-n", "default", "-o", "json").stdout
    spec: dict[str, Any] = json.loads(out)["spec"]
    return spec


def test_standby_takes_over_when_the_leader_dies_or_steps_down(
    kube: Cluster, ns: str, store: str, tmp_path: Path
) -> None:
    lease_name = f"op-{ns}"
    args = ["-n", ns, "--lease-name", lease_name, *FAST_LEASE_ARGS]
    a = OperatorProcess(kube.kubeconfig, store, tmp_path / "a.log", identity="op-a", args=args)
    b = OperatorProcess(kube.kubeconfig, store, tmp_path / "b.log", identity="op-b", args=args)
    try:
        a.start().wait_ready(120)
        b.start().wait_for_log("waiting for the lease", 60)
        first = apply(kube, ns, "first")
        wait_until(lambda: live(store, first), 60, "reconciled by the leader", check=a._alive)
        assert lease(kube, lease_name)["holderIdentity"] == "op-a"
        assert "became the leader" not in b.output()  # still a standby

        # The leader dies without a word: the standby waits out the Lease, then leads.
        a.kill()
        died = time.monotonic()
        b.wait_ready(60)
        takeover = time.monotonic() - died
        spec = lease(kube, lease_name)
        assert spec["holderIdentity"] == "op-b" and spec["leaseTransitions"] >= 1
        second = apply(kube, ns, "second")
        wait_until(lambda: live(store, second), 60, "reconciled by the new leader", check=b._alive)
        kube.kubectl("delete", "sj", "first", "-n", ns, "--timeout=60s")  # its finalizer, by b
        assert not live(store, first)

        # A clean step-down releases the Lease: the standby does not wait out its duration.
        a.start().wait_for_log("waiting for the lease", 60)
        stepped = time.monotonic()
        b.terminate()
        a.wait_ready(60)
        handover = time.monotonic() - stepped
        assert b.stop() == 0
        assert lease(kube, lease_name)["holderIdentity"] == "op-a"
        third = apply(kube, ns, "third")
        wait_until(lambda: live(store, third), 60, "reconciled after the handover", check=a._alive)
        print(f"\nfail-over after kill -9 (s): {takeover:.2f}; after SIGTERM (s): {handover:.2f}")
        assert takeover >= LEASE_SECONDS - 1  # it did wait for the Lease to expire
        assert takeover < LEASE_SECONDS + 20
        assert handover < takeover  # released, not expired
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s")
    finally:
        a.stop()
        b.stop()
