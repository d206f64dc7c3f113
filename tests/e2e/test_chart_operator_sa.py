"""The chart's RBAC proven by use: `helm install` into a real API server, then the real
operator process run with nothing but a token of the chart's operator ServiceAccount, the
args and env of the chart's operator Deployment, and the chart's webhook certificate.

A small stand-in for the kubelet (`pod_runtime`) turns the installed Deployment's pod
template into a local process: args and env are copied, `fieldRef`s are resolved, each
Secret volume is written to a local directory and its mount path rewritten there. Only the
ports are changed (every process here shares one network namespace) and the identity is a
made-up pod name.

What this covers: a fresh install with the default values (WorkerPool objects skipped
while the cluster does not serve the kind, NOTES.txt saying so) and the `helm upgrade
--reuse-values` that then adds them; reconcile (finalizer + store row), status write-back,
the leader Lease in the release namespace, the webhook, the pre-scaler, and what the same
token may NOT do.

The webhook goes through the chart's own ValidatingWebhookConfiguration (Service
clientConfig, caBundle and certificate from the chart's Secret), unchanged. With no
kube-proxy a Service's ClusterIP routes nowhere, so this module starts its own API server
with `--enable-aggregator-routing`: it then calls a Service webhook at an address from the
Service's endpoints, as it does for aggregated APIs, with TLS server name
`<service>.<namespace>.svc` as always. The test writes those endpoints (the operator's
address, once its port is open: what the endpoint controller does for a Ready pod). Not
covered: kube-proxy/CNI routing to the pod, and the cert-manager variant.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.controlplane import (
    ControlPlane,
    KubectlError,
    free_port,
)
from cronwell_operator.testing import OperatorProcess, create_database, sql, wait_until
from tests.helpers.kube import Helm, service_account_kubeconfig
from tests.helpers.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cronwell"
RELEASE = "cw"
OPERATOR = f"{RELEASE}-cronwell-operator"
WORKER = f"{RELEASE}-cronwell-worker-default"
WEBHOOK_SERVICE = f"{RELEASE}-cronwell-webhook"
GROUP, VERSION = "cronwell.dev", "v1alpha1"
FINALIZER = "cronwell.dev/finalizer"
DENIED = 'admission webhook "validate-scheduledjob.cronwell.dev" denied the request: '


@dataclass
class Release:
    ns: str
    tenant: str
    store: str
    admin: Any  # kubernetes ApiClient as cluster admin
    operator_sa: Any  # kubernetes ApiClient with the operator ServiceAccount's token
    operator_kubeconfig: Path
    manifest: str  # what the release holds after the upgrade
    install_notes: str  # NOTES of the fresh install
    install_manifest: str  # what the fresh install created
    pools_after_install: list[str]  # WorkerPool names in the release namespace then
    upgrade_notes: str  # NOTES of the upgrade
    pools_after_upgrade: list[str]
    replicas_after_upgrade: int  # of the worker Deployment, before the operator runs


# ------------------------------------------------------------------------------- helpers


def host_address() -> str | None:
    """A non-loopback address of this machine: Endpoints may not point at loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.254.254.254", 9))  # UDP: picks the route, sends nothing
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") else address


