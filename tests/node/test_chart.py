"""The chart installed as users install it, on a real node, with the image built from the
Dockerfile: `helm install` (hooks included) into a namespace enforcing Pod Security
"restricted", PostgreSQL through the documented Secret, every pod Ready through its
probes; then ScheduledJobs applied with kubectl call a ledger over HTTP and the
in-cluster operator writes their status.

The fixtures (image, database, ledger, release) are tests/node/release.py's, one install
per session.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from cronwell.testing.node import Node
from tests.node.release import RELEASE, Ledger, _component, _pods, _ready

# The first test's setup may build the image (minutes, cold) and import it.
pytestmark = pytest.mark.timeout(1800)


def test_install_migrates_and_every_pod_becomes_ready(
    node: Node, release: dict[str, Any], database: dict[str, str]
) -> None:
    ns = release["ns"]
    pods = _pods(node, ns)
    by_component: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_component.setdefault(_component(pod), []).append(pod)
    assert {c: len(p) for c, p in by_component.items() if c != "migrate"} == {
        "operator": 2,
        "scheduler": 2,
        "worker": 2,
        "ui": 1,
    }
    for pod in pods:
        if _component(pod) != "migrate":
            assert _ready(pod), pod["metadata"]["name"]
            assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
    # The pre-install hook Job ran `cronwell migrate`: helm waited for it (and deleted it
    # on success), and the schema is in the database the Secret names.
    with psycopg.connect(database["local"]) as conn:
        tables = {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert tables, "the migration hook created no tables"
    assert node.pull_attempts() == []


def test_operator_uses_its_service_account_and_logs_json(
    node: Node, release: dict[str, Any]
) -> None:
    ns = release["ns"]
    operators = [p for p in _pods(node, ns) if _component(p) == "operator"]
    sa = f"{RELEASE}-cronwell-operator"
    for pod in operators:
        assert pod["spec"]["serviceAccountName"] == sa
        env = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env", [])}
        assert "KUBECONFIG" not in env
    # The leader holds the Lease through the API, with nothing but its projected token.
    leases = json.loads(node.kubectl("-n", ns, "get", "leases", "-o", "json").stdout)["items"]
    holders = {lease["spec"].get("holderIdentity") for lease in leases}
    names = {p["metadata"]["name"] for p in operators}
    assert any(h and any(n in h for n in names) for h in holders), holders
    for pod in _pods(node, ns):
        if _component(pod) == "migrate":
            continue
        name = pod["metadata"]["name"]
        out = node.kubectl("-n", ns, "logs", name).stdout
        lines = [line for line in out.splitlines() if line.strip()]
        assert lines, f"{name} logged nothing"
        for line in lines:
            assert isinstance(json.loads(line), dict), f"{name}: {line}"


def test_metrics_answer_on_every_pod(node: Node, release: dict[str, Any]) -> None:
    for pod in _pods(node, release["ns"]):
        if _component(pod) in ("migrate", "ui"):  # the dashboard serves no metrics
            continue
        ports = {
            p.get("name"): p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports", [])
        }
        url = f"http://{pod['status']['podIP']}:{ports['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        assert resp.status == 200
        assert "cronwell_" in body, f"{url}: no cronwell_ metric"


def test_scheduled_jobs_call_the_ledger_and_get_status(
    node: Node, release: dict[str, Any], ledger: tuple[str, Ledger]
) -> None:
    ns = release["ns"]
    base, recorded = ledger
    jobs = ["ledger-a", "ledger-b"]
    manifest = "\n---\n".join(
        json.dumps(
            {
                "apiVersion": "cronwell.dev/v1alpha1",
                "kind": "ScheduledJob",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "schedule": "*/5 * * * * *",
                    "target": {"http": {"url": f"{base}/{name}", "method": "POST"}},
                },
            }
        )
        for name in jobs
    )
    node.kubectl("apply", "-f", "-", input=manifest)
    try:
        deadline = time.monotonic() + 180
        columns: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            out = node.kubectl(
                "-n", ns, "get", "sj", "-o",
                "custom-columns=NAME:.metadata.name,LAST:.status.lastResult,NEXT:.status.nextScheduleTime",
                "--no-headers",
            ).stdout  # fmt: skip
            columns = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
            done = all(
                len(recorded.accepted(f"/{n}")) >= 3 and "<none>" not in columns.get(n, ["<none>"])
                for n in jobs
            )
            if done:
                break
            time.sleep(2)
        table = node.kubectl("-n", ns, "get", "sj").stdout
        print(table)
        header = table.splitlines()[0]
        assert "LAST RESULT" in header and "NEXT RUN" in header
        for name in jobs:
            last, next_run = columns[name]
            assert last == "Succeeded", (name, columns)
            assert next_run != "<none>"
            uid = node.kubectl("-n", ns, "get", "sj", name, "-o", "jsonpath={.metadata.uid}").stdout
            accepted = recorded.accepted(f"/{name}")
            assert len(accepted) >= 3, (name, recorded.requests)
            for key, req in accepted.items():
                assert key.startswith(f"{uid}:"), key
                assert int(req["fence"]) > 0
    finally:
        node.kubectl("-n", ns, "delete", "sj", *jobs, "--ignore-not-found", check=False)


def _wait_all_ready(node: Node, ns: str, counts: dict[str, int], timeout: float = 180) -> None:
    """Until each component has exactly its count of Ready pods (none terminating)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        pods = [p for p in _pods(node, ns) if not p["metadata"].get("deletionTimestamp")]
        seen = {c: sum(1 for p in pods if _component(p) == c and _ready(p)) for c in counts}
        if seen == counts:
            return
        time.sleep(0.5)
    raise AssertionError(f"pods not back to {counts}: {seen}")


