"""The validating admission webhook (kopf's, HTTPS with a self-signed certificate), called by
the real API server: what the CRD schema and CEL cannot check is refused at `kubectl apply`
with a message naming the field and the fix."""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.controlplane import Cluster, KubectlError, free_port
from cronwell_operator.testing import (
    FAST_LEASE_ARGS,
    OperatorProcess,
    create_database,
    sql,
    wait_until,
)
from tests.e2e.helpers import fresh_namespace

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "validate-scheduledjob.cronwell.dev"
DENIED = f'admission webhook "{WEBHOOK}" denied the request: '


@pytest.fixture(scope="module")
def ns(kube: Cluster, kube_api: Any) -> Iterator[str]:
    kube.install_crds([ROOT / "crds"])
    yield from fresh_namespace(kube, kube_api, "wh")


@pytest.fixture(scope="module")
def store(pg_server: EmbeddedPostgres, template_db: str) -> str:
    return create_database(pg_server.port, template_db, f"wh_{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    tmp = tmp_path_factory.mktemp("webhook")
    args = ["-n", ns, "--lease-name", f"op-{ns}", *FAST_LEASE_ARGS]
    args += ["--webhook-port", str(free_port()), "--webhook-addr", "127.0.0.1"]
    args += ["--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(tmp / "certs")]
    op = OperatorProcess(kube.kubeconfig, store, tmp / "operator.log", args=args)
    try:
        op.start().wait_ready(120)
        # kopf creates/patches the ValidatingWebhookConfiguration once its server listens.
        wait_until(lambda: _webhooks(kube), 60, "the webhook configuration", check=op._alive)
        wait_until(lambda: _accepts(kube, ns), 60, "the webhook answering", check=op._alive)
        yield op
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)
    finally:
        op.stop()
        # Never leave a Fail-policy webhook behind for the other tests of the session.
        kube.kubectl("delete", "validatingwebhookconfiguration", "cronwell.dev", check=False)


def _webhooks(kube: Cluster) -> list[dict[str, Any]]:
    out = kube.kubectl("get", "validatingwebhookconfiguration", "cronwell.dev", "-o", "json",
                       check=False)  # fmt: skip
    if out.returncode != 0:
        return []
    return list(json.loads(out.stdout).get("webhooks") or [])


def _accepts(kube: Cluster, ns: str) -> bool:
    probe = sj("probe", 'schedule: "@yearly"\ntarget: {log: {}}')
    out = kube.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=probe, check=False)
    return out.returncode == 0


def sj(name: str, spec: str) -> str:
    return (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )


def refused(kube: Cluster, ns: str, manifest: str) -> str:
    with pytest.raises(KubectlError) as exc:
        kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return str(exc.value.stderr)


def test_configuration_is_managed_by_the_operator(kube: Cluster, operator: OperatorProcess) -> None:
    (hook,) = _webhooks(kube)
    assert hook["name"] == WEBHOOK
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
    assert hook["clientConfig"]["caBundle"]  # the self-signed certificate
    (rule,) = hook["rules"]
    assert rule["resources"] == ["scheduledjobs"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            'schedule: "61 * * * *"\ntarget: {log: {}}',
            "ScheduledJob bad: spec.schedule: cron '61 * * * *' does not parse: "
            "[61 * * * *] is not acceptable, out of range (use 5 fields (minute hour "
            "day-of-month month day-of-week), 6 with seconds first, or a macro such as "
            "@hourly; e.g. '*/5 * * * *')",
            id="cron",
        ),
        pytest.param(
            'schedule: "@daily"\ntimeZone: Europe/Pariss\ntarget: {log: {}}',
            "ScheduledJob bad: spec.timeZone: unknown time zone 'Europe/Pariss': use an IANA "
            "name such as 'Europe/Paris' or 'UTC'",
            id="zone",
        ),
        pytest.param(
            'schedule: "@daily"\ntarget: {handler: {name: h, payload: {blob: "'
            + "x" * 70_000
            + '"}}}',
            "ScheduledJob bad: spec.target.handler.payload: 70011 bytes is over the 65536-byte "
            "limit: keep large data elsewhere (a ConfigMap, object storage) and pass a "
            "reference to it",
            id="payload",
        ),
    ],
)
def test_bad_specs_are_refused_naming_the_field_and_the_fix(
    kube: Cluster, ns: str, operator: OperatorProcess, spec: str, message: str
) -> None:
    stderr = refused(kube, ns, sj("bad", spec))
    assert DENIED + message in stderr, stderr
    assert kube.kubectl("get", "sj", "bad", "-n", ns, check=False).returncode != 0


