"""The Helm chart, rendered with `helm template` (no cluster): lint, the CRD copies, restricted
Pod Security on every container, least-privilege RBAC, no Kubernetes API access for the
schedulers and workers, the webhook's TLS, the migration hook, metrics, the values schema,
and every flag the chart passes existing in the `cronwell` CLI.

Renders the chart with ci/default-values.yaml (defaults + the one required value) as on a
fresh cluster, and ci/full-values.yaml (every option on, non-default values) as on a cluster
that already serves the WorkerPool kind (WORKERPOOL_SERVED). Needs the helm binary of
`hack/envtest.sh` (or KUBEBUILDER_ASSETS); skipped without it.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from cronwell.testing.controlplane import ControlPlaneError, find_assets
from cronwell.workerpool import WorkerPool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cronwell"
CRDS = ROOT / "crds"
NAMESPACE = "cronwell"
RELEASE = "cw"
#: What the chart's alerts and dashboard may use: the metrics cronwell exposes.
METRICS = {
    "cronwell_start_lag_seconds_bucket",
    "cronwell_occurrences_total",
    "cronwell_partitions_owned",
    "cronwell_dlq_size",
}
POD_KINDS = {"Deployment", "Job", "StatefulSet", "DaemonSet"}
#: What `helm install/upgrade` sees on a cluster serving the WorkerPool CRD (Argo CD passes
#: the cluster's API versions the same way); without it, as on a fresh install, the chart
#: skips its WorkerPool objects.
WORKERPOOL_SERVED = ("--api-versions", "cronwell.dev/v1alpha1/WorkerPool")


def helm_binary() -> Path:
    try:
        return find_assets(("helm",)) / "helm"
    except ControlPlaneError as e:
        pytest.skip(f"helm not available: {e}")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def render(*values_args: str) -> list[dict[str, Any]]:
    """The chart's manifests (hooks included) for these `-f`/`--set` arguments."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render("-f", str(CHART / "ci" / "default-values.yaml"))


@pytest.fixture(scope="module")
def full() -> list[dict[str, Any]]:
    return render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED)


@pytest.fixture(params=["default", "full"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = request.getfixturevalue(request.param)
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in POD_KINDS:
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"]


def component(d: dict[str, Any]) -> str:
    return str(d["metadata"]["labels"]["app.kubernetes.io/component"])


# ----------------------------------------------------------------------------- lint, CRDs


@pytest.mark.parametrize("values", ["default-values.yaml", "full-values.yaml"])
def test_helm_lint_strict(values: str) -> None:
    out = helm("lint", "--strict", str(CHART), "-f", str(CHART / "ci" / values)).stdout
    assert "0 chart(s) failed" in out


def test_chart_crd_copies_are_identical_to_crds_dir() -> None:
    """crds-src/ is what the chart installs; `make manifests` refreshes it with crds/."""
    ours = {p.name: p.read_bytes() for p in (CHART / "crds-src").glob("*.yaml")}
    source = {p.name: p.read_bytes() for p in CRDS.glob("*.yaml")}
    assert sorted(ours) == sorted(source), "run `make manifests` to sync charts/cronwell/crds-src"
    for name, text in source.items():
        assert ours[name] == text, f"charts/cronwell/crds-src/{name} differs from crds/{name}"


def test_rendered_crds_equal_the_generated_ones(default: list[dict[str, Any]]) -> None:
    rendered = {d["metadata"]["name"]: d for d in of_kind(default, "CustomResourceDefinition")}
    generated = {}
    for path in CRDS.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        generated[doc["metadata"]["name"]] = doc
    assert sorted(rendered) == sorted(generated)
    for name, doc in rendered.items():
        meta = doc["metadata"]
        assert meta["annotations"]["helm.sh/resource-policy"] == "keep"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        stripped = {**doc, "metadata": {"name": meta["name"]}}
        assert stripped == generated[name], f"{name}: the template changed the CRD"


def test_crds_keep_and_enabled_switches(full: list[dict[str, Any]]) -> None:
    crds = of_kind(full, "CustomResourceDefinition")
    assert sorted(c["spec"]["names"]["kind"] for c in crds) == ["ScheduledJob", "WorkerPool"]
    for crd in crds:
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    docs = render("-f", str(CHART / "ci" / "default-values.yaml"), "--set", "crds.enabled=false")
    assert not of_kind(docs, "CustomResourceDefinition")


# ------------------------------------------------------------------------- Pod Security


def test_every_container_meets_pod_security_restricted(rendered: list[dict[str, Any]]) -> None:
    specs = dict(pod_specs(rendered))
    assert specs, "no pod templates rendered"
    for where, spec in specs.items():
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True, where
        assert psc["runAsUser"] == 10001, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), where
        tmp = [v for v in spec["volumes"] if v["name"] == "tmp"]
        assert tmp and "emptyDir" in tmp[0], f"{where}: no emptyDir for /tmp"
        for c in spec["containers"] + spec.get("initContainers", []):
            at = f"{where} container {c['name']}"
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, at
            assert sc["readOnlyRootFilesystem"] is True, at
            assert sc["runAsNonRoot"] is True, at
            assert sc["capabilities"] == {"drop": ["ALL"]}, at
            assert not sc.get("privileged"), at
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, at
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], at
            res = c["resources"]
            assert res["requests"]["cpu"] and res["requests"]["memory"], at
            assert res["limits"]["memory"], at


