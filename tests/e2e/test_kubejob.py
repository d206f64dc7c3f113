"""The job target's Kubernetes side on a real API server: racing creators make one Job per
occurrence, a failed Job's message reaches the attempt and its retry creates the next Job,
one watch answers every waiter. There is no kubelet or Job controller here: the test plays
the Job controller by patching the status subresource to Complete or Failed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from cronwell import dispatch, kubejob
from cronwell.kubejob import Occurrence
from cronwell.models import JobTemplate, ScheduledJobSpec
from cronwell.store import kube_jobs
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell_worker.kubejob import (
    JobClient,
    JobOutcome,
    JobRef,
    JobWatcher,
    KubeJobs,
    ensure_job,
    run_job,
)
from cronwell_worker.targets import TargetError
from tests.helpers.kube import set_job_status as set_status
from tests.integration.helpers import make_job, scheduler, set_cursor

WORKERS = 12
TEMPLATE = JobTemplate.model_validate(
    {
        "metadata": {"labels": {"team": "e2e"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.28"}],
                }
            },
        },
    }
)
T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)


class CountingJobClient(JobClient):
    """The real client, counting the creates the API server let through (instrumentation)."""

    created = 0
    refused = 0

    async def create(self, job: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any] | None:
        made = await super().create(job, dry_run=dry_run)
        type(self).created += made is not None
        type(self).refused += made is None
        return made


@pytest.fixture
async def workers(kube: Cluster) -> AsyncIterator[list[CountingJobClient]]:
    """WORKERS clients with connections of their own, as separate worker processes have."""
    CountingJobClient.created = CountingJobClient.refused = 0
    apis = [config.new_client_from_config(config_file=str(kube.kubeconfig)) for _ in range(WORKERS)]
    clients = [CountingJobClient(api) for api in apis]
    yield clients
    for c, api in zip(clients, apis, strict=True):
        c.close()
        api.close()


def occurrence(namespace: str, **kw: Any) -> Occurrence:
    uid = str(uuid.uuid4())
    base: dict[str, Any] = {
        "namespace": namespace,
        "scheduledjob": "nightly",
        "scheduledjob_uid": uid,
        "pool": f"pool-{uid[:8]}",
        "key": f"{uid}:{T0.isoformat()}",
        "scheduled_for": T0,
        "attempt": 1,
        "fence": 1,
    }
    return Occurrence(**(base | kw))


async def race(workers: list[CountingJobClient], occ: Occurrence) -> set[str]:
    """Every worker runs ensure_job for the occurrence at once, each with its own claim
    (attempt and fence), as a stale attempt and its successor would."""
    claims = [
        Occurrence(**{**occ.__dict__, "attempt": occ.attempt + i, "fence": occ.fence + i})
        for i in range(len(workers))
    ]
    pairs = zip(workers, claims, strict=True)
    refs = await asyncio.gather(*(ensure_job(w, TEMPLATE, c) for w, c in pairs))
    assert len({r.uid for r in refs}) == 1
    return {r.name for r in refs}


def read(kube_api: Any, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = kube_api.sanitize_for_serialization(
        client.BatchV1Api(kube_api).read_namespaced_job(name, namespace)
    )
    return job


def jobs_of(kube_api: Any, occ: Occurrence) -> list[str]:
    listed = client.BatchV1Api(kube_api).list_namespaced_job(
        occ.namespace, label_selector=occ.selector()
    )
    return sorted(j.metadata.name for j in listed.items)


async def test_racing_workers_create_one_job_and_retry_after_failure(
    kube_api: Any, namespace: str, workers: list[CountingJobClient]
) -> None:
    occ = occurrence(namespace)
    first = kubejob.job_name("nightly", occ.key, 1)

    assert await race(workers, occ) == {first}
    assert jobs_of(kube_api, occ) == [first]
    assert CountingJobClient.created == 1
    print(f"\n{WORKERS} racing workers: 1 create let through, {CountingJobClient.refused} "
          "AlreadyExists adopted")  # fmt: skip

    async with JobWatcher(
        workers[0], pool=occ.pool, namespaces=[namespace], timeout_seconds=5
    ) as watcher:
        first_ref = JobRef.of(read(kube_api, namespace, first))
        waiting = asyncio.ensure_future(watcher.wait(first_ref))
        await asyncio.sleep(0)
        assert not waiting.done()
        set_status(kube_api, namespace, first, "Failed")
        outcome = await asyncio.wait_for(waiting, 60)
        assert not outcome.succeeded
        assert outcome.message == (
            "BackoffLimitExceeded: Job has reached the specified backoff limit"
        )

        # The retry: every racer sees the failed Job and creates the second one, once.
        second = kubejob.job_name("nightly", occ.key, 2)
        assert second == f"{first}-2"
        assert await race(workers, occ) == {second}
        assert jobs_of(kube_api, occ) == [first, second]
        assert CountingJobClient.created == 2

        set_status(kube_api, namespace, second, "Complete")
        outcome = await asyncio.wait_for(
            watcher.wait(JobRef.of(read(kube_api, namespace, second))), 60
        )
        assert outcome.succeeded and outcome.name == second
        # A later waiter (a successor attempt) is answered from the watch's cache.
        again = await asyncio.wait_for(watcher.wait(first_ref), 60)
        assert not again.succeeded

        # A finished occurrence's Job is adopted, never re-created.
        assert await race(workers, occ) == {second}
        assert CountingJobClient.created == 2

    job = client.BatchV1Api(kube_api).read_namespaced_job(second, namespace)
    assert job.metadata.annotations[kubejob.ANNOTATION_KEY] == occ.key
    assert job.metadata.labels["team"] == "e2e"
    assert job.metadata.owner_references[0].uid == occ.scheduledjob_uid


async def test_deleted_jobs_end_as_they_were_and_a_reused_name_is_a_new_job(
    kube: Cluster, kube_api: Any, namespace: str, workers: list[CountingJobClient]
) -> None:
    occ = occurrence(namespace)
    ref = await ensure_job(workers[0], TEMPLATE, occ)
    async with JobWatcher(
        workers[0], pool=occ.pool, namespaces=[namespace], timeout_seconds=5
    ) as watcher:
        # Deleted while running: the attempt fails.
        waiting = asyncio.ensure_future(watcher.wait(ref))
        await asyncio.sleep(0)
        delete = ("delete", "job", ref.name, "-n", namespace, "--cascade=background")
        kube.kubectl(*delete)
        outcome = await asyncio.wait_for(waiting, 60)
        assert outcome == JobOutcome(ref.name, False, "Job was deleted before it finished")

        # No Job left: the next attempt creates one under the same name, a new object.
        again = await ensure_job(workers[1], TEMPLATE, occ)
        assert again.name == ref.name and again.uid != ref.uid
        waiting = asyncio.ensure_future(watcher.wait(again))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # the first object's outcome is not this one's
        # It completes, and is deleted at once (ttlSecondsAfterFinished: 0)...
        set_status(kube_api, namespace, again.name, "Complete")
        kube.kubectl(*delete)
        assert (await asyncio.wait_for(waiting, 60)).succeeded
        # ...and a waiter that comes after both events still learns it completed.
        assert (await asyncio.wait_for(watcher.wait(again), 60)).succeeded


async def test_a_job_of_another_owner_with_our_name_is_never_adopted(
    kube_api: Any, namespace: str, workers: list[CountingJobClient]
) -> None:
    occ = occurrence(namespace)
    name = kubejob.job_name("nightly", occ.key, 1)
    foreign = kubejob.manifest(TEMPLATE, occ, 1)
    foreign["metadata"] = {"name": name, "namespace": namespace}  # none of our labels
    assert await workers[0].create(foreign) is not None
    with pytest.raises(TargetError) as exc:
        await ensure_job(workers[1], TEMPLATE, occ)
    assert exc.value.reason == "JobNameTaken" and not exc.value.retryable
    assert f"Job {namespace}/{name} exists but is not {occ.key}'s" in str(exc.value)


async def test_a_namespace_the_worker_does_not_watch_is_refused(
    namespace: str, workers: list[CountingJobClient]
) -> None:
    async with JobWatcher(workers[0], pool="p", namespaces=[namespace], timeout_seconds=5) as w:
        with pytest.raises(TargetError, match="namespace elsewhere is not watched"):
            await w.wait(JobRef("elsewhere", "x", "uid"))


def test_racing_worker_processes_killed_with_sigkill_leave_one_job(
    kube: Cluster, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    """Racers are real processes; a seeded half of them is killed with -9 at random moments
    around their create. Whoever survives, and whoever comes after, finds the same Job."""
    rng = random.Random(20)
    occ = occurrence(namespace)
    go = tmp_path / "go"
    procs = []
    for i in range(WORKERS):
        claim = {**occ.__dict__, "attempt": 1 + i, "fence": 1 + i}
        claim["scheduled_for"] = occ.scheduled_for.isoformat()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.e2e.kubejob_racer",
                    str(kube.kubeconfig),
                    json.dumps(claim),
                    str(go),
                ],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        doomed = rng.sample(procs, WORKERS // 2)
        go.touch()
        for p in doomed:
            time.sleep(rng.uniform(0, 0.05))
            p.send_signal(signal.SIGKILL)
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            if p not in doomed:
                assert p.returncode == 0
            if p.returncode == 0:
                results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    killed = sum(p.returncode == -signal.SIGKILL for p in procs)
    print(f"\n{WORKERS} racer processes, {killed} killed by -9, {len(results)} finished")
    assert len({r["uid"] for r in results}) == 1
    [job] = jobs_of(kube_api, occ)
    assert job == kubejob.job_name("nightly", occ.key)
    # A worker that comes later (the lease's next owner) adopts it.
    later = subprocess.run(
        [sys.executable, "-m", "tests.e2e.kubejob_racer", str(kube.kubeconfig),
         json.dumps({**occ.__dict__, "attempt": 99, "fence": 99,
                     "scheduled_for": occ.scheduled_for.isoformat()}), str(go)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(later.stdout.splitlines()[-1])["uid"] == results[0]["uid"]


class SignallingWatcher(JobWatcher):
    """The real watcher, telling the test when an attempt waits (instrumentation)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.waiting: asyncio.Queue[JobRef] = asyncio.Queue()

    async def wait(self, job: JobRef) -> JobOutcome:
        self.waiting.put_nowait(job)
        return await super().wait(job)


