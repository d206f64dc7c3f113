"""The forecast view in a cluster (`UiConfig.kube`, as `cronwell ui --auth kubernetes` sets
it) plans each pool with its WorkerPool's settings, as the operator's pre-scaler does, read
from a real API server; query settings override them; a pool without a WorkerPool keeps
the defaults."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell.ui.app import UiConfig, make_app
from tests.e2e.test_prescale import workerpool
from tests.integration.helpers import make_job


async def test_forecast_plans_each_pool_with_its_workerpool(
    kube: Cluster, kube_api: Any, ns: str, store: str
) -> None:
    pool, bare = f"wp-{uuid.uuid4().hex[:8]}", f"bare-{uuid.uuid4().hex[:8]}"
    # 12 jobs due at every :00 in each pool, 1 s each (the default): with a 1 s SLO they need
    # 6 slots, so 3 replicas of 2 (the WorkerPool); with the defaults (64 per replica) one.
    workerpool(
        kube,
        ns,
        pool,
        "w-forecast",
        startSLOSeconds=1,
        concurrencyPerReplica=2,
        minReplicas=1,
        maxReplicas=10,
    )
    async with Database(store) as db:
        for p in (pool, bare):
            for i in range(12):
                await make_job(db, f"{p}-{i}", schedule="* * * * *", pool=p)
        client = TestClient(TestServer(make_app(UiConfig(db=db, kube=kube_api))))
        await client.start_server()
        try:
            data = await (await client.get("/forecast.json")).json()
            assert data["settings_from"] == "cluster"
            by_pool = {p["pool"]: p for p in data["pools"]}
            planned = by_pool[pool]
            assert planned["settings"]["concurrencyPerReplica"] == 2
            assert planned["next_burst"]["size"] == 12 and planned["next_burst"]["replicas"] == 3
            assert max(planned["replicas"]) == 3
            assert by_pool[bare]["settings"] is None
            assert max(by_pool[bare]["replicas"]) == 1  # 12 fit one replica of 64
            html = await (await client.get("/forecast")).text()
            assert "each pool's WorkerPool in the cluster" in html
            assert "its WorkerPool: SLO 1.0 s, 2 per replica, 1 to 10 replicas" in html

            # Settings in the query plan every pool with them, WorkerPool or not.
            query = {"concurrency_per_replica": "64"}
            data = await (await client.get("/forecast.json", params=query)).json()
            assert data["settings_from"] == "query"
            by_pool = {p["pool"]: p for p in data["pools"]}
            assert by_pool[pool]["settings"] is None
            assert max(by_pool[pool]["replicas"]) == 1
        finally:
            await client.close()


async def test_without_a_cluster_the_forecast_says_it_plans_with_defaults(
    store: str,
) -> None:
    async with Database(store) as db:
        await make_job(db, "lonely", schedule="* * * * *", pool="lonely")
        client = TestClient(TestServer(make_app(UiConfig(db=db))))
        await client.start_server()
        try:
            data = await (await client.get("/forecast.json")).json()
            assert data["settings_from"] == "defaults"
            assert all(p["settings"] is None for p in data["pools"])
            html = await (await client.get("/forecast")).text()
            assert "this dashboard has no cluster to read the WorkerPools from" in html
        finally:
            await client.close()
