"""1,000 ScheduledJobs reconciled by one operator: how long until every CR has its row in
the store, and until every CR shows its status (the writer runs at 100 QPS here). Figures
are printed; the bounds are loose (a loaded 2-core machine runs the whole cluster)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import (
    OperatorProcess,
    sql,
    wait_until,
)
from tests.helpers.kube import (  # fixtures: a namespace and a database per test
    namespace_per_test,  # noqa: F401
    store_per_test,  # noqa: F401
)

ROOT = Path(__file__).resolve().parents[2]
N = 1000
pytestmark = pytest.mark.slow


def manifest(n: int) -> str:
    docs = []
    for i in range(n):
        docs.append(
            "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\n"
            f"metadata: {{name: job-{i:04d}}}\n"
            f'spec:\n  schedule: "{i % 60} {i % 24} * * *"\n  target: {{log: {{}}}}\n'
        )
    return "---\n".join(docs)


def live_rows(store: str) -> int:
    rows = sql(store, "SELECT count(*) AS n FROM cronwell_jobs WHERE deleted_at IS NULL")
    return int(rows[0]["n"])


def with_status(kube: Cluster, ns: str) -> int:
    out = kube.kubectl(
        "get", "sj", "-n", ns, "-o",
        'jsonpath={range .items[*]}{.status.observedGeneration}{"\\n"}{end}',
    ).stdout  # fmt: skip
    return sum(1 for line in out.splitlines() if line.strip() == "1")


def test_a_thousand_scheduledjobs(kube: Cluster, ns: str, store: str, tmp_path: Path) -> None:
    # Production Lease timings (15 s / 10 s / 2 s): nothing here tests fail-over.
    args = ["-n", ns, "--lease-name", f"op-{ns}", "--status-qps", "100", "--status-burst", "100"]
    op = OperatorProcess(kube.kubeconfig, store, tmp_path / "operator.log", args=args)
    try:
        op.start().wait_ready(120)
        started = time.monotonic()
        kube.kubectl("create", "-n", ns, "-f", "-", input=manifest(N), timeout=600)
        created = time.monotonic() - started
        wait_until(lambda: live_rows(store) == N, 400, f"{N} rows", interval=0.5, check=op._alive)
        rows = time.monotonic() - started
        wait_until(
            lambda: with_status(kube, ns) == N, 400, f"{N} statuses", interval=2, check=op._alive
        )
        statuses = time.monotonic() - started

        # A backlog: the operator comes back to 1,000 CRs whose rows are all gone (drift
        # repair through the resume handlers), so its own throughput is what is measured.
        assert op.stop() == 0
        sql(store, "TRUNCATE cronwell_jobs, cronwell_occurrences, cronwell_attempts, "
            "cronwell_status_changes CASCADE")  # fmt: skip
        restarted = time.monotonic()
        op.start().wait_ready(120)
        ready = time.monotonic() - restarted
        wait_until(lambda: live_rows(store) == N, 400, f"{N} rows", interval=0.5, check=op._alive)
        backlog = time.monotonic() - restarted
        t0 = time.monotonic()
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--wait=false", timeout=600)
        wait_until(lambda: live_rows(store) == 0, 400, "all tombstoned", check=op._alive)
        wait_until(
            lambda: not kube.kubectl("get", "sj", "-n", ns, "-o", "name").stdout.strip(),
            400,
            "every CR gone (finalizers removed)",
            interval=1,
            check=op._alive,
        )
        deleted = time.monotonic() - t0
        print(
            f"\n{N} ScheduledJobs: kubectl create {created:.1f}s; all rows in the store "
            f"{rows:.1f}s; all statuses written {statuses:.1f}s (from the start of the "
            f"create); restart onto {N} CRs without rows: ready {ready:.1f}s, all rows "
            f"re-created {backlog:.1f}s; kubectl delete --all until every row is tombstoned "
            f"and every CR gone {deleted:.1f}s"
        )
        assert "status pass failed" not in op.output()
    finally:
        op.stop()
