"""The worker refuses occurrences its pool's policy does not allow, even when the job got
into the store without the webhook (`cronwell apply` straight to the database): pools per
namespace, handlers per pool, a namespace's egress annotations (synced by the operator
into the store; written here by the same store functions)."""

from __future__ import annotations

import asyncio
from typing import Any

from cronwell.store import policies
from cronwell.store.db import Database
from tests.helpers.wait import wait_for

from .helpers import make_job
from .worker_helpers import (
    FAR_FUTURE,
    http_server,
    running_worker,
    state_is,
    trigger,
)


async def _pool_policy(db: Database, pool: str, owner: str, **kw: Any) -> None:
    await policies.upsert_pool(
        db,
        pool=pool,
        owner_namespace=owner,
        namespaces=kw.get("namespaces", []),
        namespace_selector=kw.get("selector"),
        handlers=kw.get("handlers"),
    )


def _denied(w: Any, reason: str) -> float:
    v = w.worker.metrics.registry.get_sample_value(
        "cronwell_policy_denied_total", {"pool": "default", "reason": reason}
    )
    return float(v or 0)


async def test_a_workerpool_policy_refuses_other_namespaces_and_handlers(
    db: Database, db_url: str
) -> None:
    # The jobs live in namespace "default"; the pool belongs to "payments".
    await _pool_policy(db, "default", "payments", handlers=["charge"])
    await make_job(db, "log", schedule=FAR_FUTURE)
    async with running_worker(db_url, policy_refresh_seconds=0.1) as w:
        first = await trigger(db, "log")
        o = await wait_for(lambda: state_is(db, first, "dead"), 60)
        assert (o["reason"], o["attempt"]) == ("PoolNotAllowed", 1)
        assert (
            "namespace default may not use pool 'default' (allowed: payments)" in (o["last_error"])
        )
        assert "WorkerPool default in namespace payments" in o["last_error"]
        # Allowed by the selector (labels the operator syncs for the namespace): now the
        # handler rule applies.
        await policies.upsert_namespace(
            db, namespace="default", labels={"team": "pay"}, egress_allow=None, egress_deny=None
        )
        await _pool_policy(
            db, "default", "payments", selector={"matchLabels": {"team": "pay"}},
            handlers=["charge"],
        )  # fmt: skip
        await asyncio.sleep(0.3)  # the worker reuses what it read for 0.1 s: let that expire
        await make_job(db, "refund", schedule=FAR_FUTURE, target={"handler": {"name": "refund"}})
        key = await trigger(db, "refund")
        o = await wait_for(lambda: state_is(db, key, "dead"), 60)
        assert (o["reason"], o["attempt"]) == ("HandlerNotAllowed", 1)
        assert "does not serve handler 'refund' (it serves: charge)" in o["last_error"]
        key = await trigger(db, "log")  # a log target in an allowed namespace runs
        await wait_for(lambda: state_is(db, key, "succeeded"), 60)
        assert _denied(w, "PoolNotAllowed") == 1 and _denied(w, "HandlerNotAllowed") == 1


async def test_a_static_pool_policy_from_the_workers_settings(db: Database, db_url: str) -> None:
    await make_job(db, "job", schedule=FAR_FUTURE)
    async with running_worker(db_url, pool_namespaces="team-a,team-b"):
        key = await trigger(db, "job")
        o = await wait_for(lambda: state_is(db, key, "dead"), 60)
    assert o["reason"] == "PoolNotAllowed"
    assert "(allowed: team-a, team-b)" in o["last_error"]
    assert "the pool's namespaces in the chart's worker.pools" in o["last_error"]


async def test_a_namespace_egress_annotation_binds_its_jobs(db: Database, db_url: str) -> None:
    with http_server() as srv:
        await make_job(db, "call", schedule=FAR_FUTURE, target={"http": {"url": srv.url}})
        await policies.upsert_namespace(
            db, namespace="default", labels={}, egress_allow="*.example.com", egress_deny=None
        )
        async with running_worker(db_url, policy_refresh_seconds=0.1):
            key = await trigger(db, "call")
            o = await wait_for(lambda: state_is(db, key, "dead"), 60)
    assert (o["reason"], o["attempt"]) == ("EgressDenied", 1)
    assert (
        "not in namespace default's cronwell.dev/egress-allow annotation (*.example.com)"
        in (o["last_error"])
    )
    assert srv.requests == []
