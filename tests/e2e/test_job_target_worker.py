"""A `job` target end to end on a real API server: the operator, a scheduler and a worker
(processes) turn each occurrence of a ScheduledJob into one Kubernetes Job, and the Job's
outcome into the occurrence's. There is no kubelet or Job controller here: the test plays
the Job controller by patching each Job's status to Complete or Failed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cronwell import kubejob
from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import OperatorProcess, sql
from tests.helpers.kube import running_stack
from tests.helpers.kube import set_job_status as set_status
from tests.helpers.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
POOL = "jobs"
SPEC = f"""
schedule: "*/3 * * * * *"
pool: {POOL}
retry: {{maxAttempts: 2, initialDelaySeconds: 1, maxDelaySeconds: 1}}
target:
  job:
    jobTemplate:
      metadata: {{labels: {{team: e2e}}}}
      spec:
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers: [{{name: main, image: report:1.0, imagePullPolicy: Never}}]
"""


@pytest.fixture(scope="module")
def stack(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    logs = tmp_path_factory.mktemp("stack")
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    with running_stack(kube, ns, store, logs, "--pool", POOL, worker_env=env) as op:
        yield op


def jobs(kube: Cluster, ns: str, sj: str = "report") -> list[dict[str, Any]]:
    out = kube.kubectl(
        "get", "jobs", "-n", ns, "-l", f"{kubejob.LABEL_SCHEDULEDJOB}={sj}", "-o", "json"
    ).stdout
    return list(json.loads(out)["items"])


def job_names(kube: Cluster, ns: str, sj: str = "report") -> list[str]:
    return sorted(j["metadata"]["name"] for j in jobs(kube, ns, sj))


def apply(kube: Cluster, ns: str, name: str, extra: str = "") -> None:
    """The ScheduledJob `name` with SPEC (every 3 s), plus `extra` spec lines."""
    spec = SPEC.strip() + ("\n" + extra.strip() if extra else "")
    manifest = (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.splitlines())
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)


def suspend(kube: Cluster, ns: str, name: str) -> None:
    kube.kubectl("patch", "sj", name, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')


def sj_status(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    out = kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def occurrence(store: str, key: str) -> dict[str, Any]:
    rows = sql(store, "SELECT * FROM cronwell_occurrences WHERE idempotency_key = %s", (key,))
    return dict(rows[0])


def attempts(store: str, key: str) -> list[tuple[str, str]]:
    rows = sql(
        store,
        "SELECT outcome, coalesce(error, '') AS error FROM cronwell_attempts "
        "WHERE idempotency_key = %s ORDER BY id",
        (key,),
    )
    return [(r["outcome"], r["error"]) for r in rows]


def annotation(kube: Cluster, ns: str, name: str, key: str) -> str:
    out = kube.kubectl("get", "job", name, "-n", ns, "-o", "json").stdout
    return str(json.loads(out)["metadata"]["annotations"][key])


FAILED = "BackoffLimitExceeded: Job has reached the specified backoff limit"


def test_each_occurrence_is_one_job_and_its_outcome_is_the_jobs(
    kube: Cluster, kube_api: Any, ns: str, store: str, stack: OperatorProcess
) -> None:
    manifest = (
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: report}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in SPEC.strip().splitlines())
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)

    # Occurrence A: its Job fails, the retry is a second Job, which completes.
    first = eventually(stack, lambda: job_names(kube, ns), "the first Job", timeout=90)
    assert len(first) == 1, first  # Skip: nothing else starts while it runs
    job_a = first[0]
    key_a = annotation(kube, ns, job_a, kubejob.ANNOTATION_KEY)
    set_status(kube_api, ns, job_a, "Failed")
    names = eventually(
        stack, lambda: len(n := job_names(kube, ns)) >= 2 and n, "the retry's Job", timeout=60
    )
    assert names == sorted([job_a, f"{job_a}-2"])
    set_status(kube_api, ns, f"{job_a}-2", "Complete")
    eventually(stack, lambda: occurrence(store, key_a)["state"] == "succeeded", "A succeeded")
    tried = attempts(store, key_a)
    assert [o for o, _ in tried] == ["failed", "succeeded"], tried
    assert FAILED in tried[0][1] and job_a in tried[0][1]

    # Occurrence B: both of its Jobs fail; it is dead with the Job's message.
    later = eventually(
        stack,
        lambda: [n for n in job_names(kube, ns) if not n.startswith(job_a)],
        "the next occurrence's Job",
        timeout=60,
    )
    assert len(later) == 1, later
    job_b = later[0]
    key_b = annotation(kube, ns, job_b, kubejob.ANNOTATION_KEY)
    assert key_b != key_a
    set_status(kube_api, ns, job_b, "Failed")
    eventually(
        stack,
        lambda: f"{job_b}-2" in job_names(kube, ns),
        "B's retry Job",
        timeout=60,
    )
    set_status(kube_api, ns, f"{job_b}-2", "Failed")
    dead = eventually(
        stack,
        lambda: (o := occurrence(store, key_b))["state"] == "dead" and o,
        "B dead-lettered",
    )
    assert FAILED in dead["last_error"] and f"{job_b}-2" in dead["last_error"]
    kube.kubectl(
        "patch", "sj", "report", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    # One Job per occurrence attempt, never two: every Job's key is an occurrence's, and
    # each (key, job attempt) has one Job.
    listed = jobs(kube, ns)
    seen = {
        (j["metadata"]["annotations"][kubejob.ANNOTATION_KEY],
         j["metadata"]["labels"][kubejob.LABEL_JOB_ATTEMPT])
        for j in listed
    }  # fmt: skip
    assert len(seen) == len(listed)
    for j in listed:
        owner = j["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ScheduledJob" and owner["name"] == "report"


def deleting(job: dict[str, Any]) -> bool:
    """Deleted in the foreground: no garbage collector runs here, so the Job stays, with a
    deletionTimestamp and the foregroundDeletion finalizer, as it would while its Pods go."""
    meta = job["metadata"]
    return bool(meta.get("deletionTimestamp")) and "foregroundDeletion" in (
        meta.get("finalizers") or []
    )


def test_replace_deletes_the_replaced_job_and_status_active_lists_the_running_one(
    kube: Cluster, ns: str, store: str, stack: OperatorProcess
) -> None:
    """Replace: the occurrence that replaces a running one deletes its Job (foreground), as
    the CronJob controller does; status.active names the running Job, as a CronJob's does."""
    apply(kube, ns, "swap", "concurrencyPolicy: Replace")
    listed = eventually(stack, lambda: jobs(kube, ns, "swap"), "the first Job", timeout=90)
    by_instant = sorted(listed, key=lambda j: j["metadata"]["labels"][kubejob.LABEL_SCHEDULED_FOR])
    first = by_instant[0]["metadata"]["name"]
    key_first = annotation(kube, ns, first, kubejob.ANNOTATION_KEY)
    # Its Job never finishes (no kubelet): the next instant replaces it.
    eventually(
        stack,
        lambda: [n for n in job_names(kube, ns, "swap") if n != first],
        "the replacing occurrence's Job",
        timeout=60,
    )
    assert occurrence(store, key_first)["state"] == "cancelled"
    old = eventually(
        stack,
        lambda: next((j for j in jobs(kube, ns, "swap") if j["metadata"]["name"] == first), None),
        "the replaced Job (still listed while it is deleted)",
    )
    eventually(
        stack,
        lambda: deleting(next(j for j in jobs(kube, ns, "swap") if j["metadata"]["name"] == first)),
        f"{first} deleted in the foreground",
        timeout=30,
    )
    assert old["metadata"]["annotations"][kubejob.ANNOTATION_KEY] == key_first
    suspend(kube, ns, "swap")

    # Every replaced Job is being deleted; one runs, and status.active names it.
    def settled() -> str | None:
        running = [j for j in jobs(kube, ns, "swap") if not deleting(j)]
        if len(running) != 1:
            return None
        name = str(running[0]["metadata"]["name"])
        st = sj_status(kube, ns, "swap")
        refs = st.get("active") or []
        return name if [r.get("name") for r in refs] == [name] else None

    name = eventually(stack, settled, "one running Job, the one status.active lists", timeout=60)
    status = sj_status(kube, ns, "swap")
    assert status["active"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "namespace": ns}
    ]
    assert status["activeCount"] == 1
    # kubectl's jsonpath, as a CronJob script reads it.
    path = "jsonpath={.status.active[*].name}"
    assert kube.kubectl("get", "sj", "swap", "-n", ns, "-o", path).stdout == name
    key = annotation(kube, ns, name, kubejob.ANNOTATION_KEY)
    assert occurrence(store, key)["state"] == "running"


