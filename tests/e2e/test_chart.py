"""The Helm chart installed into a real API server (no kubelet: pods never run), then proved:
RBAC with `kubectl auth can-i --as=system:serviceaccount:...` (what the operator may do and
what no component may), every pod template admitted by Pod Security "restricted" (server
dry-run in a namespace that enforces it), the webhook registered for ScheduledJobs, and
`helm uninstall` keeping the CRDs.

Installed with --no-hooks: the migration Job would wait forever for a pod that never runs;
its pod template is checked against Pod Security from `helm template` instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell.testing.controlplane import Cluster
from tests.helpers.kube import Helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cronwell"
RELEASE = "cw"
CRD = "scheduledjobs.cronwell.dev"


def _adopt_existing_crds(kube: Cluster, namespace: str) -> None:
    """Another e2e module may have applied crds/ already: let this release adopt them."""
    for path in (CHART / "crds-src").glob("*.yaml"):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        if kube.kubectl("get", "crd", name, check=False).returncode != 0:
            continue
        kube.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
        kube.kubectl(
            "annotate", "--overwrite", "crd", name,
            f"meta.helm.sh/release-name={RELEASE}", f"meta.helm.sh/release-namespace={namespace}",
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    ns, other = f"cronwell-{suffix}", f"tenant-{suffix}"
    helm = Helm(kube, tmp_path_factory.mktemp("helm"))
    kube.kubectl("create", "namespace", ns)
    kube.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube.kubectl("create", "namespace", other)
    kube.kubectl("-n", other, "create", "secret", "generic", "tenant-token", "--from-literal=t=x")
    _adopt_existing_crds(kube, ns)
    state: dict[str, Any] = {"ns": ns, "other": other, "helm": helm, "installed": True}
    try:
        state["notes"] = helm(
            "install", RELEASE, str(CHART), "--namespace", ns, "--no-hooks",
            "-f", str(CHART / "ci" / "default-values.yaml"), "--timeout", "60s",
            "--set", "ui.enabled=true",
        ).stdout  # fmt: skip
        yield state
    finally:
        if state["installed"]:
            helm("uninstall", RELEASE, "--namespace", ns, check=False)
        # Never leave a webhook behind that would refuse other tests' ScheduledJobs.
        kube.kubectl(
            "delete", "validatingwebhookconfiguration", f"{RELEASE}-cronwell-webhook-{ns}",
            "--ignore-not-found", check=False,
        )  # fmt: skip
        for n in (ns, other):
            kube.kubectl("delete", "namespace", n, "--wait=false", check=False)


def sa(state: dict[str, Any], component: str) -> str:
    return f"system:serviceaccount:{state['ns']}:{RELEASE}-cronwell-{component}"


def can_i(kube: Cluster, who: str, *args: str) -> bool:
    proc = kube.kubectl("auth", "can-i", f"--as={who}", *args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


def review(kube: Cluster, who: str, verb: str, group: str, resource: str, **attrs: str) -> bool:
    """A SubjectAccessReview: asks the authorizer alone, whatever the API server serves
    (`kubectl auth can-i` answers "no" for a resource type it cannot discover)."""
    ns = who.split(":")[2]
    sar = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}",
                       "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource, **attrs},
        },
    }  # fmt: skip
    out = kube.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(sar)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


def test_release_objects_exist(kube: Cluster, installed: dict[str, Any]) -> None:
    ns = installed["ns"]
    out = json.loads(kube.kubectl("-n", ns, "get", "deploy,sa,svc,pdb", "-o", "json").stdout)
    names = {(i["kind"], i["metadata"]["name"]) for i in out["items"]}
    for kind, name in [
        ("Deployment", "cw-cronwell-operator"),
        ("Deployment", "cw-cronwell-scheduler"),
        ("Deployment", "cw-cronwell-worker-default"),
        ("ServiceAccount", "cw-cronwell-scheduler"),
        ("Deployment", "cw-cronwell-ui"),
        ("ServiceAccount", "cw-cronwell-ui"),
        ("Service", "cw-cronwell-ui"),
        ("Service", "cw-cronwell-webhook"),
        ("PodDisruptionBudget", "cw-cronwell-scheduler"),
    ]:
        assert (kind, name) in names
    notes = installed["notes"]
    assert f"kubectl label namespace {ns} pod-security.kubernetes.io/enforce=restricted" in notes
    assert "deployment/cw-cronwell-worker-default (pool default)" in notes
    assert "deployment/cw-cronwell-ui (read-only)" in notes
    assert f"open it: kubectl cronwell ui -n {ns}" in notes
    assert "WARNING" not in notes  # sslmode verify-full
    crd = json.loads(kube.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_operator_can_do_its_job(kube: Cluster, installed: dict[str, Any]) -> None:
    op, ns, other = sa(installed, "operator"), installed["ns"], installed["other"]
    allowed = [
        ("patch", "scheduledjobs.cronwell.dev", "--subresource=status", "-n", other),
        ("update", "scheduledjobs.cronwell.dev", "--subresource=status", "-n", other),
        ("patch", "scheduledjobs.cronwell.dev", "-n", other),  # its finalizer
        ("watch", "scheduledjobs.cronwell.dev", "--all-namespaces"),
        ("create", "events", "-n", other),
        ("patch", "deployments/cw-cronwell-worker-default", "--subresource=scale", "-n", ns),
        ("get", "deployments/cw-cronwell-worker-default", "--subresource=scale", "-n", ns),
        ("patch", "horizontalpodautoscalers.autoscaling", "-n", ns),
        ("create", "leases.coordination.k8s.io", "-n", ns),
        ("update", "leases.coordination.k8s.io/cw-cronwell-operator", "-n", ns),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ]
    refused = [args for args in allowed if not can_i(kube, op, *args)]
    assert not refused, refused
    # WorkerPool: read-only (the pre-scaler never writes a spec), plus its status.
    for verb in ("get", "list", "watch"):
        assert review(kube, op, verb, "cronwell.dev", "workerpools")
    assert not review(kube, op, "patch", "cronwell.dev", "workerpools")
    assert review(kube, op, "patch", "cronwell.dev", "workerpools", subresource="status")
    assert not review(kube, op, "delete", "cronwell.dev", "workerpools", namespace=other)


def test_operator_cannot_do_more(kube: Cluster, installed: dict[str, Any]) -> None:
    op, ns, other = sa(installed, "operator"), installed["ns"], installed["other"]
    denied = [
        ("get", "secrets/tenant-token", "-n", other),  # no secretAccess configured
        ("list", "secrets", "-n", ns),
        ("delete", "scheduledjobs.cronwell.dev", "-n", other),
        ("create", "scheduledjobs.cronwell.dev", "-n", other),
        ("patch", "deployments/cw-cronwell-scheduler", "--subresource=scale", "-n", ns),
        ("patch", "deployments/cw-cronwell-worker-default", "-n", ns),  # only its scale
        ("patch", "deployments/coredns", "--subresource=scale", "-n", "kube-system"),
        ("update", "leases.coordination.k8s.io/someone-else", "-n", ns),
        ("create", "pods", "-n", ns),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
    ]
    granted = [args for args in denied if can_i(kube, op, *args)]
    assert not granted, granted


def test_workers_and_schedulers_have_no_api_access(
    kube: Cluster, installed: dict[str, Any]
) -> None:
    ns, other = installed["ns"], installed["other"]
    worker, scheduler = sa(installed, "worker-default"), sa(installed, "scheduler")
    for who in (worker, scheduler):
        for args in [
            ("get", "secrets/tenant-token", "-n", other),
            ("get", "secrets", "-n", ns),
            ("get", "scheduledjobs.cronwell.dev", "-n", ns),
            ("list", "scheduledjobs.cronwell.dev", "--all-namespaces"),
            ("patch", "scheduledjobs.cronwell.dev", "--subresource=status", "-n", ns),
            ("create", "events", "-n", ns),
            ("get", "leases.coordination.k8s.io", "-n", ns),
            ("get", "pods", "-n", ns),
        ]:
            assert not can_i(kube, who, *args), f"{who} may {' '.join(args)}"
        assert not review(kube, who, "list", "cronwell.dev", "workerpools")

    # Nothing at all beyond what every service account gets: the same rules as a
    # ServiceAccount that no binding names.
    def rules(who: str) -> str:
        return kube.kubectl("auth", "can-i", "--list", f"--as={who}", "-n", ns).stdout

    nobody = rules(f"system:serviceaccount:{ns}:nobody-{uuid.uuid4().hex[:6]}")
    assert rules(scheduler) == nobody
    assert rules(worker) == nobody


def test_dashboard_may_review_and_nothing_else(kube: Cluster, installed: dict[str, Any]) -> None:
    """ui.enabled without ui.allowActions: the dashboard's ServiceAccount may create the two
    reviews (TokenReview, SubjectAccessReview) and list WorkerPools (the forecast plans with
    them), and touch nothing else, ScheduledJobs included."""
    ui, ns, other = sa(installed, "ui"), installed["ns"], installed["other"]
    assert can_i(kube, ui, "create", "tokenreviews.authentication.k8s.io")
    assert can_i(kube, ui, "create", "subjectaccessreviews.authorization.k8s.io")
    for args in [
        ("get", "secrets/tenant-token", "-n", other),
        ("list", "secrets", "-n", ns),
        ("create", "serviceaccounts/token", "-n", ns),
        ("impersonate", "users"),
        ("create", "pods", "-n", ns),
    ]:
        assert not can_i(kube, ui, *args), f"{ui} may {' '.join(args)}"
    for verb in ("get", "list", "patch", "update"):
        assert not review(kube, ui, verb, "cronwell.dev", "scheduledjobs", namespace=other)
    assert review(kube, ui, "list", "cronwell.dev", "workerpools", namespace=other)
    for verb in ("patch", "update", "delete"):
        assert not review(kube, ui, verb, "cronwell.dev", "workerpools", namespace=other)


def test_pod_templates_pass_pod_security_restricted(
    kube: Cluster, installed: dict[str, Any]
) -> None:
    ns = installed["ns"]
    templates: dict[str, dict[str, Any]] = {}
    for d in json.loads(kube.kubectl("-n", ns, "get", "deploy", "-o", "json").stdout)["items"]:
        templates[d["metadata"]["name"]] = d["spec"]["template"]
    rendered = installed["helm"](
        "template", RELEASE, str(CHART), "--namespace", ns,
        "-f", str(CHART / "ci" / "default-values.yaml"),
    ).stdout  # fmt: skip
    for d in yaml.safe_load_all(rendered):
        if d and d["kind"] == "Job":  # the migration hook, not installed with --no-hooks
            templates[d["metadata"]["name"]] = d["spec"]["template"]
    assert len(templates) == 5  # operator, scheduler, worker, dashboard, migration
    for name, tpl in templates.items():
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"psa-{name}"[:63], "labels": tpl["metadata"]["labels"]},
               "spec": tpl["spec"]}  # fmt: skip
        proc = kube.kubectl(
            "-n", ns, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        assert "would violate" not in proc.stderr, f"{name}: {proc.stderr}"
    # The control: a root pod is refused there, so the namespace does enforce "restricted".
    root = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    proc = kube.kubectl(
        "-n", ns, "create", "--dry-run=server", "-f", "-", input=json.dumps(root), check=False
    )
    assert proc.returncode != 0 and "restricted" in proc.stderr


def test_webhook_is_called_for_scheduledjobs(kube: Cluster, installed: dict[str, Any]) -> None:
    """No operator runs here, so the API server cannot reach the webhook: with
    failurePolicy Fail the write is refused, naming our webhook."""
    job = {"apiVersion": "cronwell.dev/v1alpha1", "kind": "ScheduledJob",
           "metadata": {"name": "hello", "namespace": installed["other"]},
           "spec": {"schedule": "*/5 * * * *", "target": {"log": {"message": "hi"}}}}  # fmt: skip
    proc = kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(job), check=False)
    assert proc.returncode != 0
    assert "validate-scheduledjob.cronwell.dev" in proc.stderr, proc.stderr


def test_upgrade_keeps_the_webhook_certificate(kube: Cluster, installed: dict[str, Any]) -> None:
    ns = installed["ns"]

    def current() -> tuple[str, str, str]:
        secret = json.loads(
            kube.kubectl("-n", ns, "get", "secret", "cw-cronwell-webhook-tls", "-o", "json").stdout
        )
        vwc = json.loads(
            kube.kubectl(
                "get", "validatingwebhookconfiguration", f"cw-cronwell-webhook-{ns}", "-o", "json"
            ).stdout
        )
        return (secret["data"]["ca.crt"], secret["data"]["tls.crt"],
                vwc["webhooks"][0]["clientConfig"]["caBundle"])  # fmt: skip

    before = current()
    assert before[0] == before[2], "caBundle is the Secret's CA"
    installed["helm"](
        "upgrade", RELEASE, str(CHART), "--namespace", ns, "--no-hooks", "--reuse-values",
        "--timeout", "60s",
    )  # fmt: skip
    assert current() == before, "helm upgrade must reuse the webhook certificate (lookup)"


def test_uninstall_keeps_the_crds(kube: Cluster, installed: dict[str, Any]) -> None:
    ns = installed["ns"]
    installed["helm"]("uninstall", RELEASE, "--namespace", ns, "--timeout", "60s")
    installed["installed"] = False
    assert kube.kubectl("get", "crd", CRD, check=False).returncode == 0, "CRD was deleted"
    left = kube.kubectl("-n", ns, "get", "deploy,sa,svc", "-o", "name").stdout.split()
    assert not left, left
    vwc = kube.kubectl("get", "validatingwebhookconfigurations", "-o", "name").stdout
    assert f"{RELEASE}-cronwell-webhook-{ns}" not in vwc
