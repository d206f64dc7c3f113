"""JobWatcher's bookkeeping, fed events by hand (no API server: the watch threads are not
started): outcomes by uid, deletions seen in a re-list, the bound on remembered outcomes.
tests/e2e/test_kubejob.py runs the same code against a real watch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client

from cronwell_worker.kubejob import JobClient, JobOutcome, JobRef, JobWatcher

NS = "team"


def job(name: str, uid: str, condition: str | None = None) -> dict[str, Any]:
    status = {"conditions": [{"type": condition, "status": "True", "reason": "R"}]}
    return {
        "metadata": {"namespace": NS, "name": name, "uid": uid},
        "status": status if condition else {},
    }


@pytest.fixture
async def watcher() -> Any:
    jobs = JobClient(client.ApiClient())
    w = JobWatcher(jobs, pool="p", namespaces=[NS])
    w._loop = asyncio.get_running_loop()  # what __aenter__ does, minus the watch threads
    w._synced[NS] = asyncio.Event()
    yield w
    jobs.close()


async def test_a_relist_ends_jobs_deleted_while_not_watching(watcher: JobWatcher) -> None:
    watcher._replace_all(NS, [job("a", "u1"), job("b", "u2", "Complete")])
    assert watcher._synced[NS].is_set()
    waiting = asyncio.ensure_future(watcher.wait(JobRef(NS, "a", "u1")))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert await watcher.wait(JobRef(NS, "b", "u2")) == JobOutcome("b", True, "")
    # The watch broke; "a" was deleted meanwhile: the re-list no longer has it.
    watcher._replace_all(NS, [job("b", "u2", "Complete")])
    assert await asyncio.wait_for(waiting, 10) == JobOutcome(
        "a", False, "Job was deleted before it finished"
    )


async def test_outcomes_are_by_uid(watcher: JobWatcher) -> None:
    watcher._seen(NS, job("a", "old", "Failed"), deleted=False)
    watcher._seen(NS, job("a", "old", "Failed"), deleted=True)
    # The same name, a new object: the old outcome is not its outcome.
    watcher._seen(NS, job("a", "new"), deleted=False)
    waiting = asyncio.ensure_future(watcher.wait(JobRef(NS, "a", "new")))
    await asyncio.sleep(0)
    assert not waiting.done()
    watcher._seen(NS, job("a", "new", "Complete"), deleted=False)
    assert await asyncio.wait_for(waiting, 10) == JobOutcome("a", True, "")
    assert await watcher.wait(JobRef(NS, "a", "old")) == JobOutcome("a", False, "R")


async def test_remembered_outcomes_are_bounded(watcher: JobWatcher) -> None:
    watcher.max_ended = 3
    for i in range(5):
        watcher._seen(NS, job(f"j{i}", f"u{i}", "Complete"), deleted=True)
    assert list(watcher._ended) == ["u2", "u3", "u4"]
    assert watcher._live == {}
