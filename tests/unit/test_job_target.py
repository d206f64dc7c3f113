"""The `job` target in the model: CronJob's jobTemplate shape, kept whole, with the few checks
that need no cluster, and the rule "exactly one target" covering it."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from cronwell import crdgen
from cronwell.models import ScheduledJobSpec

POD: dict[str, Any] = {
    "restartPolicy": "OnFailure",
    "containers": [{"name": "hello", "image": "busybox:1.28", "command": ["date"]}],
}
JOB: dict[str, Any] = {
    "jobTemplate": {
        "metadata": {"labels": {"team": "billing"}, "annotations": {"note": "x"}},
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 600,
            "podFailurePolicy": {
                "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
            },
            "template": {"metadata": {"labels": {"app": "hello"}}, "spec": POD},
        },
    }
}


def spec(job: Any = JOB, **extra: Any) -> ScheduledJobSpec:
    return ScheduledJobSpec.model_validate(
        {"schedule": "*/5 * * * *", "target": {"job": job, **extra}}
    )


def error(job: Any, **extra: Any) -> str:
    with pytest.raises(pydantic.ValidationError) as exc:
        spec(job, **extra)
    return str(exc.value)


def test_the_jobspec_is_kept_whole_and_round_trips() -> None:
    s = spec()
    assert s.target.kind == "job"
    assert s.target.job is not None
    assert s.target.job.job_template.spec == JOB["jobTemplate"]["spec"]
    dumped = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["target"] == {"job": JOB}
    assert ScheduledJobSpec.model_validate(dumped) == s


def test_metadata_is_optional() -> None:
    job = {"jobTemplate": {"spec": {"template": {"spec": POD}}}}
    assert spec(job).target.job is not None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"jobTemplate": {}}, "jobTemplate.spec\n  Field required"),
        ({"jobTemplate": {"spec": {}}}, "spec.template.spec is required"),
        (
            {"jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never"}}}}},
            "spec.template.spec.containers needs at least one container",
        ),
        (
            {"jobTemplate": {"spec": {"template": {"spec": {**POD, "containers": ["x"]}}}}},
            "needs at least one container",
        ),
        (
            {"jobTemplate": {"spec": {"template": {"spec": {**POD, "restartPolicy": "Always"}}}}},
            "restartPolicy must be Never or OnFailure",
        ),
        (
            {"jobTemplate": {"spec": {"template": {"spec": {"containers": POD["containers"]}}}}},
            "got None",
        ),
        (
            {
                "jobTemplate": {
                    "metadata": {"labels": {"cronwell.dev/key": "forged"}},
                    "spec": {"template": {"spec": POD}},
                }
            },
            "cronwell.dev/key: keys under cronwell.dev/ are set by cronwell",
        ),
        (
            {"jobTemplate": {"metadata": {"name": "x"}, "spec": {"template": {"spec": POD}}}},
            "metadata.name\n  Extra inputs are not permitted",
        ),
        ({"template": {"spec": POD}}, "template\n  Extra inputs are not permitted"),
        (
            {"jobTemplate": {"spec": {"ttlSecondsAfterFinished": 100, "template": {"spec": POD}}}},
            "spec.ttlSecondsAfterFinished: remove it; cronwell deletes finished Jobs itself",
        ),
    ],
)
def test_refusals_say_what_to_fix(change: dict[str, Any], expected: str) -> None:
    assert expected in error(change)


def test_exactly_one_target_counts_job() -> None:
    assert "target needs exactly one of http, handler, log or job (got log, job)" in error(
        JOB, log={}
    )
    with pytest.raises(pydantic.ValidationError, match="exactly one of http, handler, log or job"):
        ScheduledJobSpec.model_validate({"schedule": "@daily", "target": {}})


def test_the_crd_preserves_the_jobspec_and_requires_a_template() -> None:
    crd = crdgen.scheduledjob_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    target = schema["properties"]["spec"]["properties"]["target"]
    assert target["x-kubernetes-validations"][0]["rule"] == (
        "[has(self.http), has(self.handler), has(self.log), has(self.job)].filter(x, x).size() == 1"
    )
    template = target["properties"]["job"]["properties"]["jobTemplate"]
    assert template["required"] == ["spec"]
    job_spec = template["properties"]["spec"]
    assert job_spec["type"] == "object"
    assert job_spec["x-kubernetes-preserve-unknown-fields"] is True
    assert job_spec["required"] == ["template"]
    assert job_spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True
    labels = template["properties"]["metadata"]["properties"]["labels"]
    assert labels == {
        "description": "Labels of each Job.",
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
