"""The operator's pre-scaler with a read replica (store/replica.py): its forecast reads the
standby, its writes go to the primary. On a real API server and a real primary + streaming
standby (tests/failover/replication.py), one pre-scale tick at a time, so nothing is
timed: a burst written on the primary while the standby's replay is paused raises no
replicas until replay resumes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from kubernetes import config

from cronwell.jobs import apply_job
from cronwell.metrics import Metrics
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, clock, migrate
from cronwell.store.replica import ReadDatabase
from cronwell.testing.controlplane import Cluster
from cronwell_operator.kube import Kube
from cronwell_operator.scaler import Scaler
from cronwell_operator.settings import OperatorSettings
from tests.e2e.test_prescale import deployment, replicas, workerpool
from tests.failover.replication import Node, Pair
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(tmp_path_factory.mktemp("replica"), synchronous=False)
    yield p
    p.close()


def has_jobs(standby: Node, pool: str) -> bool:
    try:
        return bool(standby.sql(f"SELECT 1 FROM cronwell_jobs WHERE pool = '{pool}'"))
    except psycopg.errors.UndefinedTable:  # the migration is not replayed yet
        return False


async def test_the_forecast_reads_the_standby_and_the_scale_follows_its_replay(
    kube: Cluster, kube_api: Any, ns: str, pair: Pair
) -> None:
    deployment(kube_api, ns, "rr-workers", 1)
    workerpool(
        kube, ns, "rr", "rr-workers",
        concurrencyPerReplica=1, startSLOSeconds=1, defaultDurationSeconds=1,
        leadTimeSeconds=600, minReplicas=1, maxReplicas=10,
    )  # fmt: skip
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    kube_client = Kube(api)
    standby = pair.h2
    try:
        async with Database(pair.h1.url, max_size=4) as db:
            await migrate(db, partitions=4)
            # A job of another pool marks how far the standby has replayed.
            await burst(db, "other", 1)
            await wait_for(
                lambda: asyncio.to_thread(has_jobs, standby, "other"), 60, "the migration"
            )
            standby.sql("SELECT pg_wal_replay_pause()")
            await burst(db, "rr", 6)  # on the primary only, for now
            async with ReadDatabase(standby.url, db, max_lag_seconds=3600) as db.reads:
                settings = OperatorSettings.from_flat({"namespaces": [ns]})
                scaler = Scaler(db, kube_client, settings, Metrics())
                await scaler.tick()
                assert replicas(kube_api, ns, "rr-workers") == 1  # the standby has no burst
                standby.sql("SELECT pg_wal_replay_resume()")
                await wait_for(lambda: asyncio.to_thread(has_jobs, standby, "rr"), 60, "the replay")
                await scaler.tick()
                assert replicas(kube_api, ns, "rr-workers") > 1
        # Its history is written on the primary.
        assert pair.h1.sql("SELECT count(*) FROM cronwell_prescales WHERE workerpool = 'rr'")[0][0]
    finally:
        standby.sql("SELECT pg_wal_replay_resume()")
        kube_client.close()


async def burst(db: Database, pool: str, n: int) -> None:
    """n one-shot jobs of `pool` due together two minutes ahead (the database's clock)."""
    at = (await clock.now(db) + timedelta(minutes=2)).replace(microsecond=0)
    spec = ScheduledJobSpec.model_validate(
        {"runAt": at.isoformat(), "pool": pool, "target": {"log": {"message": "x"}}}
    )
    for i in range(n):
        await apply_job(db, namespace="jobs", name=f"{pool}-{i}", spec=spec)
