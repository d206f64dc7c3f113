"""The `job` target against a real API server: the CRD keeps a JobSpec whole, and the checks
the model makes without a cluster agree with the API server's own validation of the Job
(server-side dry-run, fieldValidation=Strict: the webhook's future check,
docs/design/job-target.md). Also: a converted CronJob applies."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest

from cronwell import convert, kubejob
from cronwell.models import JobTemplate
from cronwell.testing.controlplane import Cluster, KubectlError
from cronwell_worker.kubejob import JobClient
from cronwell_worker.targets import TargetError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "cronjobs"

JOB_SPEC: dict[str, Any] = {
    "backoffLimit": 2,
    "podFailurePolicy": {
        "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    },
    "template": {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.28", "command": ["date"]}],
        }
    },
}


def sj(name: str, job_spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "cronwell.dev/v1alpha1",
            "kind": "ScheduledJob",
            "metadata": {"name": name},
            "spec": {
                "schedule": "@daily",
                "target": {"job": {"jobTemplate": {"spec": job_spec}}},
            },
        }
    )


def test_the_crd_keeps_the_jobspec_whole(kube: Cluster, ns: str) -> None:
    spec = copy.deepcopy(JOB_SPEC)
    spec["someFutureField"] = {"kept": True}  # a field this cronwell does not know
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("whole", spec))
    stored = json.loads(kube.kubectl("get", "sj", "whole", "-n", ns, "-o", "json").stdout)
    assert stored["spec"]["target"]["job"]["jobTemplate"]["spec"] == spec


def test_the_crd_refuses_a_jobtemplate_without_a_template(kube: Cluster, ns: str) -> None:
    with pytest.raises(KubectlError) as exc:
        kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("no-template", {"backoffLimit": 1}))
    assert "spec.target.job.jobTemplate.spec.template: Required value" in exc.value.stderr


def test_the_crd_refuses_ttl_seconds_after_finished(kube: Cluster, ns: str) -> None:
    with pytest.raises(KubectlError) as exc:
        spec = JOB_SPEC | {"ttlSecondsAfterFinished": 60}
        kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("ttl", spec))
    assert "spec.target.job.jobTemplate.spec: Invalid value" in exc.value.stderr
    assert "ttlSecondsAfterFinished: remove it; cronwell deletes finished Jobs" in (
        exc.value.stderr
    )


def dry_run(kube_api: Any, namespace: str, job_spec: dict[str, Any]) -> None:
    """The Job the worker would create for this template, validated by the API server with
    the worker's own call (dryRun=All, fieldValidation=Strict)."""
    template = JobTemplate.model_construct(
        metadata=JobTemplate.model_fields["metadata"].get_default(call_default_factory=True),
        spec=job_spec,
    )
    occ = kubejob.Occurrence(
        namespace=namespace,
        scheduledjob="dry",
        scheduledjob_uid="0b8f6c1e-3f0c-4b8e-9a53-0d6a1a1f2c3d",
        pool="default",
        key="0b8f6c1e-3f0c-4b8e-9a53-0d6a1a1f2c3d:2026-12-01T09:00:00+00:00",
        scheduled_for=datetime(2026, 12, 1, 9, tzinfo=UTC),
        attempt=1,
        fence=1,
    )
    jobs = JobClient(kube_api)
    try:
        created = asyncio.run(jobs.create(kubejob.manifest(template, occ, 1), dry_run=True))
        assert created is not None and created["metadata"]["name"] == "dry-jbbpl4zn6h"
    finally:
        jobs.close()


def test_the_api_server_accepts_the_job_the_worker_builds(kube_api: Any, namespace: str) -> None:
    JobTemplate.model_validate({"spec": JOB_SPEC})
    dry_run(kube_api, namespace, JOB_SPEC)


def _pod(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(JOB_SPEC)
    spec["template"]["spec"].update(changes)
    return {k: v for k, v in spec.items() if v is not None}


@pytest.mark.parametrize(
    ("job_spec", "model_says", "server_says"),
    [
        (_pod(restartPolicy="Always"), "restartPolicy must be Never or OnFailure", "restartPolicy"),
        (
            _pod(restartPolicy=None) | {},
            "restartPolicy must be Never or OnFailure",
            "restartPolicy",
        ),
        (_pod(containers=[]), "needs at least one container", "containers: Required value"),
    ],
)
def test_the_models_checks_agree_with_the_api_server(
    kube_api: Any, namespace: str, job_spec: dict[str, Any], model_says: str, server_says: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=model_says):
        JobTemplate.model_validate({"spec": job_spec})
    with pytest.raises(TargetError) as exc:
        dry_run(kube_api, namespace, job_spec)
    assert exc.value.reason == "InvalidTarget" and not exc.value.retryable
    assert server_says in str(exc.value)


def test_what_only_the_api_server_knows_is_refused_by_the_dry_run(
    kube_api: Any, namespace: str
) -> None:
    """The model cannot see these; the webhook's dry-run (and the worker's create) will."""
    typo = copy.deepcopy(JOB_SPEC) | {"backOffLimit": 3}
    JobTemplate.model_validate({"spec": typo})
    with pytest.raises(TargetError) as exc:
        dry_run(kube_api, namespace, typo)
    assert 'unknown field "spec.backOffLimit"' in str(exc.value)

    same_names = _pod(
        containers=[{"name": "a", "image": "busybox"}, {"name": "a", "image": "busybox"}]
    )
    JobTemplate.model_validate({"spec": same_names})
    with pytest.raises(TargetError) as exc:
        dry_run(kube_api, namespace, same_names)
    assert "Duplicate value" in str(exc.value)


def test_converted_cronjobs_apply(kube: Cluster, ns: str) -> None:
    done, errors = convert.convert_stream(
        (FIXTURES / "kubectl-get-all-namespaces.yaml").read_text(), "list"
    )
    assert errors == []
    docs = [{**c.document, "metadata": {**c.document["metadata"], "namespace": ns}} for c in done]
    out = kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                             "items": docs})).stdout  # fmt: skip
    assert out.split() == [
        "scheduledjob.cronwell.dev/report",
        "created",
        "scheduledjob.cronwell.dev/cleanup-tmp",
        "created",
    ]
    report = json.loads(kube.kubectl("get", "sj", "report", "-n", ns, "-o", "json").stdout)
    assert report["spec"]["target"] == done[0].document["spec"]["target"]
    assert report["spec"]["concurrencyPolicy"] == "Skip"
