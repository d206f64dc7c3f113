"""Status write-back puts failures first: a dead letter logged behind a backlog of
successes is on its CR before them, and so is one logged while a pass is writing them. And
with a backlog, a job still running is written after the finished ones (once, not twice),
and one whose run has just begun waits for its end, but not for long.

The writer runs in this process against the real API server and store, slowed to one
request per 4 s (`--status-qps 0.25 --status-burst 1 --status-concurrency 1`): which CRs
show a status when the failing one does tells the order of the writes (the next write is
seconds away), not a timing assertion."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from cronwell import jobs
from cronwell.kubejson import api_client
from cronwell.models import ScheduledJobSpec
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell_operator.kube import CRef, Kube
from cronwell_operator.settings import OperatorSettings
from cronwell_operator.status import StatusWriter

SPEC = {"schedule": "0 0 1 1 *", "target": {"log": {"message": "x"}}}


def create(kube: Cluster, ns: str, names: list[str]) -> dict[str, str]:
    """CRs named `names` (no status yet) -> their uids."""
    manifest = "".join(
        f"---\napiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {n}}}\n"
        f"spec: {json.dumps(SPEC)}\n"
        for n in names
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return {n: uid for n, uid in statuses(kube, ns, "uid").items() if n in names}


def statuses(kube: Cluster, ns: str, what: str = "status") -> dict[str, Any]:
    out = json.loads(kube.kubectl("get", "sj", "-n", ns, "-o", "json").stdout)
    if what == "uid":
        return {o["metadata"]["name"]: o["metadata"]["uid"] for o in out["items"]}
    return {o["metadata"]["name"]: o.get("status") or {} for o in out["items"]}


async def finish(db: Database, job_id: str, state: str) -> None:
    """One occurrence of the job in `state`, finished unless running (the store's triggers
    log the change)."""
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt,"
            " started_at, finished_at, last_error) SELECT %(k)s, %(j)s, 'default', t, t,"
            " %(s)s, 'Skip', 'AtLeastOnce', 1, 60, 1, t,"
            " CASE WHEN %(s)s = 'running' THEN NULL ELSE t END, %(e)s"
            " FROM (SELECT now() - interval '1 minute' AS t) x",
            {"k": f"{job_id}:{uuid.uuid4()}", "j": job_id, "s": state,
             "e": "boom" if state == "dead" else None},
        )  # fmt: skip


async def setup(
    db: Database, kube: Cluster, ns: str, names: list[str], **flat: Any
) -> tuple[StatusWriter, dict[str, str]]:
    uids = create(kube, ns, names)
    for n in names:
        await jobs.apply_job(
            db, namespace=ns, name=n, spec=ScheduledJobSpec.model_validate(SPEC), uid=uids[n]
        )
    async with db.connection() as conn:
        await conn.execute("DELETE FROM cronwell_status_changes")
    settings = OperatorSettings.from_flat(
        {"status_qps": 0.25, "status_burst": 1, "status_concurrency": 1, **flat}
    )
    writer = StatusWriter(db, Kube(api_client(str(kube.kubeconfig))), settings)
    for n in names:
        writer.seen(CRef(uids[n], ns, n), {})  # the CRs show no status: no GET needed
    await writer.declare()  # the store logs the changes that follow
    return writer, uids


async def written_when(kube: Cluster, ns: str, failing: str, task: asyncio.Task[Any]) -> set[str]:
    """The CRs that show a status once `failing` does."""
    while True:
        assert not task.done(), "the pass ended before the failure was written"
        shown = {n for n, st in statuses(kube, ns).items() if st}
        if failing in shown:
            return shown - {failing}
        await asyncio.sleep(0.2)


async def test_a_failure_behind_a_backlog_of_successes_is_written_first(
    kube: Cluster, ns: str, store: str
) -> None:
    names = [f"ok-{i}" for i in range(8)] + ["failing"]
    async with Database(store) as db:
        writer, uids = await setup(db, kube, ns, names)
        for n in names[:-1]:
            await finish(db, uids[n], "succeeded")
        await finish(db, uids["failing"], "dead")  # logged last
        task = asyncio.create_task(writer.pass_once())
        try:
            before = await written_when(kube, ns, "failing", task)
        finally:
            task.cancel()
    assert before == set()
    st = statuses(kube, ns)["failing"]
    assert st["lastResult"] == "Dead"  # the failure, not a success, is what it shows


async def test_a_failure_logged_during_a_pass_jumps_the_queue(
    kube: Cluster, ns: str, store: str
) -> None:
    names = [f"late-ok-{i}" for i in range(6)]
    async with Database(store) as db:
        writer, uids = await setup(db, kube, ns, names)
        for n in names:
            await finish(db, uids[n], "succeeded")
        task = asyncio.create_task(writer.pass_once())
        try:
            while not {n for n, st in statuses(kube, ns).items() if st and n in names}:
                assert not task.done()
                await asyncio.sleep(0.2)
            # The pass writes jobs in uid order: fail the one it would write last.
            failing = max(names, key=lambda n: uids[n])
            await finish(db, uids[failing], "dead")
            before = await written_when(kube, ns, failing, task)
        finally:
            task.cancel()
    before &= set(names)
    # the one written when the failure was logged, and at most the one under way then;
    # without the jump, all five others would come first
    assert len(before) <= 2, before


async def test_with_a_backlog_a_running_job_is_written_after_the_finished_ones(
    kube: Cluster, ns: str, store: str
) -> None:
    names = [f"busy-{i}" for i in range(5)]
    async with Database(store) as db:
        writer, uids = await setup(db, kube, ns, names)
        # The pass writes jobs in uid order: the running one is the one it would write first.
        running = min(names, key=lambda n: uids[n])
        await finish(db, uids[running], "running")
        for n in names:
            if n != running:
                await finish(db, uids[n], "succeeded")
        task = asyncio.create_task(writer.pass_once())
        order: list[str] = []  # CRs in the order their status appeared (writes are 4 s apart)
        while len(order) < len(names):
            done = task.done()
            shown = statuses(kube, ns)
            order += sorted(n for n in names if shown.get(n) and n not in order)
            if done:
                break
            await asyncio.sleep(0.2)
        await task
    assert order[-1] == running, order
    shown = statuses(kube, ns)[running]
    assert shown["lastScheduleTime"] and "lastSuccessfulTime" not in shown  # it shows the run


async def running_job(db: Database, kube: Cluster, ns: str, name: str) -> tuple[StatusWriter, str]:
    """A writer and one CR whose job has a run that has just begun (logged now); its uid."""
    writer, uids = await setup(db, kube, ns, [name])
    await finish(db, uids[name], "running")
    return writer, uids[name]


async def test_a_run_that_just_began_is_written_once_when_it_has_ended_not_twice(
    kube: Cluster, ns: str, store: str
) -> None:
    async with Database(store) as db:
        writer, uid = await running_job(db, kube, ns, "fresh")
        await writer.pass_once()
        assert writer.stats.patches == 0 and not statuses(kube, ns)["fresh"]
        async with db.connection() as conn:  # its change stays in the log for a later pass
            cur = await conn.execute("SELECT count(*) AS n FROM cronwell_status_changes")
            assert (await cur.fetchone())["n"] == 1  # type: ignore[index]
            await conn.execute(
                "UPDATE cronwell_occurrences SET state = 'succeeded', finished_at = now()"
                " WHERE job_id = %s",
                (uid,),
            )
        await writer.pass_once()
    assert writer.stats.patches == 1
    assert statuses(kube, ns)["fresh"]["lastSuccessfulTime"]


async def test_a_run_that_began_seconds_ago_is_written_as_running(
    kube: Cluster, ns: str, store: str
) -> None:
    async with Database(store) as db:
        writer, _ = await running_job(db, kube, ns, "slow")
        async with db.connection() as conn:  # logged SETTLE_SECONDS and more ago
            await conn.execute(
                "UPDATE cronwell_status_changes SET changed_at = now() - interval '10 seconds'"
            )
        await writer.pass_once()
    assert writer.stats.patches == 1
    shown = statuses(kube, ns)["slow"]
    assert shown["lastScheduleTime"] and "lastSuccessfulTime" not in shown