def test_database_url_is_a_mounted_file_never_an_env_value(rendered: list[dict[str, Any]]) -> None:
    for where, spec in pod_specs(rendered):
        volumes = {v["name"]: v for v in spec["volumes"]}
        secret = volumes["database"]["secret"]
        for c in spec["containers"]:
            env = {e["name"]: e for e in c["env"]}
            assert "CRONWELL_DATABASE_URL" not in env, where
            assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in c["env"]), where
            url_file = Path(env["CRONWELL_DATABASE_URL_FILE"]["value"])
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            assert mounts["database"]["readOnly"] is True
            assert url_file.parent == Path(mounts["database"]["mountPath"]), where
            assert [i["path"] for i in secret["items"]] == [url_file.name], where
            assert env["PGSSLMODE"]["value"] == "verify-full", where


def test_database_ca_secret_and_weaker_sslmode() -> None:
    docs = render("-f", str(CHART / "ci" / "full-values.yaml"))
    spec = next(s for _, s in pod_specs(docs))
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert spec["containers"][0]["env"][0]["value"] == "/etc/cronwell/database/dsn"
    assert env["PGSSLROOTCERT"] == "/etc/cronwell/database-ca/root.pem"
    ca = next(v for v in spec["volumes"] if v["name"] == "database-ca")
    assert ca["secret"]["secretName"] == "cronwell-database-ca"
    default_ca = render("-f", str(CHART / "ci" / "default-values.yaml"))
    env = {
        e["name"]: e.get("value") for e in next(pod_specs(default_ca))[1]["containers"][0]["env"]
    }
    assert env["PGSSLROOTCERT"] == "system"  # libpq >= 16: the image's trust store
    weak = render(
        "-f", str(CHART / "ci" / "default-values.yaml"), "--set", "database.sslmode=require"
    )
    env = {e["name"]: e.get("value") for e in next(pod_specs(weak))[1]["containers"][0]["env"]}
    assert env["PGSSLMODE"] == "require" and "PGSSLROOTCERT" not in env


def test_read_replica_url_reaches_only_the_operator_and_the_dashboard(
    full: list[dict[str, Any]], default: list[dict[str, Any]]
) -> None:
    """database.read: a mounted Secret, as the primary's URL, in the pods whose reads it
    serves (operator: the pre-scaler's forecast; ui: the pages); none without it."""
    served = set()
    for where, spec in pod_specs(full):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            if "CRONWELL_DATABASE_READ_URL_FILE" not in env:
                assert "database-read" not in volumes, where
                continue
            served.add(where.split("/")[1])
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            assert mounts["database-read"]["readOnly"] is True
            assert env["CRONWELL_DATABASE_READ_URL_FILE"] == "/etc/cronwell/database-read/dsn"
            assert env["CRONWELL_DATABASE_READ_MAX_LAG_SECONDS"] == "10"
            secret = volumes["database-read"]["secret"]
            assert secret["secretName"] == "cronwell-database-ro"
            assert [i["path"] for i in secret["items"]] == ["dsn"]
    assert served == {"cw-operator", "cw-ui"}, served
    for where, spec in pod_specs(default):
        for c in spec["containers"]:
            assert not any(e["name"].startswith("CRONWELL_DATABASE_READ") for e in c["env"]), where


# -------------------------------------------------------------------------------- RBAC


