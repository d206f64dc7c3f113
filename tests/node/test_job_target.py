"""Issue 20 on a real node: CronJobs converted by `cronwell convert` and applied with
kubectl run their container as Jobs whose Pods really run to Complete and to Failed, one
Job per nominal instant while worker pods are killed; `kubectl get jobs` shows the runs
and `cronwell runs` records each instant's outcome (the Job's failure message included).

The container image is the cronwell image the session imported (it has Python), with
`imagePullPolicy: Never`: nothing is pulled, and the node says so at the end.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cronwell import kubejob
from cronwell.testing.node import Node
from tests.node.conftest import CANARY_REGISTRY
from tests.node.release import _component, _pods, _ready

# The first test's setup may build the image (minutes, cold) and import it.
pytestmark = pytest.mark.timeout(1800)

#: The converted CronJobs run every EVERY seconds here (their own schedules are per
#: minute and daily, as a CronJob's must be): time compressed, nothing else changed.
EVERY = 5
REPORT = "billing-report"
BROKEN = "ledger-export"
#: What the failing container prints before it exits 1 (its Pod's log shows it).
BROKEN_SAYS = "export target is read-only"


def cronjobs(image: str) -> str:
    """Two CronJobs as a team would have them (one that works, one that fails), in the
    `kubectl get cronjobs -o yaml` list shape."""
    container = {
        "image": image,
        "imagePullPolicy": "Never",  # these machines reach no registry
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    report = (
        "import os, time; time.sleep(3); "
        "print('report', os.environ['CRONWELL_IDEMPOTENCY_KEY'], "
        "os.environ['CRONWELL_FENCE_TOKEN'], flush=True)"
    )
    broken = f"import sys; print({BROKEN_SAYS!r}, flush=True); sys.exit(1)"

    def cronjob(name: str, schedule: str, script: str, backoff: int, restart: str) -> Any:
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name, "labels": {"team": "billing"}},
            "spec": {
                "schedule": schedule,
                "timeZone": "Etc/UTC",
                "startingDeadlineSeconds": 300,
                "successfulJobsHistoryLimit": 100,
                "failedJobsHistoryLimit": 100,
                "jobTemplate": {
                    "metadata": {"labels": {"team": "billing", "app": name}},
                    "spec": {
                        "backoffLimit": backoff,
                        "activeDeadlineSeconds": 120,
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {
                                "restartPolicy": restart,
                                "securityContext": {
                                    "runAsNonRoot": True,
                                    "seccompProfile": {"type": "RuntimeDefault"},
                                },
                                "containers": [
                                    {
                                        "name": name,
                                        "command": ["python3", "-c", script],
                                        **container,
                                    }
                                ],
                            },
                        },
                    },
                },
            },
        }

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                cronjob(REPORT, "*/1 * * * *", report, 2, "OnFailure"),
                cronjob(BROKEN, "30 2 * * *", broken, 0, "Never"),
            ],
        },
        sort_keys=False,
    )


def convert(path: Path) -> list[dict[str, Any]]:
    """The real CLI, as the migration guide runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "cronwell", "convert", "-f", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    print(f"\ncronwell convert:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def runs(database_url: str, ns: str, name: str) -> list[dict[str, Any]]:
    """`cronwell runs --json` of one ScheduledJob, oldest first."""
    proc = subprocess.run(
        [sys.executable, "-m", "cronwell", "--database-url", database_url, "runs",
         "-n", ns, "--job", name, "--limit", "10000", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return sorted(rows, key=lambda r: str(r["scheduled_for"]))


def jobs_of(node: Node, ns: str, name: str) -> list[dict[str, Any]]:
    selector = f"{kubejob.LABEL_SCHEDULEDJOB}={name}"
    out = node.kubectl("-n", ns, "get", "jobs", "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def pods_of_job(node: Node, ns: str, job: str) -> list[dict[str, Any]]:
    out = node.kubectl("-n", ns, "get", "pods", "-l", f"job-name={job}", "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def instant(when: str) -> float:
    return datetime.fromisoformat(when).astimezone(UTC).timestamp()


def wait_workers_ready(node: Node, ns: str, count: int = 2, timeout: float = 180) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        live = [p for p in _pods(node, ns) if not p["metadata"].get("deletionTimestamp")]
        if sum(1 for p in live if _component(p) == "worker" and _ready(p)) == count:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"worker pods not back to {count} Ready within {timeout}s")


def busy_worker(node: Node, ns: str, database: str, name: str) -> str:
    """A Ready worker pod with an attempt of ScheduledJob `name` in flight (watching a
    Job), so that killing it cuts one."""
    busy = (
        "SELECT p.hostname FROM cronwell_occurrences o"
        " JOIN cronwell_jobs j ON j.id = o.job_id"
        " JOIN cronwell_processes p ON p.id = o.worker_id"
        " WHERE j.name = %s AND o.state = 'running'"
    )
    deadline = time.monotonic() + 60
    with psycopg.connect(database, autocommit=True) as conn:
        while time.monotonic() < deadline:
            hosts = {row[0] for row in conn.execute(busy, (name,)).fetchall()}
            pods = [p for p in _pods(node, ns) if _component(p) == "worker" and _ready(p)]
            if found := [p for p in pods if p["metadata"]["name"] in hosts]:
                return str(found[0]["metadata"]["name"])
            time.sleep(0.2)
    raise AssertionError(f"no worker pod has an attempt of {name} in flight")


def kill_container(node: Node, ns: str, pod: str) -> None:
    """kill -9 of the worker process from the host, as an OOM kill or a crash would."""
    spec = json.loads(node.kubectl("-n", ns, "get", "pod", pod, "-o", "json").stdout)
    container = spec["status"]["containerStatuses"][0]["containerID"].split("//")[1]
    tasks = node.ctr("tasks", "ls").splitlines()[1:]
    os.kill(next(int(t.split()[1]) for t in tasks if t.split()[0] == container), 9)


def ended(due: list[dict[str, Any]]) -> int:
    return sum(1 for r in due if r["state"] not in ("pending", "running"))


@dataclass
class Observed:
    """What the scenario left: per ScheduledJob its instants due before the suspension
    (`cronwell runs` rows, oldest first), its Jobs, and the instants whose attempt a kill
    cut (an attempt ended by lease expiry)."""

    jobs_ns: str
    uids: dict[str, str]
    due: dict[str, list[dict[str, Any]]]
    rows: dict[str, list[dict[str, Any]]]
    jobs: dict[str, list[dict[str, Any]]]
    table: str
    cut: set[str]
    faults: list[str] = field(default_factory=list)

    def job(self, key: str) -> list[dict[str, Any]]:
        return [
            j
            for js in self.jobs.values()
            for j in js
            if j["metadata"]["annotations"][kubejob.ANNOTATION_KEY] == key
        ]


@pytest.fixture(scope="module")
def observed(
    node: Node,
    release: dict[str, Any],
    database: dict[str, str],
    cronwell_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Observed]:
    """The CronJobs converted and applied; a steady phase, then a worker killed with -9
    from the host and another force-deleted, each while an attempt watches a running Job;
    a steady phase; both suspended, and every instant due until then ended."""
    ns, jobs_ns = release["ns"], release["jobs_ns"]
    started = time.monotonic()
    source = tmp_path_factory.mktemp("cronjobs") / "cronjobs.yaml"
    source.write_text(cronjobs(cronwell_image))
    converted = convert(source)
    assert [d["metadata"]["name"] for d in converted] == [REPORT, BROKEN]
    for doc in converted:
        assert doc["kind"] == "ScheduledJob"
        assert doc["spec"]["retry"] == {"maxAttempts": 1}  # a CronJob retries in its Job only
        assert doc["spec"]["concurrencyPolicy"] == "Allow"  # CronJob's default, kept
        doc["metadata"]["namespace"] = jobs_ns
        doc["spec"]["schedule"] = f"*/{EVERY} * * * * *"
    node.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(converted))
    names = (REPORT, BROKEN)
    uids = {
        n: node.kubectl("-n", jobs_ns, "get", "sj", n, "-o", "jsonpath={.metadata.uid}").stdout
        for n in names
    }
    local = database["local"]
    faults: list[str] = []
    try:
        # Steady: three instants of each ended before any fault.
        deadline = time.monotonic() + 240
        while not all(ended(runs(local, jobs_ns, n)) >= 3 for n in names):
            assert time.monotonic() < deadline, node.kubectl("-n", jobs_ns, "get", "jobs").stdout
            time.sleep(2)
        first = time.monotonic() - started
        pod = busy_worker(node, ns, local, REPORT)
        kill_container(node, ns, pod)
        faults.append(f"kill -9 {pod}")
        wait_workers_ready(node, ns)
        time.sleep(EVERY * 2)
        pod = busy_worker(node, ns, local, REPORT)
        node.kubectl("-n", ns, "delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")
        faults.append(f"force-delete {pod}")
        wait_workers_ready(node, ns)
        time.sleep(EVERY * 3)
    finally:
        suspended_at = time.time()
        for n in names:
            node.kubectl("-n", jobs_ns, "patch", "sj", n, "--type=merge",
                         "-p", '{"spec":{"suspend":true}}')  # fmt: skip
    # Attempts cut by the kills end when their lease (60 s) expires; wait for every instant
    # due before the suspension (one due as it came may stay pending: not counted).
    deadline = time.monotonic() + 300
    while True:
        rows = {n: runs(local, jobs_ns, n) for n in names}
        due = {
            n: [r for r in rows[n] if instant(r["scheduled_for"]) < suspended_at - 2] for n in names
        }
        if all(ended(d) == len(d) for d in due.values()):
            break
        assert time.monotonic() < deadline, f"still open: {due}"
        time.sleep(2)
    with psycopg.connect(local, autocommit=True) as conn:
        cut = {
            row[0]
            for row in conn.execute(
                "SELECT idempotency_key FROM cronwell_attempts WHERE outcome = 'lease_expired'"
                " AND idempotency_key LIKE ANY(%s)",
                ([f"{u}:%" for u in uids.values()],),
            ).fetchall()
        }
    seen = Observed(
        jobs_ns=jobs_ns,
        uids=uids,
        due=due,
        rows=rows,
        jobs={n: jobs_of(node, jobs_ns, n) for n in names},
        table=node.kubectl("-n", jobs_ns, "get", "jobs", "-o", "wide").stdout,
        cut=cut,
        faults=faults,
    )
    print(f"\nkubectl get jobs -n {jobs_ns}:\n{seen.table}")
    print(node.kubectl("-n", jobs_ns, "get", "sj").stdout)
    for n in names:
        print(f"cronwell runs --job {n}:")
        for r in due[n]:
            print(f"  {r['scheduled_for']} {r['state']:<9} try {r['attempt']} "
                  f"{'cut ' if r['idempotency_key'] in cut else ''}{r['reason'] or ''} "
                  f"{(r['last_error'] or '')[:100]}")  # fmt: skip
    print(
        f"job target on the node: {sum(len(v) for v in due.values())} instants "
        f"({len(due[REPORT])} {REPORT}, {len(due[BROKEN])} {BROKEN}), "
        f"{sum(len(v) for v in seen.jobs.values())} Jobs, {len(cut)} instants cut by "
        f"{faults}; first three of each ended {first:.0f}s after apply, scenario "
        f"{time.monotonic() - started:.0f}s"
    )
    yield seen
    node.kubectl("-n", jobs_ns, "delete", "sj", *names, check=False)


def test_each_instant_has_exactly_one_job_named_from_its_key(observed: Observed) -> None:
    """No instant lost, none run twice: one Job per instant, kills included."""
    assert len(observed.faults) == 2, observed.faults
    for n, due in observed.due.items():
        assert len(due) >= 6, f"{n}: only {len(due)} instants"
        assert all(r["idempotency_key"].startswith(f"{observed.uids[n]}:") for r in due)
        instants = [instant(r["scheduled_for"]) for r in due]
        assert all(b - a == EVERY for a, b in itertools.pairwise(instants)), instants
        for r in due:
            key = r["idempotency_key"]
            names = [j["metadata"]["name"] for j in observed.job(key)]
            assert names == [kubejob.job_name(n, key)], (r, names)
            assert names[0] in observed.table  # `kubectl get jobs` shows the run
        keys = {r["idempotency_key"] for r in observed.rows[n]}
        strays = [
            j
            for j in observed.jobs[n]
            if j["metadata"]["annotations"][kubejob.ANNOTATION_KEY] not in keys
        ]
        assert not strays, strays
    assert observed.cut, "no kill cut an attempt in flight"


def test_pods_ran_to_complete_and_to_failed_on_the_node(node: Node, observed: Observed) -> None:
    ns = observed.jobs_ns
    for r in observed.due[REPORT]:
        (job,) = observed.job(r["idempotency_key"])
        name = job["metadata"]["name"]
        assert kubejob.state(job) == ("Complete", ""), (name, job["status"])
        pods = pods_of_job(node, ns, name)
        assert [p["status"]["phase"] for p in pods] == ["Succeeded"], name
        # The container was told its occurrence (CRONWELL_IDEMPOTENCY_KEY) and printed it.
        logs = node.kubectl("-n", ns, "logs", f"job/{name}").stdout
        assert f"report {r['idempotency_key']} " in logs, (name, logs)
    for r in observed.due[BROKEN]:
        (job,) = observed.job(r["idempotency_key"])
        name = job["metadata"]["name"]
        state, message = kubejob.state(job)
        assert state == "Failed" and message.startswith("BackoffLimitExceeded"), job["status"]
        pods = pods_of_job(node, ns, name)
        assert [p["status"]["phase"] for p in pods] == ["Failed"], name  # backoffLimit 0
        (status,) = pods[0]["status"]["containerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 1
        assert BROKEN_SAYS in node.kubectl("-n", ns, "logs", f"job/{name}").stdout


def _recorded_as_its_job(r: dict[str, Any], job: dict[str, Any]) -> bool:
    state, message = kubejob.state(job)
    if state == "Complete":
        return bool(r["state"] == "succeeded")
    return r["state"] == "dead" and message in (r["last_error"] or "")


def test_runs_record_each_jobs_outcome_and_failure_message(node: Node, observed: Observed) -> None:
    """Instants no kill touched: succeeded for a Complete Job, dead with the Job's
    condition (BackoffLimitExceeded: ...) for a Failed one; the status follows."""
    for due in observed.due.values():
        for r in due:
            if r["idempotency_key"] not in observed.cut:
                (job,) = observed.job(r["idempotency_key"])
                assert _recorded_as_its_job(r, job), (r, job["status"])
    want = {REPORT: "Succeeded", BROKEN: "Dead"}
    deadline = time.monotonic() + 60  # the operator writes the status a little later
    while True:
        out = node.kubectl("-n", observed.jobs_ns, "get", "sj", "-o", "json").stdout
        last = {
            sj["metadata"]["name"]: sj["status"].get("lastResult")
            for sj in json.loads(out)["items"]
        }
        if last == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert last == want


def test_an_instant_whose_worker_was_killed_records_its_jobs_outcome(
    observed: Observed,
) -> None:
    """The killed worker's claim was the converted CronJob's only attempt (maxAttempts 1);
    its lease expired, a successor adopted the Job and recorded how it ended (LeaseReap,
    kubejob.next_step), and no second Job ran (the one-Job test)."""
    wrong = [
        (r["idempotency_key"], r["state"], r["reason"], kubejob.state(job)[0])
        for due in observed.due.values()
        for r in due
        if r["idempotency_key"] in observed.cut
        for job in observed.job(r["idempotency_key"])
        if not _recorded_as_its_job(r, job)
    ]
    assert not wrong, wrong


def test_no_image_was_pulled(node: Node, observed: Observed) -> None:
    node.assert_no_pulls(allowed=CANARY_REGISTRY)
