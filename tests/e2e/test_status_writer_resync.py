"""The store logs status changes only while a status writer is declared (migration 0014),
so a writer that starts (or renews its declaration) after changes went unlogged resyncs:
the CRs still show the right status. With the real API server, store and operator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cronwell import dispatch, jobs
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import OperatorProcess, sql
from tests.e2e.test_status_failures_first import finish, setup, statuses
from tests.helpers.kube import (  # fixtures: a namespace and a database per test
    namespace_per_test,  # noqa: F401
    operator_args,
    store_per_test,  # noqa: F401
)
from tests.helpers.wait import eventually


def apply(kube: Cluster, ns: str, name: str) -> str:
    manifest = (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        'spec: {schedule: "0 0 1 1 *", target: {log: {message: x}}}\n'
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return str(statuses(kube, ns, "uid")[name])


def status(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    out = json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout)
    return dict(out.get("status") or {})


def count(store: str, query: str, *args: Any) -> int:
    return int(sql(store, query, args or None)[0]["n"])


async def run_once(store: str, ns: str, name: str) -> None:
    """One run of the job, triggered, claimed and completed through the store."""
    async with Database(store) as db:
        await jobs.trigger_job(db, namespace=ns, name=name)
        claimed = await dispatch.claim(
            db, pool="default", worker_id="w", limit=10, lease_seconds=60
        )
        assert len(claimed) == 1
        assert await dispatch.succeed(db, [(claimed[0].id, claimed[0].fence)])


def test_an_operator_started_after_unlogged_runs_shows_them(
    kube: Cluster, ns: str, store: str, tmp_path: Path
) -> None:
    op = OperatorProcess(kube.kubeconfig, store, tmp_path / "operator.log", args=operator_args(ns))
    try:
        op.start().wait_ready(120)
        uid = apply(kube, ns, "quiet")
        eventually(op, lambda: status(kube, ns, "quiet").get("conditions"), "a first status")
        assert not status(kube, ns, "quiet").get("lastResult")
        op.stop()
        # Stopped cleanly: its declaration is withdrawn, so nothing more is logged...
        live = "SELECT count(*) AS n FROM cronwell_status_writers WHERE expires_at > now()"
        assert count(store, live) == 0
        logged = "SELECT count(*) AS n FROM cronwell_status_changes WHERE job_id = %s"
        before = count(store, logged, uid)
        asyncio.run(run_once(store, ns, "quiet"))
        assert count(store, logged, uid) == before
        # ...and the operator, back, still shows the run: it resyncs every CR at start.
        op.start().wait_ready(120)
        st = eventually(
            op,
            lambda: (s := status(kube, ns, "quiet")).get("lastResult") == "Succeeded" and s,
            "the run made while no operator was up, in status",
        )
        assert st["counters"]["succeeded"] == 1
        assert count(store, live) == 1
    finally:
        op.stop()


async def test_a_renewal_after_the_declaration_expired_resyncs(
    kube: Cluster, ns: str, store: str
) -> None:
    async with Database(store) as db:
        # a declaration of 3 s, then no renewal for longer
        writer, uids = await setup(db, kube, ns, ["lapsed"], status_declaration_seconds=3)
        await writer.pass_once()
        assert statuses(kube, ns)["lapsed"] and "lastResult" not in statuses(kube, ns)["lapsed"]
        await asyncio.sleep(4)  # the declaration expires (a renewal that came too late)
        await finish(db, uids["lapsed"], "succeeded")
        async with db.connection() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM cronwell_status_changes")
            assert (await cur.fetchone())["n"] == 0  # type: ignore[index]  # not logged
        await writer.declare()
        await writer.pass_once()
    assert statuses(kube, ns)["lapsed"]["lastResult"] == "Succeeded"