def rules(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole"):
            for r in d.get("rules") or []:
                yield f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}", r


def test_no_wildcards_and_no_dangerous_verbs(rendered: list[dict[str, Any]]) -> None:
    seen = 0
    for where, r in rules(rendered):
        seen += 1
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in (r.get(field) or []), f"{where}: wildcard in {field}"
        assert not {"escalate", "bind", "impersonate", "deletecollection", "delete"} & set(
            r["verbs"]
        ), f"{where}: {r['verbs']}"
        assert not {"pods/exec", "pods/attach", "serviceaccounts/token", "nodes/proxy"} & set(
            r["resources"]
        ), where
    assert seen


def test_no_cluster_wide_secret_access(rendered: list[dict[str, Any]]) -> None:
    for where, r in rules(rendered):
        if where.startswith("ClusterRole"):
            assert "secrets" not in r["resources"], where
        elif "secrets" in r["resources"]:
            assert r["verbs"] == ["get"], where


def test_operator_rules_are_exactly_what_it_uses(default: list[dict[str, Any]]) -> None:
    def by_resource(role: dict[str, Any]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in role["rules"]:
            for res in r["resources"]:
                out.setdefault(res, set()).update(r["verbs"])
        return out

    (cluster_role,) = of_kind(default, "ClusterRole")
    assert by_resource(cluster_role) == {
        "customresourcedefinitions": {"list", "watch"},
        "scheduledjobs": {"get", "list", "watch", "patch", "update"},
        "workerpools": {"get", "list", "watch"},  # the pre-scaler never writes a spec
        "namespaces": {"get", "list"},  # annotations and labels: webhook, tenancy sync
        "scheduledjobs/status": {"get", "patch", "update"},
        "workerpools/status": {"patch"},
        "events": {"create", "patch"},
    }
    self_role = named(default, "Role", f"{RELEASE}-cronwell-operator-self")
    assert self_role["metadata"]["namespace"] == NAMESPACE
    assert by_resource(self_role) == {
        "leases": {"create", "get", "update"},
        "deployments/scale": {"get", "patch"},  # replicas only through the scale
        "deployments": {"get"},  # readyReplicas: pre-scaled pods Ready; never written
        "horizontalpodautoscalers": {"get", "list", "patch"},
    }
    named_rules = {r["resources"][0]: r.get("resourceNames") for r in self_role["rules"]}
    assert named_rules["deployments/scale"] == [f"{RELEASE}-cronwell-worker-default"]
    assert named_rules["deployments"] == [f"{RELEASE}-cronwell-worker-default"]
    lease_get = [
        r for r in self_role["rules"] if "get" in r["verbs"] and "leases" in r["resources"]
    ]
    assert lease_get[0]["resourceNames"] == [f"{RELEASE}-cronwell-operator"]
    deploy = named(default, "Deployment", f"{RELEASE}-cronwell-operator")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--lease-name={RELEASE}-cronwell-operator" in args
    assert f"--lease-namespace={NAMESPACE}" in args


def test_namespaced_operator_gets_roles_not_cluster_rules(full: list[dict[str, Any]]) -> None:
    (cluster_role,) = [r for r in of_kind(full, "ClusterRole") if component(r) == "operator"]
    # Read-only cluster-wide rules only: CRD definitions, WorkerPool names (admission checks
    # a pool in any namespace), Namespaces (their annotations).
    assert [(r["resources"], r["verbs"]) for r in cluster_role["rules"]] == [
        (["customresourcedefinitions"], ["list", "watch"]),
        (["workerpools"], ["get", "list", "watch"]),
        (["namespaces"], ["get", "list"]),
    ]
    for ns in ("team-a", "team-b"):
        role = named(
            [d for d in full if d["metadata"].get("namespace") == ns], "Role", "cw-operator"
        )
        assert {res for r in role["rules"] for res in r["resources"]} >= {"scheduledjobs", "events"}
    secrets = named(full, "Role", "cw-operator-secrets")
    assert secrets["metadata"]["namespace"] == "team-a"
    assert secrets["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["reports-api-token"],
         "verbs": ["get"]}
    ]  # fmt: skip
    args = named(full, "Deployment", "cw-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    scale = next(
        r for r in named(full, "Role", "cw-operator-self")["rules"]
        if r["resources"] == ["deployments/scale"]
    )  # fmt: skip
    assert scale["resourceNames"] == ["cw-worker-default", "cw-worker-reports"]


