"""Status write-back with real runs: a scheduler and a worker (processes) execute the jobs,
the operator's writer turns the store's change log into status, printer columns and Events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import OperatorProcess, sql, wait_until
from tests.helpers.kube import running_stack
from tests.helpers.wait import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    logs = tmp_path_factory.mktemp("stack")
    # The failing target below is on 127.0.0.1 (denied by default): allowed explicitly, so
    # its attempts fail by connection and are retried, as the test needs.
    env = {"CRONWELL_EGRESS_ALLOW_CIDRS": "127.0.0.1/32"}
    with running_stack(kube, ns, store, logs, worker_env=env) as op:
        yield op


def apply(kube: Cluster, ns: str, name: str, spec: str) -> str:
    manifest = (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return str(get(kube, ns, name)["metadata"]["uid"])


def get(kube: Cluster, ns: str, name: str) -> Any:
    return json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout)


def status(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(get(kube, ns, name).get("status") or {})


def conditions(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in st.get("conditions") or []}


def events(kube: Cluster, ns: str, name: str) -> dict[str, str]:
    out = kube.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
        "-o", "json",
    ).stdout  # fmt: skip
    return {e["reason"]: e["message"] for e in json.loads(out)["items"]}


def db_succeeded(store: str, uid: str) -> int:
    rows = sql(
        store,
        "SELECT count(*) AS n FROM cronwell_occurrences WHERE job_id = %s AND state = 'succeeded'",
        (uid,),
    )
    return int(rows[0]["n"])


def test_successful_runs_show_in_status_and_columns(
    kube: Cluster, ns: str, store: str, stack: OperatorProcess
) -> None:
    uid = apply(kube, ns, "tick", 'schedule: "*/2 * * * * *"\ntarget: {log: {message: tick}}')
    st = eventually(
        stack,
        lambda: (s := status(kube, ns, "tick")).get("counters", {}).get("succeeded", 0) >= 2 and s,
        "two successful runs in status",
        timeout=90,
    )
    assert st["lastResult"] == "Succeeded"
    assert st["lastScheduleTime"] and st["lastSuccessfulTime"] and st["lastDuration"]
    assert st["consecutiveFailures"] == 0 and st["counters"]["failed"] == 0
    assert conditions(st)["Ready"] == ("True", "Scheduled")
    assert conditions(st)["Failing"] == ("False", "NoFailures")

    # Convergence: from a run's completion in the store (finished_at, same host clock) to
    # the first moment `kubectl get` shows it in status (polling adds ~0.1 s).
    lags = []
    for _ in range(3):
        n = db_succeeded(store, uid)
        wait_until(lambda n=n: db_succeeded(store, uid) > n, 30, "another run")
        finished = sql(
            store,
            "SELECT extract(epoch FROM finished_at) AS t FROM cronwell_occurrences "
            "WHERE job_id = %s AND state = 'succeeded' ORDER BY finished_at LIMIT 1 OFFSET %s",
            (uid, n),
        )[0]["t"]
        eventually(
            stack,
            lambda n=n: status(kube, ns, "tick")["counters"]["succeeded"] > n,
            f"status shows run {n + 1}",
        )
        lags.append(time.time() - float(finished))
    print(f"\nstatus convergence after a run (s): {', '.join(f'{x:.2f}' for x in lags)}")
    assert max(lags) < 10
    assert "status pass failed" not in stack.output()

    row = kube.kubectl("get", "sj", "tick", "-n", ns, "--no-headers").stdout.split()
    # NAME, SCHEDULE (6 fields), TIMEZONE, SUSPEND, ACTIVE, LAST SCHEDULE, LAST RESULT, ...
    assert row[0] == "tick" and row[7:9] == ["UTC", "false"] and row[11] == "Succeeded"
    wide = kube.kubectl("get", "sj", "tick", "-n", ns, "-o", "wide", "--no-headers").stdout
    assert int(wide.split()[-4]) >= 2  # SUCCEEDED


def test_failures_dead_letters_and_auto_suspension(
    kube: Cluster, ns: str, store: str, stack: OperatorProcess
) -> None:
    apply(
        kube,
        ns,
        "broken",
        """
schedule: "*/3 * * * * *"
retry: {maxAttempts: 2, initialDelaySeconds: 0}
suspendAfterFailures: 2
target: {http: {url: "http://127.0.0.1:9/unreachable", connectTimeoutSeconds: 1}}
""",
    )
    st = eventually(
        stack,
        lambda: (
            conditions(s := status(kube, ns, "broken")).get("Suspended", ("", ""))[1]
            == "SuspendedAfterFailures"
            and s
        ),
        "auto-suspension after two dead-lettered runs",
        timeout=90,
    )
    conds = conditions(st)
    assert conds["Ready"] == ("False", "SuspendedAfterFailures")
    assert conds["DeadLettered"][0] == "True" and conds["Failing"][0] == "True"
    assert st["consecutiveFailures"] >= 2 and st["lastResult"] == "Dead"
    assert st["counters"]["dead"] >= 2 and st["counters"]["failed"] >= 4
    assert "nextScheduleTime" not in st  # suspended
    seen = eventually(
        stack,
        lambda: {"AttemptFailed", "DeadLettered"} <= set(e := events(kube, ns, "broken")) and e,
        "Warning Events for failed attempts and dead letters",
    )
    assert "127.0.0.1:9" in seen["AttemptFailed"]
    assert "dead-lettered" in seen["DeadLettered"]


def test_missed_runs_are_counted_and_reported(
    kube: Cluster, ns: str, store: str, stack: OperatorProcess
) -> None:
    uid = apply(kube, ns, "late", 'schedule: "* * * * *"\nmisfirePolicy: Skip\n'
                "target: {log: {}}")  # fmt: skip
    eventually(
        stack, lambda: sql(store, "SELECT 1 FROM cronwell_jobs WHERE id = %s", (uid,)), "row"
    )
    # Ten minutes of downtime, as if every scheduler had been away.
    sql(
        store,
        "UPDATE cronwell_jobs SET next_run_at = date_trunc('minute', now()) - interval "
        "'10 minutes' WHERE id = %s",
        (uid,),
    )
    st = eventually(
        stack,
        lambda: (s := status(kube, ns, "late")).get("counters", {}).get("missed", 0) >= 10 and s,
        "ten missed runs in status",
    )
    assert st["lastResult"] in ("Missed", "Succeeded")
    ev = eventually(stack, lambda: events(kube, ns, "late").get("MissedRun"), "a MissedRun Event")
    assert "run(s) missed" in ev and "Misfire" in ev
    wide = kube.kubectl("get", "sj", "late", "-n", ns, "-o", "wide", "--no-headers").stdout
    assert int(wide.split()[-2]) >= 10  # MISSED