async def test_run_job_outcomes_timeout_and_cancellation(
    kube_api: Any, namespace: str, workers: list[CountingJobClient]
) -> None:
    """Each occurrence's Job is made first by another worker (ensure_job), so run_job
    adopts it, as an attempt after a lease takeover does."""
    pool = occurrence(namespace).pool
    jobs = workers[0]
    w = SignallingWatcher(jobs, pool=pool, namespaces=[namespace], timeout_seconds=5)

    async def adopt(timeout: float = 60) -> tuple[JobRef, asyncio.Future[JobOutcome]]:
        occ = occurrence(namespace, pool=pool)
        ref = await ensure_job(workers[1], TEMPLATE, occ)
        running = asyncio.ensure_future(run_job(jobs, w, TEMPLATE, occ, timeout))
        assert await asyncio.wait_for(w.waiting.get(), 60) == ref  # adopted, waiting
        return ref, running

    async with w:
        # Complete: returns.
        ref, running = await adopt()
        set_status(kube_api, namespace, ref.name, "Complete")
        assert await asyncio.wait_for(running, 60) == JobOutcome(ref.name, True)

        # Failed: a retryable TargetError with the Job's reason and message.
        ref, running = await adopt()
        set_status(kube_api, namespace, ref.name, "Failed")
        with pytest.raises(TargetError) as exc:
            await asyncio.wait_for(running, 60)
        assert exc.value.reason == "JobFailed" and exc.value.retryable and exc.value.sent
        assert str(exc.value) == (
            f"Job {namespace}/{ref.name} failed: BackoffLimitExceeded: Job has reached the "
            "specified backoff limit"
        )

        # Cancelled (lease lost): the Job stays for the next owner to adopt.
        ref, running = await adopt()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert read(kube_api, namespace, ref.name)["metadata"].get("deletionTimestamp") is None

        # Past its timeout: the attempt deletes its Job (foreground) and fails.
        ref, running = await adopt(timeout=0.5)
        with pytest.raises(TargetError) as exc:
            await asyncio.wait_for(running, 60)
        assert exc.value.reason == "Timeout"
        assert f"Job {namespace}/{ref.name} ran past timeoutSeconds (0.5s)" in str(exc.value)
        # No garbage collector here: the foreground deletion stays pending, visibly.
        meta = read(kube_api, namespace, ref.name)["metadata"]
        assert meta["deletionTimestamp"] and "foregroundDeletion" in meta["finalizers"]