def _instant(key: str) -> float:
    """The nominal instant of an idempotency key (<job uid>:<UTC instant>)."""
    return (
        datetime.strptime(key.split(":", 1)[1], "%Y-%m-%dT%H:%M:%SZ")
        .replace(tzinfo=UTC)
        .timestamp()
    )


def _wait_new_effect(ledger: Ledger, path: str, after: float, timeout: float = 180) -> float:
    """Seconds from ``after`` to the first accepted effect that arrived later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        arrived = [r["at"] for r in ledger.accepted(path).values() if r["at"] > after]
        if arrived:
            return min(arrived) - after
        time.sleep(0.2)
    raise AssertionError(f"no effect on {path} within {timeout}s of the fault")


def test_pods_killed_nothing_lost(
    node: Node, release: dict[str, Any], ledger: tuple[str, Ledger], database: dict[str, str]
) -> None:
    """Issue 19 item 5: a per-second job while pods are deleted, force-deleted and killed
    from the host; every occurrence gets exactly one accepted effect in the ledger."""
    ns = release["ns"]
    base, recorded = ledger
    path = "/chaos"
    job = {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "ScheduledJob",
        "metadata": {"name": "chaos", "namespace": ns},
        "spec": {
            "schedule": "* * * * * *",
            "concurrencyPolicy": "Allow",  # each call takes 5 s: several in flight
            # Every occurrence's row is checked: none may be pruned (the default keeps 100,
            # fewer than a slow run's seconds).
            "successfulJobsHistoryLimit": 1000,
            "retry": {"maxAttempts": 20, "initialDelaySeconds": 1, "maxDelaySeconds": 5},
            "timeoutSeconds": 10,
            "target": {"http": {"url": f"{base}{path}?delay=5", "method": "POST"}},
        },
    }
    counts = {"operator": 2, "scheduler": 2, "worker": 2}
    node.kubectl("apply", "-f", "-", input=json.dumps(job))
    uid = node.kubectl("-n", ns, "get", "sj", "chaos", "-o", "jsonpath={.metadata.uid}").stdout
    recovery: dict[str, dict[str, float]] = {}

    def fault(name: str, act: Any) -> None:
        time.sleep(5)  # some steady state between faults
        at = time.time()
        started = time.monotonic()
        act()
        effect = _wait_new_effect(recorded, path, at)
        _wait_all_ready(node, ns, counts)
        recovery[name] = {
            "at": at,
            "next_effect_s": effect,
            "pods_ready_s": time.monotonic() - started,
        }

    def pod_of(component: str, pick: Any = None) -> str:
        pods = [p for p in _pods(node, ns) if _component(p) == component and _ready(p)]
        chosen = pick(pods) if pick else pods[0]
        return str(chosen["metadata"]["name"])

    def leader_scheduler(pods: list[dict[str, Any]]) -> dict[str, Any]:
        with psycopg.connect(database["local"]) as conn:
            row = conn.execute(
                "SELECT p.holder FROM cronwell_partitions p JOIN cronwell_jobs j"
                " ON j.partition = p.partition WHERE j.id = %s",
                (uid,),
            ).fetchone()
        assert row and row[0], "no scheduler holds the job's partition"
        return next(p for p in pods if p["metadata"]["name"] in row[0])

    def leader_operator(pods: list[dict[str, Any]]) -> dict[str, Any]:
        leases = json.loads(node.kubectl("-n", ns, "get", "leases", "-o", "json").stdout)
        holders = " ".join(str(x["spec"].get("holderIdentity")) for x in leases["items"])
        return next(p for p in pods if p["metadata"]["name"] in holders)

    def busy_worker(pods: list[dict[str, Any]]) -> dict[str, Any]:
        """A worker with an attempt of the job in flight (so the kill cuts one): started,
        not only claimed ahead of its instant (that one is given back, never redelivered)."""
        busy = (
            "SELECT p.hostname FROM cronwell_occurrences o"
            " JOIN cronwell_processes p ON p.id = o.worker_id"
            " WHERE o.job_id = %s AND o.state = 'running' AND o.started_at IS NOT NULL"
        )
        deadline = time.monotonic() + 30
        with psycopg.connect(database["local"], autocommit=True) as conn:
            while time.monotonic() < deadline:
                hosts = {row[0] for row in conn.execute(busy, (uid,)).fetchall()}
                if found := [p for p in pods if p["metadata"]["name"] in hosts]:
                    return found[0]
                time.sleep(0.2)
        raise AssertionError("no worker pod has an attempt in flight")

    def kill_worker_process() -> None:
        name = pod_of("worker", busy_worker)
        pod = json.loads(node.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)
        container = pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]
        tasks = node.ctr("tasks", "ls").splitlines()[1:]
        pid = next(int(t.split()[1]) for t in tasks if t.split()[0] == container)
        os.kill(pid, 9)  # from the host, as an OOM kill or a crash would
        restarts = "jsonpath={.status.containerStatuses[0].restartCount}"
        deadline = time.monotonic() + 60
        while node.kubectl("-n", ns, "get", "pod", name, "-o", restarts).stdout != "1":
            assert time.monotonic() < deadline, "the killed worker container was not restarted"
            time.sleep(0.5)

    try:
        _wait_new_effect(recorded, path, time.time())
        fault(
            "delete worker (graceful)",
            lambda: node.kubectl("-n", ns, "delete", "pod", pod_of("worker")),
        )
        force = ("--grace-period=0", "--force", "--wait=false")
        fault(
            "force-delete leader scheduler",
            lambda: node.kubectl(
                "-n", ns, "delete", "pod", pod_of("scheduler", leader_scheduler), *force
            ),
        )
        fault(
            "force-delete leader operator",
            lambda: node.kubectl(
                "-n", ns, "delete", "pod", pod_of("operator", leader_operator), *force
            ),
        )
        fault("kill -9 worker process from the host", kill_worker_process)
        time.sleep(5)
    finally:
        suspended_at = time.time()
        node.kubectl(
            "-n", ns, "patch", "sj", "chaos", "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
    # Attempts cut by a kill are redelivered once their lease expires: wait for them.
    in_flight = (
        "SELECT count(*) FROM cronwell_occurrences WHERE job_id = %s"
        " AND (state = 'running' OR (state = 'pending' AND attempt > 0))"
    )
    deadline = time.monotonic() + 300
    with psycopg.connect(database["local"], autocommit=True) as conn:
        while (row := conn.execute(in_flight, (uid,)).fetchone()) and row[0]:
            assert time.monotonic() < deadline, f"{row[0]} attempts still in flight"
            time.sleep(1)
        rows = conn.execute(
            "SELECT idempotency_key, state FROM cronwell_occurrences WHERE job_id = %s"
            " ORDER BY scheduled_for",
            (uid,),
        ).fetchall()
    time.sleep(6)  # the last completions' requests were answered 5 s after arriving
    node.kubectl("-n", ns, "delete", "sj", "chaos", check=False)
    accepted = recorded.accepted(path)
    requests = [r for r in recorded.requests if r["path"] == path]
    succeeded = [key for key, state in rows if state == "succeeded"]
    not_done = [(key, state) for key, state in rows if state != "succeeded"]
    print(
        f"\nchaos: {len(rows)} occurrences, {len(succeeded)} succeeded, "
        f"{len(accepted)} accepted effects, {len(requests) - len(accepted)} redeliveries, "
        f"not succeeded: {not_done[:5]}"
    )
    for key in accepted:
        times = [r["at"] for r in requests if r["key"] == key]
        if len(times) > 1:
            print(f"  redelivered {key}: {len(times) - 1}x, {times[-1] - times[0]:.1f}s later")
    for name, figures in recovery.items():
        # Lateness (effect arrival - nominal instant) of the occurrences due in the 30 s
        # after the fault: how long the fault delayed the work.
        late = [
            r["at"] - _instant(key)
            for key, r in accepted.items()
            if figures["at"] <= _instant(key) < figures["at"] + 30
        ]
        print(
            f"  {name}: next effect after {figures['next_effect_s']:.1f}s, "
            f"max lateness {max(late, default=float('nan')):.1f}s over {len(late)} occurrences, "
            f"pods Ready again after {figures['pods_ready_s']:.1f}s"
        )
    # Every materialised instant is one second after the previous one: nothing skipped.
    instants = [_instant(key) for key, _ in rows]
    gaps = [(a, b) for a, b in itertools.pairwise(instants) if b - a != 1]
    assert not gaps, gaps
    # Every occurrence that succeeded has its effect in the ledger, exactly one accepted.
    assert set(succeeded) <= set(accepted), set(succeeded) - set(accepted)
    assert set(accepted) <= {key for key, _ in rows}
    # The attempt cut by kill -9 was redelivered (at least once), and accepted once.
    assert len(requests) > len(accepted), "no redelivery after kill -9 of a busy worker"
    # A redelivery carries a higher fence than every earlier attempt of its key.
    for key in accepted:
        fences = [int(r["fence"]) for r in requests if r["key"] == key]
        assert fences == sorted(set(fences)), (key, fences)
    # Only occurrences not yet due when the job was suspended may be unfinished.
    assert all(_instant(key) >= suspended_at - 1 for key, _ in not_done), not_done
