"""store.kube_jobs: the Job an attempt runs, recorded under its fence, shows in the job's
status facts (status.active) and in the change log; states by key decide Job deletion."""

from __future__ import annotations

from cronwell import dispatch
from cronwell.store import kube_jobs, status_changes
from cronwell.store.db import Database

from .helpers import make_job, scheduler, set_cursor
from .test_overlap import _claim


async def test_the_running_attempts_job_is_recorded_under_its_fence(db: Database) -> None:
    # an operator's status writer drains the log: changes are logged
    await status_changes.declare_writer(db, identity="op", ttl_seconds=60, after_gap=True)
    job = await make_job(db, "kj", schedule="* * * * * *", concurrencyPolicy="Allow")
    await set_cursor(db, "kj", "date_trunc('second', now()) - interval '2 s'")
    await (await scheduler(db, horizon_seconds=0.001)).materialise_until_idle()
    claimed = sorted(await _claim(db), key=lambda c: c.scheduled_for)
    assert len(claimed) >= 2
    first, second = claimed[:2]
    (before,) = await status_changes.job_status(db, [job.id])
    assert before.active_jobs is None and (before.active or 0) >= 2
    logged = len(await status_changes.read(db, limit=1000, skip=[]))

    # A stale fence records nothing; the holder's fence does, and the change is logged.
    assert not await kube_jobs.record(db, key=first.key, fence=first.fence - 1, job_name="x")
    assert await kube_jobs.record(db, key=first.key, fence=first.fence, job_name="kj-aaa")
    assert await kube_jobs.record(db, key=second.key, fence=second.fence, job_name="kj-bbb")
    assert len(await status_changes.read(db, limit=1000, skip=[])) == logged + 2
    (row,) = await status_changes.job_status(db, [job.id])
    assert row.active_jobs == ["kj-bbb", "kj-aaa"]  # newest instant first

    # Finished: no longer listed, and its outcome is recorded.
    assert await dispatch.succeed(db, [(second.id, second.fence)]) == {second.key}
    (row,) = await status_changes.job_status(db, [job.id])
    assert row.active_jobs == ["kj-aaa"]
    states = await kube_jobs.states(db, [first.key, second.key, "gone:key"])
    assert states == {first.key: "running", second.key: "succeeded"}
    # A finished occurrence records nothing more.
    assert not await kube_jobs.record(db, key=second.key, fence=second.fence, job_name="late")