def test_only_the_operator_and_the_dashboard_can_reach_the_api(
    rendered: list[dict[str, Any]],
) -> None:
    """The dashboard (ui.enabled, in the full render) calls the API for its reviews: its
    pods mount a token, its ServiceAccount does not hand one to other pods."""
    by_component = {
        component(d): d["metadata"]["name"] for d in of_kind(rendered, "ServiceAccount")
    }
    callers = {by_component["operator"], by_component.get("ui")} - {None}
    for d in of_kind(rendered, "RoleBinding") + of_kind(rendered, "ClusterRoleBinding"):
        assert [s["name"] for s in d["subjects"]] == [by_component[component(d)]], d["metadata"]
        assert by_component[component(d)] in callers
    for sa in of_kind(rendered, "ServiceAccount"):
        want = component(sa) == "operator"
        assert sa["automountServiceAccountToken"] is want, sa["metadata"]["name"]
    for where, spec in pod_specs(rendered):
        assert spec["automountServiceAccountToken"] is (spec["serviceAccountName"] in callers), (
            where
        )


# ------------------------------------------------------------------ workloads and pools


def test_scheduler_is_replicated_with_a_disruption_budget(default: list[dict[str, Any]]) -> None:
    sched = named(default, "Deployment", f"{RELEASE}-cronwell-scheduler")
    assert sched["spec"]["replicas"] >= 2
    pod_labels = sched["spec"]["template"]["metadata"]["labels"]
    (pdb,) = [p for p in of_kind(default, "PodDisruptionBudget") if component(p) == "scheduler"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert sched["spec"]["template"]["spec"]["containers"][0]["args"][0] == "scheduler"


def test_one_deployment_and_workerpool_per_pool(full: list[dict[str, Any]]) -> None:
    workers = {
        d["metadata"]["name"]: d for d in of_kind(full, "Deployment") if component(d) == "worker"
    }
    assert sorted(workers) == ["cw-worker-default", "cw-worker-reports"]
    pools = {p["metadata"]["name"]: p for p in of_kind(full, "WorkerPool")}
    assert sorted(pools) == ["default", "reports"]
    reports = workers["cw-worker-reports"]
    assert "replicas" not in reports["spec"], "the operator scales pools that have a WorkerPool"
    spec = reports["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["image"].startswith("registry.example/reports-handlers@sha256:")
    assert c["args"][:4] == ["worker", "--pool=reports", "--concurrency=8",
                             "--shutdown-grace-seconds=120"]  # fmt: skip
    assert "--import=reports.handlers" in c["args"]
    assert spec["terminationGracePeriodSeconds"] == 135
    assert spec["serviceAccountName"] == "cw-worker-reports"
    default_args = workers["cw-worker-default"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--concurrency=32" in default_args  # worker.defaults applies
    pool = pools["reports"]["spec"]
    assert pool["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": "cw-worker-reports"}  # fmt: skip
    assert (pool["minReplicas"], pool["maxReplicas"], pool["concurrencyPerReplica"]) == (4, 20, 8)
    assert pool["leadTimeSeconds"] == 45
    # Every rendered WorkerPool is one the operator's model (the CRD's source) accepts.
    for doc in pools.values():
        WorkerPool.model_validate(doc)


def test_workerpool_fields_from_values(tmp_path: Path) -> None:
    values = tmp_path / "pools.yaml"
    values.write_text(
        "worker:\n  createWorkerPoolObjects: true\n  pools:\n"
        "    - {name: default, minReplicas: 0, maxReplicas: 6, leadTimeSeconds: 90,\n"
        "       scaleDownDelaySeconds: 300, startSLOSeconds: 2.5}\n"
    )
    docs = render(
        "-f", str(CHART / "ci" / "default-values.yaml"), "-f", str(values), *WORKERPOOL_SERVED
    )
    (pool,) = of_kind(docs, "WorkerPool")
    spec = WorkerPool.model_validate(pool).spec
    assert (spec.min_replicas, spec.max_replicas) == (0, 6)  # 0 is a value, not "unset"
    assert (spec.lead_time_seconds, spec.scale_down_delay_seconds) == (90, 300)
    assert spec.start_slo_seconds == 2.5
    assert spec.concurrency_per_replica == 64


@pytest.mark.parametrize(
    ("served", "wanted", "pools"),
    [
        pytest.param(True, True, ["default"], id="kind-served"),
        pytest.param(False, True, [], id="fresh-install"),
        pytest.param(True, False, [], id="turned-off"),
    ],
)
def test_workerpools_by_default_once_the_cluster_serves_the_kind(
    served: bool, wanted: bool, pools: list[str]
) -> None:
    """On by default, rendered only where the kind is served (a fresh install creates the
    CRD in the same step, and Helm cannot map a kind it does not know); the worker
    Deployment leaves `replicas` to the operator exactly when its WorkerPool is rendered."""
    args = ["-f", str(CHART / "ci" / "default-values.yaml")]
    args += WORKERPOOL_SERVED if served else ()
    args += () if wanted else ("--set", "worker.createWorkerPoolObjects=false")
    docs = render(*args)
    assert [p["metadata"]["name"] for p in of_kind(docs, "WorkerPool")] == pools
    worker = named(docs, "Deployment", f"{RELEASE}-cronwell-worker-default")
    if pools:
        assert "replicas" not in worker["spec"], "the operator scales it"
    else:
        assert worker["spec"]["replicas"] == 2, "nothing else would scale it"
    assert named(docs, "Deployment", f"{RELEASE}-cronwell-scheduler")["spec"]["replicas"] == 2


def test_migration_runs_as_a_pre_install_and_pre_upgrade_hook(
    rendered: list[dict[str, Any]],
) -> None:
    (job,) = of_kind(rendered, "Job")
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert spec["containers"][0]["args"] == ["migrate"]
    assert spec["restartPolicy"] == "Never"
    sa = named(rendered, "ServiceAccount", spec["serviceAccountName"])
    assert sa["metadata"]["annotations"]["helm.sh/hook"] == ann["helm.sh/hook"]
    assert int(sa["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        ann["helm.sh/hook-weight"]
    ), "the hook's ServiceAccount must exist before the Job"


def test_every_object_is_namespaced_in_the_release_namespace(
    rendered: list[dict[str, Any]],
) -> None:
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                      "ValidatingWebhookConfiguration"}  # fmt: skip
    for d in rendered:
        if d["kind"] in cluster_scoped:
            assert "namespace" not in d["metadata"]
        elif d["kind"] not in ("Role", "RoleBinding"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]["name"]


# ------------------------------------------------------------------------------ webhook


def _openssl(*args: str, input: bytes) -> str:
    return subprocess.run(
        ["openssl", *args], input=input, capture_output=True, check=True
    ).stdout.decode()


def test_webhook_tls_is_generated_and_trusted(
    default: list[dict[str, Any]], tmp_path: Path
) -> None:
    svc = named(default, "Service", f"{RELEASE}-cronwell-webhook")
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    deploy = named(default, "Deployment", f"{RELEASE}-cronwell-operator")
    assert (
        svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    (vwc,) = of_kind(default, "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "name": svc["metadata"]["name"], "namespace": NAMESPACE,
        "path": "/validate-scheduledjob", "port": 443,
    }  # fmt: skip
    assert hook["rules"][0]["resources"] == ["scheduledjobs"]
    assert hook["failurePolicy"] == "Fail"
    secret = named(default, "Secret", f"{RELEASE}-cronwell-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    cert = base64.b64decode(secret["data"]["tls.crt"])
    assert ": OK" in _openssl("verify", "-CAfile", str(ca), input=cert)
    sans = _openssl("x509", "-noout", "-ext", "subjectAltName", input=cert)
    assert f"DNS:{RELEASE}-cronwell-webhook.{NAMESPACE}.svc" in sans
    # The pods restart when the certificate changes, and mount it where the operator reads it.
    pod = deploy["spec"]["template"]
    assert "checksum/webhook-tls" in pod["metadata"]["annotations"]
    c = pod["spec"]["containers"][0]
    assert "--webhook-cert-dir=/etc/cronwell/webhook" in c["args"]
    assert {"name": "webhook-tls", "mountPath": "/etc/cronwell/webhook", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert c["readinessProbe"]["tcpSocket"]["port"] == "webhook"


def test_webhook_with_cert_manager(full: list[dict[str, Any]]) -> None:
    assert not of_kind(full, "Secret")
    (cert,) = of_kind(full, "Certificate")
    assert cert["spec"]["secretName"] == "cw-webhook-tls"
    assert "cw-webhook.cronwell.svc" in cert["spec"]["dnsNames"]
    (vwc,) = of_kind(full, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "cronwell/cw-webhook"
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]
    assert vwc["webhooks"][0]["failurePolicy"] == "Ignore"
    sel = vwc["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]
    assert sel["values"] == ["team-a", "team-b"]


# ------------------------------------------------------------------------------ metrics


def test_metrics_services_select_each_component(rendered: list[dict[str, Any]]) -> None:
    services = [
        s for s in of_kind(rendered, "Service") if s["metadata"]["name"].endswith("-metrics")
    ]
    assert sorted(component(s) for s in services) == ["operator", "scheduler", "worker"]
    deployments = of_kind(rendered, "Deployment")
    for s in services:
        (port,) = s["spec"]["ports"]
        assert port["name"] == "metrics" and port["targetPort"] == "metrics"
        selected = [
            d for d in deployments
            if s["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert selected and all(component(d) == component(s) for d in selected)
        for d in selected:
            ports = d["spec"]["template"]["spec"]["containers"][0]["ports"]
            assert {"name": "metrics", "containerPort": port["port"], "protocol": "TCP"} in ports


def test_servicemonitor_rules_and_dashboard(full: list[dict[str, Any]]) -> None:
    (sm,) = of_kind(full, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    metrics_services = [
        s for s in of_kind(full, "Service") if s["metadata"]["name"].endswith("-metrics")
    ]
    for s in metrics_services:
        assert sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"

    (rule,) = of_kind(full, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"CronwellStartLagHigh", "CronwellPartitionsUnowned", "CronwellDeadLetterQueue",
            "CronwellDeadAttemptsHigh", "CronwellSchedulersAbsent"} <= set(alerts)  # fmt: skip
    assert alerts["CronwellStartLagHigh"]["expr"].rstrip().endswith("> 3")
    assert alerts["CronwellPartitionsUnowned"]["expr"].rstrip().endswith("< 32")
    for name, a in alerts.items():
        used = set(re.findall(r"\bcronwell_[a-z_]+", a["expr"]))
        assert used and used <= METRICS, f"{name} uses {used - METRICS}"
        assert 'namespace="cronwell"' in a["expr"], name
        assert a["expr"].count("(") == a["expr"].count(")"), name
        assert a["labels"]["severity"] in ("warning", "critical")

    cm = named(full, "ConfigMap", "cw-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["cronwell.json"])
    assert dash["uid"] == "cronwell-overview"
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcronwell_[a-z_]+", e)}
    assert used >= METRICS  # and more: tests/unit/test_dashboard.py checks each one exists


def test_monitoring_objects_are_off_by_default(default: list[dict[str, Any]]) -> None:
    for kind in ("ServiceMonitor", "PrometheusRule", "ConfigMap", "Certificate"):
        assert not of_kind(default, kind), kind


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "database.existingSecret is required"),
        (
            ("--set", "database.existingSecret=x", "--set", "operator.replica=2"),
            "'replica' not allowed",
        ),
        (("--set", "database.existingSecret=x", "--set", "typo=1"), "'typo' not allowed"),
        (("--set", "database.existingSecret=x", "--set", "database.sslmode=verify"), "sslmode"),
        (
            ("--set", "database.existingSecret=x", "--set", "database.read.maxLagSeconds=600"),
            "maxLagSeconds",
        ),
        (("--set", "database.existingSecret=x", "--set", "worker.pools[0].name=Bad_Name"), "name"),
        (
            (
                "--set",
                "database.existingSecret=x",
                "--set",
                "worker.pools[0].name=a",
                "--set",
                "worker.pools[0].colour=red",
            ),
            "'colour' not allowed",
        ),
    ],
)
def test_values_are_checked(args: tuple[str, ...], message: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_every_value_is_commented() -> None:
    """Each key of values.yaml has a comment right above it, except the content of plain
    Kubernetes objects (resources, probes, seccompProfile, labels) under a commented key."""
    k8s_content = {"resources", "livenessProbe", "readinessProbe", "seccompProfile",
                   "capabilities", "labels"}  # fmt: skip
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9_]*):")
    missing = []
    stack: list[tuple[int, str]] = []  # (indent, name) of the enclosing keys
    for i, line in enumerate(lines):
        m = key.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prev = next((p for p in reversed(lines[:i]) if p.strip()), "")
        exempt = any(n in k8s_content for _, n in stack)
        if not prev.strip().startswith("#") and not exempt:
            missing.append(f"line {i + 1}: {line.strip()}")
        stack.append((indent, name))
    assert not missing, "values without a comment:\n" + "\n".join(missing)


def test_schema_covers_values_yaml() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v: Any, s: dict[str, Any], path: str) -> None:
        if not isinstance(v, dict) or "properties" not in s:
            return
        assert s.get("additionalProperties") is False, f"{path or '/'} is not strict"
        for k, sub in v.items():
            assert k in s["properties"], f"{path}/{k} missing from values.schema.json"
            walk(sub, s["properties"][k], f"{path}/{k}")

    walk(values, schema, "")


# ---------------------------------------------------------------- the CLI the chart runs


def _cli_main() -> Any:
    from cronwell.cli import main

    return main


def test_operator_is_a_cronwell_command() -> None:
    """The chart runs `cronwell operator`: the command must be registered (entry point
    `operator = "cronwell_operator.cli:operator"` in the `cronwell.cli` group)."""
    result = CliRunner().invoke(_cli_main(), ["operator", "--help"])
    assert result.exit_code == 0, result.output


def test_every_command_and_flag_the_chart_passes_exists(rendered: list[dict[str, Any]]) -> None:
    """`cronwell <args> --help` for every container: click rejects an unknown command or
    option before it prints the help, so each flag the chart passes must exist."""
    main = _cli_main()
    from cronwell_operator.cli import operator

    # Until `operator` is registered (test_operator_is_a_cronwell_command), check its flags
    # on the command itself, without changing the shared `main` group.
    registered = "operator" in main.list_commands(click.Context(main))
    seen = set()
    for where, spec in pod_specs(rendered):
        for c in spec["containers"]:
            assert "command" not in c, f"{where}: the image's ENTRYPOINT is `cronwell`"
            args = [str(a) for a in c["args"]]
            seen.add(args[0])
            if args[0] == "operator" and not registered:
                result = CliRunner().invoke(operator, [*args[1:], "--help"])
            else:
                result = CliRunner().invoke(main, [*args, "--help"])
            assert result.exit_code == 0, f"{where}: cronwell {' '.join(args)}:\n{result.output}"
    assert seen - {"ui"} == {"operator", "scheduler", "worker", "migrate"}


def test_scheduler_and_worker_liveness_is_progress_not_a_port(
    rendered: list[dict[str, Any]],
) -> None:
    """Liveness means progress (invariant 9): schedulers and workers are probed on
    /healthz, which fails while a database loop is stalled; a TCP check passes then."""
    deployments = [
        d for d in of_kind(rendered, "Deployment") if component(d) in ("scheduler", "worker")
    ]
    assert {component(d) for d in deployments} >= {"scheduler", "worker"}
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            probe = c["livenessProbe"]
            assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}, d["metadata"]


def test_optional_parts_switch_off_cleanly() -> None:
    base = ("-f", str(CHART / "ci" / "default-values.yaml"))
    no_operator = render(*base, "--set", "operator.enabled=false")
    for kind in ("ClusterRole", "Role", "RoleBinding", "ValidatingWebhookConfiguration", "Secret"):
        assert not of_kind(no_operator, kind), kind
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in no_operator}
    assert "operator" not in components

    no_webhook = render(*base, "--set", "operator.webhook.enabled=false")
    assert not of_kind(no_webhook, "ValidatingWebhookConfiguration")
    op = named(no_webhook, "Deployment", f"{RELEASE}-cronwell-operator")
    c = op["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--webhook") for a in c["args"])
    assert c["readinessProbe"]["tcpSocket"]["port"] == "metrics"

    bare = render(
        *base, "--set", "worker.pools=null", "--set", "migration.enabled=false",
        "--set", "networkPolicy.enabled=false", "--set", "operator.leaderElection.enabled=false",
    )  # fmt: skip
    assert [component(d) for d in of_kind(bare, "Deployment")] == ["operator", "scheduler"]
    for kind in ("Job", "NetworkPolicy"):
        assert not of_kind(bare, kind), kind
    (self_role,) = of_kind(bare, "Role")
    assert {r for rule in self_role["rules"] for r in rule["resources"]} == {
        "horizontalpodautoscalers"
    }
    op_args = named(bare, "Deployment", f"{RELEASE}-cronwell-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--no-leader-election" in op_args