def test_history_limits_delete_the_oldest_finished_jobs(
    kube: Cluster, kube_api: Any, ns: str, store: str, stack: OperatorProcess
) -> None:
    """successfulJobsHistoryLimit / failedJobsHistoryLimit keep the newest Complete and
    Failed Jobs; older ones are deleted once their occurrences' outcomes are recorded."""
    apply(
        kube,
        ns,
        "tidy",
        "successfulJobsHistoryLimit: 1\nfailedJobsHistoryLimit: 1",
    )
    # maxAttempts 2 (SPEC): a failed Job is retried once, so an occurrence that fails has
    # two Failed Jobs. Four occurrences: Complete, Complete, Failed twice, Complete.
    seen: list[str] = []

    def next_job() -> str:
        new = eventually(
            stack,
            lambda: [n for n in job_names(kube, ns, "tidy") if n not in seen],
            f"a Job after {seen}",
            timeout=90,
        )
        seen.append(sorted(new)[0])
        return seen[-1]

    outcomes = ["Complete", "Complete", "Failed", "Failed", "Complete"]
    for outcome in outcomes:
        name = next_job()
        set_status(kube_api, ns, name, outcome)
        key = annotation(kube, ns, name, kubejob.ANNOTATION_KEY)
        if outcome == "Complete":
            eventually(stack, lambda k=key: occurrence(store, k)["state"] == "succeeded", name)
    suspend(kube, ns, "tidy")
    _, _, c1, c2, d = seen
    assert c2 == f"{c1}-2"  # the failed occurrence's retry
    # Kept: the newest Complete (d) and the newest Failed (c2); the rest deleted.
    eventually(
        stack,
        lambda: job_names(kube, ns, "tidy") == sorted([c2, d]),
        f"only {c2} and {d} left of {seen}",
        timeout=60,
    )


def test_suspend_stops_creating_jobs(
    kube: Cluster, ns: str, store: str, stack: OperatorProcess
) -> None:
    """A suspended ScheduledJob creates no Job: once the store has the suspension, no
    occurrence of it is due (every 3 s otherwise), so no Job appears in the 9 s after."""
    apply(kube, ns, "paused")
    eventually(stack, lambda: job_names(kube, ns, "paused"), "a first Job", timeout=60)
    suspend(kube, ns, "paused")

    def suspended_in_store() -> bool:
        rows = sql(
            store,
            "SELECT suspended FROM cronwell_jobs WHERE namespace = %s AND name = 'paused'",
            (ns,),
        )
        return bool(rows and rows[0]["suspended"])

    eventually(stack, suspended_in_store, "the suspension in the store", timeout=30)
    time.sleep(4)  # an occurrence claimed just before the suspension makes its Job meanwhile
    before = job_names(kube, ns, "paused")
    time.sleep(9)  # three instants of the schedule
    assert job_names(kube, ns, "paused") == before
