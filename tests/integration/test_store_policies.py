"""The store functions the operator's tenancy sync and `cronwell status` use that no other
test reaches end to end: policy and secret writes read back, counts by state."""

from __future__ import annotations

from cronwell.store import gauges, job_secrets, policies
from cronwell.store.db import Database

from .helpers import make_job
from .worker_helpers import FAR_FUTURE, trigger


async def test_policies_round_trip_and_delete(db: Database) -> None:
    await policies.upsert_namespace(
        db, namespace="team-a", labels={"team": "a"}, egress_allow="*.a.example", egress_deny=None
    )
    await policies.upsert_pool(
        db, pool="p", owner_namespace="team-a", namespaces=["team-b"],
        namespace_selector={"matchLabels": {"team": "a"}}, handlers=None,
    )  # fmt: skip
    assert await policies.list_namespaces(db) == [
        policies.NamespacePolicy("team-a", {"team": "a"}, "*.a.example", None)
    ]
    assert await policies.list_pool(db, pool="p") == [
        policies.PoolPolicyRow("p", "team-a", ["team-b"], {"matchLabels": {"team": "a"}}, None)
    ]
    assert await policies.list_pool_keys(db) == [policies.PoolKey("p", "team-a")]
    await policies.delete_namespace(db, namespace="team-a")
    await policies.delete_pool(db, pool="p", owner_namespace="team-a")
    assert await policies.list_namespaces(db) == []
    assert await policies.list_pool_keys(db) == []


async def test_job_secret_writes_only_on_change(db: Database) -> None:
    job = await make_job(db, "api", schedule=FAR_FUTURE)
    assert await job_secrets.ciphertext(db, job_id=job.id) is None
    assert await job_secrets.upsert(db, job_id=job.id, ciphertext="c1", digest="d1") is True
    assert await job_secrets.upsert(db, job_id=job.id, ciphertext="c1", digest="d1") is False
    assert await job_secrets.upsert(db, job_id=job.id, ciphertext="c2", digest="d2") is True
    assert await job_secrets.ciphertext(db, job_id=job.id) == "c2"
    await job_secrets.delete(db, job_id=job.id)
    assert await job_secrets.ciphertext(db, job_id=job.id) is None


async def test_occurrence_counts_by_state(db: Database) -> None:
    assert await gauges.occurrence_counts(db) == []
    await make_job(db, "once", schedule=FAR_FUTURE)
    await trigger(db, "once")
    await trigger(db, "once")
    assert await gauges.occurrence_counts(db) == [gauges.StateCount("pending", 2)]
