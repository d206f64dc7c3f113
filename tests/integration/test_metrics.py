"""Scheduler metrics: values follow what happened, and /metrics serves them."""

from __future__ import annotations

import asyncio
import urllib.request

from cronwell import jobs, partitions
from cronwell.embedded import free_port
from cronwell.metrics import Metrics
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store.db import Database
from tests.helpers.wait import wait_for

from .helpers import make_job, set_cursor
from .test_maintenance import _past_occurrences
from .worker_helpers import Outcome, RunningWorker, running_worker


def value(m: Metrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_scheduler_metrics_follow_materialisation(db: Database) -> None:
    await make_job(db, "a", schedule="*/10 * * * * *")
    await make_job(db, "late", schedule="* * * * *", misfirePolicy="Skip")
    await set_cursor(db, "late", "date_trunc('minute', now()) - interval '10 minutes'")
    m = Metrics()
    await partitions.set_count(db, 1)
    s = Scheduler(db, SchedulerSettings(), metrics=m)
    await s.balance()
    await s.materialise_until_idle()
    await s.report_gauges()
    assert value(m, "cronwell_occurrences_materialised_total", origin="schedule") >= 1
    assert value(m, "cronwell_occurrences_missed_total") >= 9
    assert value(m, "cronwell_materialise_batch_jobs_count") >= 1
    assert value(m, "cronwell_partitions_owned") == 1
    assert value(m, "cronwell_partition_acquisitions_total") == 1
    assert value(m, "cronwell_jobs_behind") == 0
    port = free_port()
    m.serve(port, addr="127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert "cronwell_occurrences_materialised_total" in body
    assert "cronwell_start_lag_seconds_bucket" not in body or "pool=" in body


async def test_jobs_behind_counts_an_unowned_partition(db: Database) -> None:
    await make_job(db, "stuck", schedule="* * * * *")
    await set_cursor(db, "stuck", "now() - interval '1 minute'")
    m = Metrics()
    await partitions.set_count(db, 1)
    s = Scheduler(db, SchedulerSettings(), metrics=m)
    await s.balance()
    await s.report_gauges()  # before materialising: one job behind
    assert value(m, "cronwell_jobs_behind") == 1


async def test_worker_metrics_follow_attempts(db: Database, db_url: str) -> None:
    await make_job(db, "logme", schedule="0 0 1 1 *", target={"log": {"message": "m"}})
    key, _ = await jobs.trigger_job(db, namespace="default", name="logme", trigger_id="m1")
    async with running_worker(db_url) as rw:
        await rw.outcome(key)
        m = rw.worker.metrics
        assert value(m, "cronwell_start_lag_seconds_count", pool="default") == 1
        await wait_for(lambda: _counted(m, 1), what="the outcome counted")  # batched
        assert value(m, "cronwell_occurrences_total", pool="default", outcome="dead") == 0


async def test_a_bursts_outcomes_are_counted_in_batches_and_all_counted(
    db: Database, db_url: str
) -> None:
    """The worker counts outcomes in memory and adds them to its metrics in batches (not
    one locked update per occurrence): the first outcome is not on the counter when it is
    reported, and once the burst is over every one is."""
    burst = 60
    job = await make_job(db, "many", schedule="0 0 1 1 *", concurrencyPolicy="Allow")
    async with running_worker(db_url) as rw:
        m = rw.worker.metrics
        on_counter: list[float] = []

        def report(o: Outcome) -> None:
            on_counter.append(value(m, "cronwell_occurrences_total", **SUCCEEDED))
            rw.outcomes.append(o)

        rw.worker.on_outcome = report
        await _past_occurrences(db, job.id, burst)
        await wait_for(lambda: _all(rw, burst), what="the burst run")
        assert on_counter[0] == 0  # counted in memory first
        await wait_for(lambda: _counted(m, burst), what="every outcome counted")
    assert value(m, "cronwell_occurrences_total", pool="default", outcome="dead") == 0


SUCCEEDED = {"pool": "default", "outcome": "succeeded"}


async def _all(rw: RunningWorker, n: int) -> bool:
    return len(rw.outcomes) >= n and all(o.result == "succeeded" for o in rw.outcomes)


async def _counted(m: Metrics, n: int) -> bool:
    return value(m, "cronwell_occurrences_total", **SUCCEEDED) == n
