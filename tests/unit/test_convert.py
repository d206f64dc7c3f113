"""CronJob YAML → ScheduledJob YAML (cronwell.convert), on CronJobs from the Kubernetes
documentation (re-typed under tests/fixtures/cronjobs) and on what kubectl prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell import convert
from cronwell.loader import load
from cronwell.models import ScheduledJob

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cronjobs"


def fixture(name: str) -> tuple[list[convert.Converted], list[str]]:
    path = FIXTURES / name
    done, errors = convert.convert_stream(path.read_text(), str(path.name))
    return done, [str(e) for e in errors]


def only_warning(warnings: list[str], prefix: str) -> str:
    found = [w for w in warnings if w.startswith(prefix)]
    assert len(found) == 1, (prefix, warnings)
    return found[0]


def test_the_documentation_hello_cronjob() -> None:
    done, errors = fixture("hello.yaml")
    assert errors == []
    [hello] = done
    assert hello.source == "hello.yaml (CronJob hello)"
    assert hello.document == {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "ScheduledJob",
        "metadata": {"name": "hello"},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Allow",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 1,
            "retry": {"maxAttempts": 1},
            "timeoutSeconds": 604800,
            "target": {
                "job": {
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "hello",
                                            "image": "busybox:1.28",
                                            "imagePullPolicy": "IfNotPresent",
                                            "command": [
                                                "/bin/sh",
                                                "-c",
                                                "date; echo Hello from the Kubernetes cluster",
                                            ],
                                        }
                                    ],
                                    "restartPolicy": "OnFailure",
                                }
                            }
                        }
                    }
                }
            },
        },
    }
    assert sorted(w.split(":")[0] for w in hello.warnings) == [
        "spec.timeZone",
        "spec.timeoutSeconds",
    ]
    assert "kube-controller-manager's local zone" in hello.warnings[0]


def test_kubectl_get_all_namespaces_list() -> None:
    done, errors = fixture("kubectl-get-all-namespaces.yaml")
    assert errors == []
    report, cleanup = done
    assert report.source == "kubectl-get-all-namespaces.yaml.items[0] (CronJob report)"
    assert report.document["metadata"] == {
        "name": "report",
        "namespace": "billing",
        "labels": {"app": "report"},
        "annotations": {"owner": "billing-team"},
    }
    spec = report.document["spec"]
    assert {k: v for k, v in spec.items() if k != "target"} == {
        "schedule": "30 2 * * 1-5",
        "timeZone": "Europe/Paris",
        "concurrencyPolicy": "Skip",  # Forbid
        "startingDeadlineSeconds": 200,
        "suspend": False,
        "successfulJobsHistoryLimit": 10,
        "failedJobsHistoryLimit": 5,
        "retry": {"maxAttempts": 1},
        "timeoutSeconds": 1800 + 300,
    }
    template = spec["target"]["job"]["jobTemplate"]
    assert template["metadata"] == {"labels": {"app": "report"}}
    assert "metadata" not in template["spec"]["template"]  # creationTimestamp: null only
    # The JobSpec's API-server defaults are carried as they are.
    assert template["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    assert template["spec"]["backoffLimit"] == 2
    assert report.warnings == [
        "metadata.annotations: kubectl.kubernetes.io/last-applied-configuration left out "
        "(kubectl writes it anew)"
    ]

    assert cleanup.document["metadata"] == {"name": "cleanup-tmp", "namespace": "ops"}
    assert cleanup.document["spec"]["concurrencyPolicy"] == "Replace"
    assert cleanup.document["spec"]["suspend"] is True
    assert "renamed 'cleanup.tmp' to 'cleanup-tmp'" in only_warning(
        cleanup.warnings, "metadata.name"
    )


def test_a_stream_with_a_zone_in_the_schedule_and_a_configmap() -> None:
    done, errors = fixture("stream.yaml")
    assert errors == [
        "stream.yaml#3: ConfigMap settings is not a CronJob (apiVersion batch/v1): left out of "
        "the output"
    ]
    tz, bounded = done
    assert tz.source == "stream.yaml#1 (CronJob tz-in-schedule)"
    assert tz.document["spec"]["schedule"] == "0 9 * * *"
    assert tz.document["spec"]["timeZone"] == "America/New_York"
    assert tz.warnings[0] == "spec.schedule: CRON_TZ=America/New_York moved to spec.timeZone"

    spec = bounded.document["spec"]
    assert spec["startingDeadlineSeconds"] == 1
    assert "raised to 1" in only_warning(bounded.warnings, "spec.startingDeadlineSeconds")
    assert spec["timeoutSeconds"] == 900
    assert spec["target"]["job"]["jobTemplate"]["metadata"] == {
        "annotations": {"cost-center": "42"}
    }
    assert "not carried" in only_warning(bounded.warnings, "spec.jobTemplate.metadata.name")
    assert "ttlSecondsAfterFinished" not in spec["target"]["job"]["jobTemplate"]["spec"]
    assert "3600 not carried: cronwell deletes finished Jobs" in only_warning(
        bounded.warnings, "spec.jobTemplate.spec.ttlSecondsAfterFinished"
    )
    assert bounded.document["metadata"]["labels"] == {"tier": "batch"}


@pytest.mark.parametrize("name", ["hello.yaml", "kubectl-get-all-namespaces.yaml", "stream.yaml"])
def test_the_output_loads_as_scheduledjobs(tmp_path: Path, name: str) -> None:
    done, _ = fixture(name)
    out = tmp_path / "out.yaml"
    out.write_text(convert.dump(done))
    loaded, errors = load([out])
    assert errors == []
    assert [x.job.metadata.name for x in loaded] == [c.document["metadata"]["name"] for c in done]
    for x in loaded:
        assert isinstance(x.job, ScheduledJob) and x.job.spec.target.kind == "job"


def cronjob(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schedule": "@daily",
        "jobTemplate": {
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "m", "image": "busybox"}],
                    }
                }
            }
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {k: v for k, v in (base | spec).items() if v is not None},
    }


def one_error(doc: Any) -> str:
    done, errors = convert.convert_stream(yaml.safe_dump(doc), "in.yaml")
    assert done == [] and len(errors) == 1
    message = str(errors[0])
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            cronjob(schedule="TZ=Europe/Paris 0 9 * * *", timeZone="Asia/Tokyo"),
            "in.yaml (CronJob c): spec.schedule sets TZ=Europe/Paris and spec.timeZone is "
            "'Asia/Tokyo': keep one zone",
        ),
        (cronjob(schedule="0 25 * * *"), "in.yaml (CronJob c): spec.schedule: cron '0 25 * * *'"),
        (cronjob(timeZone="Mars/Olympus"), "spec.timeZone: unknown time zone 'Mars/Olympus'"),
        (cronjob(concurrencyPolicy="Skip"), "'Skip' is not a CronJob policy (Allow, Forbid, "),
        (cronjob(jobTemplate=None), "spec.jobTemplate is missing"),
        (
            cronjob(jobTemplate={"spec": {"template": {"spec": {"containers": []}}}}),
            "(CronJob c): spec.jobTemplate.spec: spec.template.spec.containers needs at least one",
        ),
        ({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {}}, "CronJob without metadata"),
        (["a", "list"], "in.yaml: expected a CronJob mapping, got list"),
        ({"kind": "List", "items": 5}, "in.yaml.items: expected a CronJob mapping, got int"),
        (
            {**cronjob(), "metadata": {"name": "x" * 62 + ".y"}},
            "cannot be made a DNS-1123 label: rename it",
        ),
    ],
)
def test_what_cannot_be_converted_is_an_error_naming_the_cronjob(doc: Any, expected: str) -> None:
    assert expected in one_error(doc)


def test_unknown_fields_are_reported_not_dropped_silently() -> None:
    doc = cronjob(futureField=True)
    doc["metadata"]["finalizers"] = ["example.com/keep"]
    doc["jobTemplate"] = {}
    [c], errors = convert.convert_stream(yaml.safe_dump(doc), "in.yaml")
    assert errors == []
    assert "spec.futureField: not a CronJob field cronwell knows: not carried" in c.warnings
    assert "metadata.finalizers: not carried (it belongs to the CronJob object)" in c.warnings
    assert "jobTemplate: not a CronJob field: not carried" in c.warnings


def test_cronjob_list_kind_and_empty_documents() -> None:
    text = yaml.safe_dump({"apiVersion": "batch/v1", "kind": "CronJobList", "items": [cronjob()]})
    done, errors = convert.convert_stream("---\n---\n" + text, "l.yaml")
    assert errors == [] and [c.source for c in done] == ["l.yaml#2.items[0] (CronJob c)"]


def test_invalid_yaml_is_one_error() -> None:
    done, errors = convert.convert_stream("spec: [unclosed\n", "bad.yaml")
    assert done == []
    assert [str(e) for e in errors] == [
        "bad.yaml: invalid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"
    ]


def test_each_cronjob_policy_maps_to_cronwells() -> None:
    for theirs, ours in [("Allow", "Allow"), ("Forbid", "Skip"), ("Replace", "Replace")]:
        [c] = convert.convert_stream(yaml.safe_dump(cronjob(concurrencyPolicy=theirs)))[0]
        assert c.document["spec"]["concurrencyPolicy"] == ours


def test_a_yaml_alias_bomb_is_refused_before_it_expands() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(6)
    ]
    done, errors = convert.convert_stream("\n".join(lines) + "\n", "bomb.yaml")
    assert done == []
    assert [str(e) for e in errors] == ["bomb.yaml: expands beyond 1,000,000 values"]
