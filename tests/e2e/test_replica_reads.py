"""What reads off a replica (store/replica.py) in a cluster, on a real API server and a real
primary + streaming standby (tests/failover/replication.py, one pair for the module): the
operator's pre-scaler forecasts from the standby (one tick at a time, nothing timed: a
burst written on the primary while the standby's replay is paused raises no replicas until
replay resumes) and writes to the primary; `kubectl cronwell runs --database-read-url`
lists what the standby has replayed."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from cronwell.jobs import apply_job, trigger_job
from cronwell.metrics import Metrics
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, clock
from cronwell.store.replica import reads_from
from cronwell.testing.controlplane import Cluster
from cronwell_operator.kube import Kube
from cronwell_operator.scaler import Scaler
from cronwell_operator.settings import OperatorSettings
from tests.e2e.test_kubectl_plugin import apply_sj, get_sj, kubectl_cronwell
from tests.e2e.test_prescale import deployment, replicas, workerpool
from tests.failover.replication import (  # noqa: F401
    Node,
    Pair,
    replayed,
    replica_pair,
    replica_primary,
)
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow]


def has_jobs(standby: Node, pool: str) -> bool:
    return replayed(standby, f"SELECT 1 FROM cronwell_jobs WHERE pool = '{pool}'")


async def test_the_forecast_reads_the_standby_and_the_scale_follows_its_replay(
    kube: Cluster, kube_api: Any, ns: str, pair: Pair, primary: Database
) -> None:
    deployment(kube_api, ns, "rr-workers", 1)
    workerpool(
        kube, ns, "rr", "rr-workers",
        concurrencyPerReplica=1, startSLOSeconds=1, defaultDurationSeconds=1,
        leadTimeSeconds=600, minReplicas=1, maxReplicas=10,
    )  # fmt: skip
    kube_client = Kube(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    standby = pair.h2
    # A job of another pool marks how far the standby has replayed.
    await burst(primary, "other", 1)
    await wait_for(lambda: asyncio.to_thread(has_jobs, standby, "other"), 60, "the migration")
    standby.sql("SELECT pg_wal_replay_pause()")
    try:
        await burst(primary, "rr", 6)  # on the primary only, for now
        async with reads_from(primary, standby.url, max_lag_seconds=3600):
            settings = OperatorSettings.from_flat({"namespaces": [ns]})
            scaler = Scaler(primary, kube_client, settings, Metrics())
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


async def test_kubectl_cronwell_runs_reads_the_standby(
    kube: Cluster, ns: str, pair: Pair, primary: Database
) -> None:
    uid = apply_sj(kube, ns, "rr-plugin")  # no operator here: the test writes the store
    spec = ScheduledJobSpec.model_validate(get_sj(kube, ns, "rr-plugin")["spec"])
    await apply_job(primary, namespace=ns, name="rr-plugin", spec=spec, uid=uid)
    await trigger_job(primary, namespace=ns, name="rr-plugin", trigger_id="one")
    standby = pair.h2
    await wait_for(lambda: asyncio.to_thread(has_job, standby, uid), 60, "the replay")
    standby.sql("SELECT pg_wal_replay_pause()")
    try:
        await trigger_job(primary, namespace=ns, name="rr-plugin", trigger_id="two")

        def keys() -> list[str]:
            r = kubectl_cronwell(
                kube, Path(kube.kubeconfig), "--database-read-url", standby.url,
                "runs", "rr-plugin", "-n", ns, "--json", db=pair.h1.url,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            return sorted(json.loads(line)["idempotency_key"] for line in r.stdout.splitlines())

        assert keys() == [f"{uid}:trigger:one"]  # the standby replayed only the first
        standby.sql("SELECT pg_wal_replay_resume()")
        await wait_for(
            lambda: asyncio.to_thread(lambda: len(keys()) == 2), 60, "the second run replayed"
        )
    finally:
        standby.sql("SELECT pg_wal_replay_resume()")


def has_job(standby: Node, uid: str) -> bool:
    return bool(standby.sql(f"SELECT 1 FROM cronwell_occurrences WHERE job_id = '{uid}'"))


async def burst(db: Database, pool: str, n: int) -> None:
    """n one-shot jobs of `pool` due together two minutes ahead (the database's clock)."""
    at = (await clock.now(db) + timedelta(minutes=2)).replace(microsecond=0)
    spec = ScheduledJobSpec.model_validate(
        {"runAt": at.isoformat(), "pool": pool, "target": {"log": {"message": "x"}}}
    )
    for i in range(n):
        await apply_job(db, namespace="jobs", name=f"{pool}-{i}", spec=spec)
