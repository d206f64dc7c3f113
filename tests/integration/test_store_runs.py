"""store.runs: the `runs` listings that `cronwell runs` and `kubectl cronwell runs` render."""

from __future__ import annotations

from cronwell import jobs
from cronwell.store import runs
from cronwell.store.db import Database

from .helpers import make_job


async def test_runs_are_listed_by_name_or_job_uid_and_filtered_by_state(db: Database) -> None:
    job = await make_job(db, "listed", schedule="0 0 1 1 *")
    await make_job(db, "other", schedule="0 0 1 1 *")
    key, _ = await jobs.trigger_job(db, namespace="default", name="listed")
    await jobs.trigger_job(db, namespace="default", name="other")

    by_name = await runs.list_runs(db, namespace="default", name="listed", state=None, limit=10)
    assert [(r.name, r.idempotency_key, r.state, r.origin) for r in by_name] == [
        ("listed", key, "pending", "trigger")
    ]
    assert by_name[0].lag_seconds is None and by_name[0].fence is None
    assert await runs.list_for_job(db, job_id=job.id, state=None, limit=10) == by_name
    assert await runs.list_runs(db, namespace=None, name="listed", state="dead", limit=10) == []
    everything = await runs.list_runs(db, namespace=None, name=None, state=None, limit=10)
    assert {r.name for r in everything} >= {"listed", "other"}
