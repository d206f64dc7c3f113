"""Every call through cronwell.kubejson has a deadline (REQUEST_TIMEOUT_SECONDS): an API
server that accepts connections and never answers (as a frozen one does) is an error at the
deadline for each caller, not a request, its thread and the caller's lock held forever."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from kubernetes import client

from cronwell import kubejson


@pytest.fixture
def silent_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[client.ApiClient]:
    """A client of a listening socket that never answers; the deadline shortened to 0.5 s."""
    monkeypatch.setattr(kubejson, "REQUEST_TIMEOUT_SECONDS", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        yield client.ApiClient(cfg)
    finally:
        silent.close()


async def test_the_dashboards_reviews_and_listing(silent_api: client.ApiClient) -> None:
    """The token review is a ReviewUnavailable (503), the WorkerPool listing the defaults."""
    from cronwell.ui.auth import KubeAuth, ReviewUnavailable
    from cronwell.ui.workerpools import ClusterPools

    auth = KubeAuth(silent_api)
    try:
        async with asyncio.timeout(5):
            with pytest.raises(ReviewUnavailable):
                await auth.authenticate("some-token")
            assert await ClusterPools(auth.api).get() is None
    finally:
        auth.close()


async def test_the_workers_job_calls(silent_api: client.ApiClient) -> None:
    """A `job` target's create is a retryable target error the attempt's retry policy
    handles (nothing was created: `sent` false), not a handler stuck past its lease."""
    from cronwell_worker.kubejob import JobClient
    from cronwell_worker.targets import TargetError

    jobs = JobClient(silent_api)
    try:
        async with asyncio.timeout(5):
            with pytest.raises(TargetError) as caught:
                await jobs.get("team-a", "nightly")
    finally:
        jobs.close()
    assert caught.value.retryable and not caught.value.sent, repr(caught.value)


async def test_the_webhooks_dry_run(silent_api: client.ApiClient) -> None:
    """The admission webhook's dry-run create fails at the deadline (the webhook then
    answers; the API server's own webhook timeout is no longer the only bound)."""
    from cronwell_operator.kube import Kube, KubeUnavailable

    kube = Kube(silent_api)
    try:
        job = {"metadata": {"namespace": "team-a", "name": "nightly"}, "spec": {}}
        async with asyncio.timeout(5):
            with pytest.raises(KubeUnavailable):
                await kube.dry_run_job(job)
    finally:
        kube.close()
