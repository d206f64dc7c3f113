"""The generated CRD in a real API server: examples apply, bad specs are refused by the
schema and CEL with messages naming the field, printer columns render, status is a
subresource. No operator runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cronwell.testing.controlplane import Cluster, KubectlError

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples" / "scheduledjobs"


@pytest.fixture(scope="module")
def crd(kube: Cluster) -> str:
    installed = kube.install_crds([CRDS])
    assert sorted(installed) == ["scheduledjobs.cronwell.dev", "workerpools.cronwell.dev"]
    return "scheduledjobs.cronwell.dev"


def sj(name: str, spec: str) -> str:
    return (
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\n"
        f"metadata: {{name: {json.dumps(name)}}}\nspec:\n"
        + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )


def get(kube: Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def test_examples_apply_with_defaults_filled_in(kube: Cluster, crd: str, namespace: str) -> None:
    out = kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES)).stdout
    names = sorted(line.split()[0] for line in out.splitlines())
    assert len(names) == len(list(EXAMPLES.glob("*.yaml")))
    hello = get(kube, "sj", "hello", "-n", namespace)
    spec = hello["spec"]
    # Server-side defaults, from the pydantic defaults.
    assert spec["timeZone"] == "UTC" and spec["concurrencyPolicy"] == "Skip"
    assert spec["retry"] == {
        "maxAttempts": 3,
        "initialDelaySeconds": 1,
        "factor": 2,
        "maxDelaySeconds": 300,
    }
    assert "http" not in spec["target"] and "handler" not in spec["target"]
    # The short name and the category resolve.
    assert kube.kubectl("get", "cronwell", "-n", namespace, "-o", "name").stdout.count("\n") == (
        len(names)
    )


def test_printer_columns_and_status_subresource(kube: Cluster, crd: str, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=sj("cols", 'schedule: "0 * * * *"\n'
                 "target: {log: {}}"))  # fmt: skip
    status = {
        "activeCount": 1,
        "active": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "cols-abc", "namespace": namespace}
        ],
        "lastScheduleTime": "2026-01-01T00:00:00Z",
        "lastResult": "Succeeded",
        "nextScheduleTime": "2030-01-01T01:00:00Z",
        "counters": {"succeeded": 7, "failed": 2, "missed": 1, "skipped": 3, "dead": 0},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Scheduled"}],
    }
    kube.kubectl(
        "patch", "sj", "cols", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    lines = kube.kubectl("get", "sj", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "LAST",
        "RESULT", "NEXT", "RUN", "AGE",
    ]  # fmt: skip
    row = lines[1].split()
    assert row[:6] == ["cols", "0", "*", "*", "*", "*"]
    assert row[6:11] == ["UTC", "false", "1", row[9], "Succeeded"]  # LAST SCHEDULE: an age
    assert row[11] == "2030-01-01T01:00:00Z"
    wide = kube.kubectl("get", "sj", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-5:] == ["POOL", "SUCCEEDED", "FAILED", "MISSED", "SKIPPED"]
    assert wide[1].split()[-5:] == ["default", "7", "2", "1", "3"]
    # A bad status is refused by the schema too.
    with pytest.raises(KubectlError, match=r"status.lastResult: Unsupported value: \"Bogus\""):
        kube.kubectl(
            "patch", "sj", "cols", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"lastResult": "Bogus"}}),
        )  # fmt: skip
    # Status written through the main resource is ignored (subresource semantics).
    kube.kubectl(
        "patch", "sj", "cols", "-n", namespace, "--type=merge",
        "-p", json.dumps({"status": {"activeCount": 99}}),
    )  # fmt: skip
    assert get(kube, "sj", "cols", "-n", namespace)["status"]["activeCount"] == 1
    # status.active lists Jobs as a CronJob's does: `.status.active[*].name` scripts work.
    names = kube.kubectl(
        "get", "sj", "cols", "-n", namespace, "-o", "jsonpath={.status.active[*].name}"
    ).stdout
    assert names == "cols-abc"
    with pytest.raises(KubectlError, match=r"status.active: Too many: 11: must have at most 10"):
        refs = [{"name": f"cols-{i}", "namespace": namespace} for i in range(11)]
        kube.kubectl(
            "patch", "sj", "cols", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"active": refs}}),
        )  # fmt: skip


REJECTED = [
    pytest.param(
        'schedule: "* * * * *"\nrunAt: "2030-01-01T00:00:00Z"\ntarget: {log: {}}',
        'spec.schedule: Invalid value: "object": set exactly one of spec.schedule (cron) or '
        "spec.runAt (one-shot)",
        id="schedule-and-runAt",
    ),
    pytest.param(
        "target: {log: {}}",
        "set exactly one of spec.schedule (cron) or spec.runAt (one-shot)",
        id="neither-schedule-nor-runAt",
    ),
    pytest.param(
        'schedule: "@daily"\nstartAt: "2030-01-02T00:00:00Z"\nendAt: "2030-01-01T00:00:00Z"\n'
        "target: {log: {}}",
        'spec.endAt: Invalid value: "object": spec.endAt must be after spec.startAt',
        id="endAt-before-startAt",
    ),
    pytest.param(
        'schedule: "@daily"\ntarget: {log: {}, handler: {name: x}}',
        'spec.target: Invalid value: "object": target needs exactly one of http, handler, log '
        "or job",
        id="two-targets",
    ),
    pytest.param(
        'schedule: "@daily"\ntarget: {}',
        "target needs exactly one of http, handler, log or job",
        id="no-target",
    ),
    pytest.param(
        'schedule: "@daily"\nconcurrencyPolicy: Sometimes\ntarget: {log: {}}',
        'spec.concurrencyPolicy: Unsupported value: "Sometimes": supported values: "Skip", '
        '"BufferOne", "BufferAll", "Replace", "Allow"',
        id="enum",
    ),
    pytest.param(
        'schedule: "@daily"\nretry: {maxAttempts: 0}\ntarget: {log: {}}',
        "spec.retry.maxAttempts in body should be greater than or equal to 1",
        id="minimum",
    ),
    pytest.param(
        'schedule: "@daily"\npool: Bad_Pool\ntarget: {log: {}}',
        "spec.pool in body should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
        id="pattern",
    ),
    pytest.param(
        f'schedule: "{"*" * 300}"\ntarget: {{log: {{}}}}',
        "spec.schedule: Too long: may not be more than 256 bytes",
        id="maxLength",
    ),
    pytest.param(
        'runAt: "2030-01-01T09:00:00"\ntarget: {log: {}}',
        'spec.runAt in body must be of type date-time: "2030-01-01T09:00:00"',
        id="date-time-without-offset",
    ),
    pytest.param(
        'schedule: "@daily"\ntarget: {http: {url: "ftp://example.com"}}',
        "spec.target.http.url in body should match '^https?://'",
        id="http-url",
    ),
    pytest.param(
        'schedule: "@daily"\ntimeoutSeconds: 0.5\ntarget: {log: {}}',
        'spec.timeoutSeconds: Invalid value: "number": spec.timeoutSeconds in body must be of '
        "type integer",
        id="integer",
    ),
    pytest.param(
        'schedule: "@daily"\nbogus: 1\ntarget: {log: {}}',
        'unknown field "spec.bogus"',
        id="unknown-field",
    ),
]


@pytest.mark.parametrize(("spec", "message"), REJECTED)
def test_bad_specs_are_refused_with_the_field_and_the_rule(
    kube: Cluster, crd: str, namespace: str, spec: str, message: str
) -> None:
    with pytest.raises(KubectlError) as exc:
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=sj("bad", spec))
    assert message in exc.value.stderr
    assert "ScheduledJob" in exc.value.stderr
    assert kube.kubectl("get", "sj", "bad", "-n", namespace, check=False).returncode != 0


def test_name_must_be_a_dns_label(kube: Cluster, crd: str, namespace: str) -> None:
    with pytest.raises(KubectlError) as exc:
        kube.kubectl(
            "apply", "-n", namespace, "-f", "-",
            input=sj("has.dots", 'schedule: "@daily"\ntarget: {log: {}}'),
        )  # fmt: skip
    assert "metadata.name must be a DNS-1123 label" in exc.value.stderr


def test_kubectl_explain_shows_the_model_descriptions(kube: Cluster, crd: str) -> None:
    out = kube.kubectl("explain", "scheduledjob.spec.concurrencyPolicy").stdout
    assert "When an occurrence comes due while an earlier one is still active." in out
    assert "BufferOne" in out