def pod_runtime(
    admin: Any, deployment: dict[str, Any], root: Path, pod_name: str
) -> tuple[list[str], dict[str, str]]:
    """The container's args and env as the kubelet would give them to the process, with
    every volume materialised under `root` (Secrets written out, emptyDirs empty) and the
    mount paths in args and env rewritten to those directories."""
    ns = deployment["metadata"]["namespace"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "command" not in container, "the image's ENTRYPOINT (cronwell) is the command"
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    mounts: dict[str, str] = {}
    for mount in container.get("volumeMounts") or []:
        volume, local = volumes[mount["name"]], root / mount["name"]
        local.mkdir(parents=True)
        if "secret" in volume:
            secret = client.CoreV1Api(admin).read_namespaced_secret(
                volume["secret"]["secretName"], ns
            )
            data = secret.data or {}
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (local / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
        else:
            assert "emptyDir" in volume, f"volume kind not emulated: {volume}"
        mounts[mount["mountPath"]] = str(local)

    def localise(value: str) -> str:
        for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return local + value[len(mount_path) :]
        return value

    args = []
    for arg in container.get("args") or []:
        flag, eq, value = arg.partition("=")
        args.append(f"{flag}={localise(value)}" if eq else localise(arg))
    fields = {"metadata.name": pod_name, "metadata.namespace": ns}
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # the API server drops an empty `value`
            env[var["name"]] = localise(str(var.get("value", "")))
    return args, env


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    assert any(a.startswith(f"{flag}=") for a in args), f"the chart no longer passes {flag}"
    return [f"{flag}={value}" if a.startswith(f"{flag}=") else a for a in args]


def forbidden(call: Any, *args: Any, **kwargs: Any) -> bool:
    """True when the API server answers 403 to this call."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status == 403:
            return True
        raise
    return False


def sj_manifest(name: str, spec: dict[str, Any]) -> str:
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ScheduledJob",
           "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return json.dumps(doc)


def get_sj(admin: Any, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(admin).get_namespaced_custom_object(
        GROUP, VERSION, ns, "scheduledjobs", name
    )
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def plane(control_plane_assets: Path) -> Iterator[ControlPlane]:
    """A control plane of this module's own: its API server routes Service webhooks to the
    Service's endpoints (see the module docstring)."""
    if host_address() is None:
        pytest.skip("no non-loopback address here for the webhook Service's endpoints")
    with ControlPlane(
        control_plane_assets, extra_apiserver_args={"enable-aggregator-routing": "true"}
    ) as p:
        yield p


@pytest.fixture(scope="module")
def release(
    plane: ControlPlane,
    pg_server: EmbeddedPostgres,
    template_db: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    ns, tenant = f"cronwell-{suffix}", f"team-{suffix}"
    tmp = tmp_path_factory.mktemp("chart-sa")
    admin = config.new_client_from_config(config_file=str(plane.kubeconfig))
    core = client.CoreV1Api(admin)
    for name in (ns, tenant):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    plane.kubectl("-n", tenant, "create", "secret", "generic", "tenant-token", "--from-literal=t=x")
    store = create_database(pg_server.port, template_db, f"chart_sa_{suffix}")
    # What an administrator provides: the database URL Secret the chart mounts.
    plane.kubectl("-n", ns, "create", "secret", "generic", "cronwell-database",
                  f"--from-literal=url={store}")  # fmt: skip
    helm = Helm(plane, tmp / "helm")
    custom = client.CustomObjectsApi(admin)

    def pools() -> list[str]:
        found = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "workerpools")
        return sorted(p["metadata"]["name"] for p in found["items"])

    # --no-hooks: the migration Job's pod would never run (no kubelet); the operator
    # migrates at start anyway. sslmode=disable: the test PostgreSQL has no TLS. Otherwise
    # the default values: WorkerPool objects on, which this fresh cluster cannot serve yet
    # (the release creates their CRD), so the install skips them...
    install = helm("install", RELEASE, str(CHART), "--namespace", ns, "--no-hooks",
                   "-f", str(CHART / "ci" / "default-values.yaml"),
                   "--set", "database.sslmode=disable", "--timeout", "60s")  # fmt: skip
    install_manifest = helm("get", "manifest", RELEASE, "--namespace", ns).stdout
    plane.kubectl("wait", "--for=condition=Established", f"crd/workerpools.{GROUP}",
                  "--timeout=60s")  # fmt: skip
    pools_after_install = pools()
    # ...and the upgrade NOTES.txt gives adds them, now that the kind is served.
    upgrade = helm("upgrade", RELEASE, str(CHART), "--namespace", ns, "--no-hooks",
                   "--reuse-values", "--timeout", "60s")  # fmt: skip
    scale = client.AppsV1Api(admin).read_namespaced_deployment_scale(WORKER, ns)
    manifest = helm("get", "manifest", RELEASE, "--namespace", ns).stdout
    kubeconfig = service_account_kubeconfig(plane, admin, ns, OPERATOR, tmp / "operator.kubeconfig")
    operator_sa = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield Release(
            ns,
            tenant,
            store,
            admin,
            operator_sa,
            kubeconfig,
            manifest,
            install.stdout,
            install_manifest,
            pools_after_install,
            upgrade.stdout,
            pools(),
            scale.spec.replicas,
        )
    finally:
        operator_sa.close()
        admin.close()


@pytest.fixture(scope="module")
def operator(
    plane: ControlPlane, release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The chart's operator container as a local process, authenticated as its
    ServiceAccount, and (once its webhook port is open) the endpoints of its Service."""
    tmp = tmp_path_factory.mktemp("operator-pod")
    deployment = release.admin.sanitize_for_serialization(
        client.AppsV1Api(release.admin).read_namespaced_deployment(OPERATOR, release.ns)
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == OPERATOR
    pod_name = f"{OPERATOR}-5d8f9c7b4-x7k2p"
    args, env = pod_runtime(release.admin, deployment, tmp / "volumes", pod_name)
    assert args[0] == "operator", args
    webhook_port, metrics_port = free_port(), free_port()
    args = replace_flag(args[1:], "--webhook-port", str(webhook_port))
    env["CRONWELL_METRICS_PORT"] = str(metrics_port)
    env["HOME"] = str(tmp)
    # The URL comes from the mounted Secret (CRONWELL_DATABASE_URL_FILE) only.
    op = OperatorProcess(
        release.operator_kubeconfig, "", tmp / "operator.log", identity=pod_name,
        args=args, env=env,
    )  # fmt: skip
    op.start()
    try:
        op.wait_ready(120)
        wait_until(lambda: _listening(webhook_port), 60, "the webhook port", check=op._alive)
        address = host_address()
        assert address is not None
        _publish_endpoints(plane, release.ns, address, webhook_port)
        yield op
    finally:
        op.stop()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _publish_endpoints(plane: ControlPlane, ns: str, address: str, port: int) -> None:
    """The webhook Service's endpoints, as the endpoint controllers would write them for a
    Ready operator pod (port name from the Service). Both kinds, whichever the API server's
    resolver reads."""
    endpoints = {
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": WEBHOOK_SERVICE, "namespace": ns},
        "subsets": [{"addresses": [{"ip": address}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }  # fmt: skip
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{WEBHOOK_SERVICE}-local", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": WEBHOOK_SERVICE}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }  # fmt: skip
    plane.kubectl("apply", "-f", "-", input=json.dumps(endpoints))
    plane.kubectl("apply", "-f", "-", input=json.dumps(endpoint_slice))


@pytest.fixture(scope="module")
def job(plane: ControlPlane, release: Release, operator: OperatorProcess) -> dict[str, Any]:
    """A ScheduledJob applied by a user (admin) in the tenant namespace, once reconciled."""
    manifest = sj_manifest("report", {"schedule": "*/10 * * * *", "target": {"log": {}}})
    _apply_when_admitted(plane, operator, release.tenant, manifest)
    return get_sj(release.admin, release.tenant, "report")


def _apply_when_admitted(
    plane: ControlPlane, operator: OperatorProcess, ns: str, manifest: str
) -> None:
    """kubectl apply, retried while the webhook cannot be reached yet (no endpoints seen by
    the API server's informer): the chart's failurePolicy is Fail."""

    def applied() -> bool:
        proc = plane.kubectl("apply", "-n", ns, "-f", "-", input=manifest, check=False)
        if proc.returncode == 0:
            return True
        assert "failed calling webhook" in proc.stderr, proc.stderr
        return False

    wait_until(applied, 60, "the webhook admitting a valid ScheduledJob", check=operator._alive)


# --------------------------------------------------------------------------------- tests


def test_the_operator_authenticates_as_the_chart_service_account(
    release: Release, operator: OperatorProcess
) -> None:
    review = client.AuthenticationV1Api(release.operator_sa).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert review.status.user_info.username == f"system:serviceaccount:{release.ns}:{OPERATOR}"
    kubeconfig = yaml.safe_load(release.operator_kubeconfig.read_text())
    (user,) = kubeconfig["users"]
    assert set(user["user"]) == {"token"}, "no other credential than the token"
    assert operator.kubeconfig == str(release.operator_kubeconfig)


def test_reconcile_adds_the_finalizer_and_the_store_row(
    release: Release, operator: OperatorProcess, job: dict[str, Any]
) -> None:
    uid = job["metadata"]["uid"]
    rows = eventually(
        operator,
        lambda: sql(release.store, "SELECT * FROM cronwell_jobs WHERE id = %s", (uid,)),
        "the job row",
    )
    assert (rows[0]["namespace"], rows[0]["name"]) == (release.tenant, "report")
    obj = eventually(
        operator,
        lambda: FINALIZER in ((o := get_sj(release.admin, release.tenant, "report"))
                              ["metadata"].get("finalizers") or []) and o,
        "the finalizer",
    )  # fmt: skip
    assert obj["spec"] == job["spec"], "the operator never writes spec"


def test_status_is_written_back(
    release: Release, operator: OperatorProcess, job: dict[str, Any]
) -> None:
    obj = eventually(
        operator,
        lambda: (
            (o := get_sj(release.admin, release.tenant, "report"))
            .get("status", {})
            .get("observedGeneration")
            and o
        ),
        "status.observedGeneration",
    )
    assert obj["status"]["nextScheduleTime"].endswith("0:00Z")
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Scheduled")
    assert condition(obj, "Suspended")["status"] == "False"


def test_the_chart_webhook_refuses_a_bad_spec_naming_the_field(
    plane: ControlPlane, release: Release, operator: OperatorProcess, job: dict[str, Any]
) -> None:
    vwc = json.loads(
        plane.kubectl(
            "get", "validatingwebhookconfiguration", f"{WEBHOOK_SERVICE}-{release.ns}", "-o", "json"
        ).stdout
    )
    (hook,) = vwc["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert "url" not in hook["clientConfig"], "the chart's Service clientConfig, untouched"
    assert hook["clientConfig"]["service"]["name"] == WEBHOOK_SERVICE
    bad = sj_manifest("bad", {"schedule": "61 * * * *", "target": {"log": {}}})
    with pytest.raises(KubectlError) as refused:
        plane.kubectl("apply", "-n", release.tenant, "-f", "-", input=bad)
    stderr = str(refused.value.stderr)
    assert DENIED + "ScheduledJob bad: spec.schedule: cron '61 * * * *' does not parse" in stderr
    assert plane.kubectl("get", "sj", "bad", "-n", release.tenant, check=False).returncode != 0


def test_leader_lease_in_the_release_namespace(release: Release, operator: OperatorProcess) -> None:
    coordination = client.CoordinationV1Api(release.admin)
    lease = coordination.read_namespaced_lease(OPERATOR, release.ns)
    assert lease.spec.holder_identity == operator.identity
    first = lease.spec.renew_time
    eventually(
        operator,
        lambda: coordination.read_namespaced_lease(OPERATOR, release.ns).spec.renew_time != first,
        "a renewal of the Lease",
        timeout=60,
    )
    assert not coordination.list_namespaced_lease("default").items, "no Lease outside the release"


def test_the_operator_scales_the_worker_deployment(
    release: Release, operator: OperatorProcess
) -> None:
    """The chart leaves `replicas` out of the worker Deployment (the API server defaults it
    to 1) and renders a WorkerPool with a higher minReplicas: only the operator, through
    the scale subresource, can have raised it."""
    (rendered,) = [
        d
        for d in yaml.safe_load_all(release.manifest)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == WORKER
    ]
    assert "replicas" not in rendered["spec"]
    pool = client.CustomObjectsApi(release.admin).get_namespaced_custom_object(
        GROUP, VERSION, release.ns, "workerpools", "default"
    )
    assert pool["spec"]["scaleTargetRef"]["name"] == WORKER
    minimum = pool["spec"]["minReplicas"]
    assert minimum > 1, "the test needs minReplicas above the API server's default of 1"
    apps = client.AppsV1Api(release.admin)
    # Below the minimum, as after a `helm upgrade` that drops `replicas` (see below): the
    # operator must raise it, whatever it did before.
    apps.patch_namespaced_deployment_scale(WORKER, release.ns, {"spec": {"replicas": 1}})
    eventually(
        operator,
        lambda: apps.read_namespaced_deployment_scale(WORKER, release.ns).spec.replicas == minimum,
        f"the worker Deployment scaled to {minimum}",
    )

    def reported() -> dict[str, Any] | None:
        obj = client.CustomObjectsApi(release.admin).get_namespaced_custom_object(
            GROUP, VERSION, release.ns, "workerpools", "default"
        )
        st = obj.get("status") or {}
        return obj if st.get("currentReplicas") == minimum else None

    obj = eventually(operator, reported, "the WorkerPool status")
    assert obj["status"]["desiredReplicas"] == minimum
    assert condition(obj, "TargetFound")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "True"


def test_a_fresh_install_with_workerpool_objects_succeeds(release: Release) -> None:
    """Default values (WorkerPool objects on) on a cluster without the WorkerPool CRD: the
    install succeeds without them, the worker Deployment keeps its `replicas`, NOTES.txt
    gives the upgrade that adds them, and that upgrade does."""
    assert release.pools_after_install == [], "the kind was not served when the chart rendered"
    (worker,) = [
        d
        for d in yaml.safe_load_all(release.install_manifest)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == WORKER
    ]
    assert worker["spec"]["replicas"] == 2, "nothing else scales it until the WorkerPool exists"
    notes = release.install_notes
    assert "WorkerPool objects were skipped" in notes, notes
    assert f"helm upgrade {RELEASE} <chart> -n {release.ns} --reuse-values" in notes
    assert release.pools_after_upgrade == ["default"]
    assert "WorkerPool objects were skipped" not in release.upgrade_notes


def test_adding_workerpools_on_upgrade_leaves_replicas_to_the_operator(
    release: Release,
) -> None:
    """Documented in docs/deploy.md (Upgrading): the upgrade that adds the WorkerPool objects
    removes `replicas` from the worker Deployments, and Helm's three-way merge then resets
    them to the API server's default (1) until the operator (not running yet here) scales
    them back (test_the_operator_scales_the_worker_deployment)."""
    assert release.replicas_after_upgrade == 1


def test_the_operator_account_cannot_do_more(release: Release, job: dict[str, Any]) -> None:
    sa = release.operator_sa
    core, apps = client.CoreV1Api(sa), client.AppsV1Api(sa)
    custom = client.CustomObjectsApi(sa)
    assert forbidden(core.read_namespaced_secret, "tenant-token", release.tenant)
    assert forbidden(core.list_namespaced_secret, release.ns)
    # Worker Deployments: their scale subresource only, never the Deployment itself.
    scale = {"spec": {"replicas": 3}}
    assert not forbidden(apps.patch_namespaced_deployment_scale, WORKER, release.ns, scale,
                         dry_run="All")  # fmt: skip
    assert forbidden(apps.patch_namespaced_deployment, WORKER, release.ns, scale, dry_run="All")
    assert forbidden(apps.patch_namespaced_deployment_scale, f"{RELEASE}-cronwell-scheduler",
                     release.ns, scale, dry_run="All")  # fmt: skip
    assert forbidden(custom.delete_namespaced_custom_object, GROUP, VERSION, release.tenant,
                     "scheduledjobs", "report", dry_run="All")  # fmt: skip
    assert forbidden(custom.create_namespaced_custom_object, GROUP, VERSION, release.tenant,
                     "scheduledjobs", json.loads(sj_manifest("x", {"schedule": "@daily",
                                                                   "target": {"log": {}}})),
                     dry_run="All")  # fmt: skip


def test_the_operator_account_cannot_write_scheduledjob_spec(
    release: Release, job: dict[str, Any]
) -> None:
    """RBAC cannot limit fields (the finalizer needs patch): the chart's
    ValidatingAdmissionPolicy refuses spec changes from the operator's account, while a
    metadata-only patch from it still passes."""
    custom = client.CustomObjectsApi(release.operator_sa)
    assert forbidden(custom.patch_namespaced_custom_object, GROUP, VERSION, release.tenant,
                     "scheduledjobs", "report", {"spec": {"suspend": True}},
                     dry_run="All")  # fmt: skip
    custom.patch_namespaced_custom_object(GROUP, VERSION, release.tenant, "scheduledjobs",
                                          "report", {"metadata": {"labels": {"probe": "x"}}},
                                          dry_run="All")  # fmt: skip


def test_the_worker_account_has_no_api_access(
    plane: ControlPlane, release: Release, job: dict[str, Any], tmp_path: Path
) -> None:
    kubeconfig = service_account_kubeconfig(
        plane, release.admin, release.ns, f"{RELEASE}-cronwell-worker-default",
        tmp_path / "worker.kubeconfig",
    )  # fmt: skip
    worker = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core, custom = client.CoreV1Api(worker), client.CustomObjectsApi(worker)
        assert forbidden(core.read_namespaced_secret, "tenant-token", release.tenant)
        assert forbidden(core.read_namespaced_secret, "cronwell-database", release.ns)
        assert forbidden(custom.get_namespaced_custom_object, GROUP, VERSION, release.tenant,
                         "scheduledjobs", "report")  # fmt: skip
        assert forbidden(custom.patch_namespaced_custom_object_status, GROUP, VERSION,
                         release.tenant, "scheduledjobs", "report", {"status": {}},
                         dry_run="All")  # fmt: skip
    finally:
        worker.close()


def test_the_operator_log_has_no_forbidden(operator: OperatorProcess, job: dict[str, Any]) -> None:
    """Last: everything above ran; a refused request anywhere would show here."""
    out = operator.output()
    assert "operator ready" in out
    found = re.findall(r".*(?:forbidden|\(403\)|\b(?:status|code)\W{1,3}403\b).*", out, re.I)
    assert not found, "\n".join(found[:5])