async def test_a_replaced_attempt_deletes_the_job_it_made_after_the_replacing_one_looked(
    kube: Cluster, kube_api: Any, namespace: str, db: Database
) -> None:
    """The race Replace leaves: an attempt claimed a moment before its occurrence was
    replaced creates its Job only after the replacing attempt listed the Jobs. Its fenced
    record of the Job then fails, the store says `cancelled`, and it deletes the Job
    itself (foreground), rather than leave it running next to the replacing one."""
    spec = {
        "schedule": "* * * * * *",
        "concurrencyPolicy": "Replace",
        "target": {"job": {"jobTemplate": TEMPLATE.model_dump(by_alias=True)}},
    }
    await make_job(db, "late", **spec)
    await set_cursor(db, "late", "date_trunc('second', now())")
    sched = await scheduler(db, horizon_seconds=0.001)
    await sched.materialise_until_idle()

    async def claim() -> list[dispatch.Claimed]:
        return await dispatch.claim(db, pool="default", worker_id="w", limit=10, lease_seconds=60)

    [first] = await claim()
    while not (replacing := await claim()):  # the next second's occurrence replaces it
        await asyncio.sleep(0.2)
        await sched.materialise_until_idle()
    assert (await kube_jobs.states(db, [first.key]))[first.key] == "cancelled"
    assert replacing[0].key != first.key

    def api() -> Any:
        return config.new_client_from_config(config_file=str(kube.kubeconfig))

    kube_jobs_ = KubeJobs("default", db=db, api=api, watch_timeout_seconds=5)
    parsed = ScheduledJobSpec.model_validate(spec)
    assert parsed.target.job is not None
    late = dataclasses.replace(first, namespace=namespace)
    running = asyncio.ensure_future(kube_jobs_.run(late, parsed, parsed.target.job, 120))
    name = kubejob.job_name("late", first.key)
    try:
        meta: dict[str, Any] = {}
        for _ in range(300):
            listed = client.BatchV1Api(kube_api).list_namespaced_job(
                namespace, field_selector=f"metadata.name={name}"
            )
            meta = (
                kube_api.sanitize_for_serialization(listed.items[0].metadata)
                if listed.items
                else {}
            )
            if meta.get("deletionTimestamp") or running.done():
                break
            await asyncio.sleep(0.1)
        assert not running.done(), running.exception()  # it did not time out: it deleted
        assert meta.get("deletionTimestamp"), f"{name} was not deleted: {meta}"
        assert "foregroundDeletion" in meta["finalizers"]
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError, TargetError):
            await running
        kube_jobs_.close()
