"""Restart and drift repair: what changed while the operator was down is repaired when it
comes back — a CR without a row is created, a row without a CR is tombstoned, an edit made
meanwhile is applied, and a trigger value already run is not run again."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import (
    OperatorProcess,
    sql,
    wait_until,
)
from tests.helpers.kube import (  # fixtures: a namespace and a database per test
    namespace_per_test,  # noqa: F401
    operator_args,
    store_per_test,  # noqa: F401
)

ROOT = Path(__file__).resolve().parents[2]


def apply(kube: Cluster, ns: str, name: str, spec: str, annotations: str = "") -> str:
    meta = f"{{name: {name}{', annotations: ' + annotations if annotations else ''}}}"
    manifest = (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {meta}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return str(
        json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout)["metadata"][
            "uid"
        ]
    )


def row(store: str, uid: str) -> dict[str, Any] | None:
    rows = sql(store, "SELECT * FROM cronwell_jobs WHERE id = %s", (uid,))
    return rows[0] if rows else None


def triggers(store: str, uid: str) -> int:
    return int(
        sql(
            store,
            "SELECT count(*) AS n FROM cronwell_occurrences WHERE job_id = %s AND origin = "
            "'trigger'",
            (uid,),
        )[0]["n"]
    )


def test_restart_repairs_what_drifted_while_down(
    kube: Cluster, ns: str, store: str, tmp_path: Path
) -> None:
    op = OperatorProcess(kube.kubeconfig, store, tmp_path / "operator.log", args=operator_args(ns))
    daily = 'schedule: "0 6 * * *"\ntarget: {log: {}}'
    try:
        op.start().wait_ready(120)
        keep = apply(kube, ns, "keep", daily)
        orphan = apply(kube, ns, "orphan", daily)
        lost = apply(kube, ns, "lost-row", daily)
        once = apply(kube, ns, "once", daily, annotations='{"cronwell.dev/trigger": "t-1"}')
        for uid in (keep, orphan, lost, once):
            wait_until(lambda uid=uid: row(store, uid), 60, f"row {uid}", check=op._alive)
        wait_until(lambda: triggers(store, once) == 1, 60, "the trigger ran", check=op._alive)
        assert op.stop() == 0  # graceful: kopf stops, the Lease is released

        # -- while the operator is down
        born = apply(kube, ns, "born", daily)  # a CR without a row
        kube.kubectl(
            "patch", "sj", "orphan", "-n", ns, "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
        )  # fmt: skip
        kube.kubectl("delete", "sj", "orphan", "-n", ns)  # a row without a CR
        sql(store, "DELETE FROM cronwell_status_changes WHERE job_id = %s", (lost,))
        sql(store, "DELETE FROM cronwell_occurrences WHERE job_id = %s", (lost,))
        sql(store, "DELETE FROM cronwell_jobs WHERE id = %s", (lost,))  # the row is lost
        apply(kube, ns, "keep", 'schedule: "0 7 * * *"\ntarget: {log: {}}')  # an edit
        assert row(store, born) is None and row(store, orphan)["deleted_at"] is None

        started = time.monotonic()
        op.start().wait_ready(120)
        # Orphans are tombstoned before kopf starts (the store is read before the CRs).
        assert row(store, orphan)["deleted_at"] is not None
        assert "orphans=1" in op.output()
        wait_until(lambda: row(store, born), 60, "the CR born while down", check=op._alive)
        wait_until(lambda: row(store, lost), 60, "the lost row re-created", check=op._alive)
        wait_until(
            lambda: (r := row(store, keep)) and r["generation"] == 2,
            60,
            "the edit made while down",
            check=op._alive,
        )
        repaired = time.monotonic() - started
        print(f"\nrestart to repaired (s): {repaired:.2f}")
        assert row(store, keep)["spec"]["schedule"] == "0 7 * * *"
        assert row(store, lost)["namespace"] == ns
        # The resume handler saw t-1 again: its key exists, so it did not run twice.
        assert triggers(store, once) == 1
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s")
    finally:
        op.stop()