def test_schema_and_cel_answer_before_the_webhook(
    kube: Cluster, ns: str, operator: OperatorProcess
) -> None:
    stderr = refused(kube, ns, sj("both", 'schedule: "61 * * * *"\nrunAt: "2030-01-01T00:00:00Z"'
                                  "\ntarget: {log: {}}"))  # fmt: skip
    assert "set exactly one of spec.schedule (cron) or spec.runAt (one-shot)" in stderr
    assert WEBHOOK not in stderr


def test_good_specs_and_edits_pass_and_are_reconciled(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    good = (
        'schedule: "@hourly"\ntimeZone: Europe/Paris\ntarget: {handler: {name: h, payload: {a: 1}}}'
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("good", good))
    uid = json.loads(kube.kubectl("get", "sj", "good", "-n", ns, "-o", "json").stdout)["metadata"][
        "uid"
    ]
    wait_until(
        lambda: sql(store, "SELECT 1 FROM cronwell_jobs WHERE id = %s", (uid,)),
        60,
        "reconciled",
        check=operator._alive,
    )
    # A bad edit is refused and leaves the object as it was.
    stderr = refused(kube, ns, sj("good", 'schedule: "* * * *"\ntarget: {log: {}}'))
    assert DENIED in stderr and "spec.schedule:" in stderr
    obj = json.loads(kube.kubectl("get", "sj", "good", "-n", ns, "-o", "json").stdout)
    assert obj["spec"]["schedule"] == "@hourly" and obj["metadata"]["generation"] == 1
    # Metadata-only changes and deletion are never blocked.
    kube.kubectl("annotate", "sj", "good", "-n", ns, "cronwell.dev/trigger=now")
    kube.kubectl("delete", "sj", "good", "-n", ns, "--timeout=60s")


def test_a_standby_serves_the_webhook_too(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Admission must not depend on which replica leads: a standby (waiting for the Lease)
    answers AdmissionReviews itself, and leaves the cluster's configuration to the leader."""
    port = free_port()
    certs = tmp_path / "certs"
    args = ["-n", ns, "--lease-name", f"op-{ns}", *FAST_LEASE_ARGS]
    args += ["--webhook-port", str(port), "--webhook-addr", "127.0.0.1"]
    args += ["--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(certs)]
    standby = OperatorProcess(
        kube.kubeconfig, store, tmp_path / "standby.log", identity="op-standby", args=args
    )
    with standby:
        standby.wait_for_log("standby: serving the webhook", 60)
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0d3f-test",
                "kind": {"group": "cronwell.dev", "version": "v1alpha1", "kind": "ScheduledJob"},
                "resource": {
                    "group": "cronwell.dev", "version": "v1alpha1", "resource": "scheduledjobs",
                },
                "operation": "CREATE",
                "namespace": ns,
                "name": "direct",
                "userInfo": {"username": "test"},
                "object": yaml.safe_load(sj("direct", 'schedule: "@often"\ntarget: {log: {}}')),
                "dryRun": False,
            },
        }  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(certs / "tls.crt"))
        req = urllib.request.Request(
            f"https://127.0.0.1:{port}/validate-scheduledjob",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            answer = json.loads(resp.read())["response"]
        assert answer["uid"] == "0d3f-test" and answer["allowed"] is False
        assert "spec.schedule:" in answer["status"]["message"]
        assert "operator ready" not in standby.output()  # it did not take over
        # The configuration still points at the leader.
        (hook,) = _webhooks(kube)
        assert f":{port}/" not in hook["clientConfig"]["url"]


def test_a_clean_stop_removes_the_webhook(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    """So a stopped operator never blocks `kubectl apply` (kill -9 would leave it: the
    configuration then points at nothing and failurePolicy Fail refuses every write)."""
    kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s")
    assert operator.stop() == 0
    assert _webhooks(kube) == []
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("after", 'schedule: "@daily"\n'
                 "target: {log: {}}"))  # fmt: skip
