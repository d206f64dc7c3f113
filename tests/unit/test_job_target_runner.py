"""How a worker runs a `job` target, without a cluster: refused in standalone mode, and a
clear failure (never a silent success) when the worker has no way to reach the API."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from cronwell.dispatch import Claimed
from cronwell.models import ScheduledJobSpec, Target
from cronwell.sdk import Context
from cronwell_worker import targets
from cronwell_worker.kubejob import KubeJobs, load_api

TARGET = Target.model_validate(
    {
        "job": {
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "report:1"}],
                        }
                    }
                }
            }
        }
    }
)
CTX = Context(
    key="uid:2026-12-01T09:00:00Z",
    fence=1,
    scheduled_for=datetime(2026, 12, 1, 9, tzinfo=UTC),
    attempt=1,
    namespace="team",
    name="report",
)


async def test_standalone_refuses_a_job_target() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(targets.TargetError) as e:
            await targets.run(TARGET, CTX, client, 60)
    assert e.value.reason == "InvalidTarget" and not e.value.retryable and not e.value.sent
    assert "standalone mode (no cluster) cannot run it" in str(e.value)


async def test_a_job_target_runs_through_the_workers_runner() -> None:
    ran: list[tuple[object, float]] = []

    async def runner(target: object, timeout: float) -> None:
        ran.append((target, timeout))

    async with httpx.AsyncClient() as client:
        await targets.run(TARGET, CTX, client, 60, None, runner)
    assert ran == [(TARGET.job, 60)]


def test_no_service_account_and_no_kubeconfig_is_a_clear_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/missing")
    with pytest.raises(targets.TargetError) as e:
        load_api()
    assert e.value.reason == "KubernetesUnavailable" and e.value.retryable and not e.value.sent
    assert "neither an in-cluster service account nor a kubeconfig" in str(e.value)
    assert "set KUBECONFIG" in str(e.value)


def test_the_api_is_needed_only_from_the_first_job_attempt() -> None:
    made: list[int] = []

    def api() -> object:
        made.append(1)
        raise targets.TargetError("no cluster", reason="KubernetesUnavailable")

    kube = KubeJobs("default", api=api)
    kube.close()  # a worker that never ran a job target never touched the API
    assert made == []


class CountingTidy(KubeJobs):
    """KubeJobs whose tidy pass only records what it was asked (and waits to be let go)."""

    def __init__(self) -> None:
        super().__init__("default", api=lambda: None)
        self.passes: list[int] = []
        self.go = asyncio.Event()

    async def tidy(self, c: Claimed, spec: ScheduledJobSpec) -> list[tuple[str, str]]:
        self.passes.append(c.fence)
        await self.go.wait()
        return []


def claim(fence: int, job: uuid.UUID) -> Any:
    """What `recorded` reads of a claim (the ScheduledJob's uid), and a fence to tell
    claims apart."""
    return SimpleNamespace(job_id=job, fence=fence)


async def test_tidy_passes_after_outcomes_run_one_at_a_time_per_scheduledjob() -> None:
    """Outcomes recorded while a pass runs ask for one more pass (with the newest claim),
    not one each; another ScheduledJob's pass runs alongside."""
    kube = CountingTidy()
    spec = ScheduledJobSpec.model_validate(
        {"schedule": "* * * * *", "target": TARGET.model_dump(by_alias=True)}
    )
    a, b = uuid.uuid4(), uuid.uuid4()
    for fence in (1, 2, 3, 4):
        kube.recorded(claim(fence, a), spec)
        await asyncio.sleep(0)
    kube.recorded(claim(10, b), spec)
    await asyncio.sleep(0)
    assert kube.passes == [1, 10]
    kube.go.set()
    await kube.idle()
    assert kube.passes == [1, 10, 4]
    kube.close()
