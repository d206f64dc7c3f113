"""Kubernetes-side helpers of the e2e and node tests: namespaces, per-module databases,
helm, and the operator started the way most e2e modules start it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.controlplane import (
    SERVICE_ACCOUNT_ISSUER,
    Cluster,
    ControlPlaneError,
    find_assets,
)
from cronwell_operator.testing import FAST_LEASE_ARGS, OperatorProcess, create_database
from tests.helpers import procs

ROOT = Path(__file__).resolve().parents[2]


def fresh_namespace(kube: Cluster, kube_api: Any, prefix: str) -> Iterator[str]:
    """Create `<prefix>-<random>`, yield its name, delete it (it stays Terminating without
    a controller-manager). Fixtures `yield from` it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(kube_api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def service_account_token(
    admin: Any, ns: str, sa: str, audiences: tuple[str, ...] = (SERVICE_ACCOUNT_ISSUER,)
) -> str:
    """A TokenRequest token of `ns/sa` for `audiences`, valid an hour (what the kubelet
    projects into a pod, or `kubectl create token` prints)."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=list(audiences), expiration_seconds=3600)
    )
    answer = client.CoreV1Api(admin).create_namespaced_service_account_token(sa, ns, request)
    assert answer.status is not None and answer.status.token
    return str(answer.status.token)


def service_account_kubeconfig(kube: Cluster, admin: Any, ns: str, sa: str, path: Path) -> Path:
    """A kubeconfig whose only credential is a token of `ns/sa`, for the API server and CA
    of `kube`'s own kubeconfig."""
    own = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c for c in own["contexts"] if c["name"] == own["current-context"])
    cluster = next(c for c in own["clusters"] if c["name"] == context["context"]["cluster"])
    user = f"system:serviceaccount:{ns}:{sa}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": user, "user": {"token": service_account_token(admin, ns, sa)}}],
                "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": user}}],
                "current-context": sa,
            }
        )
    )
    path.chmod(0o600)
    return path


class Helm:
    """The helm CLI from the envtest assets, bound to `kube` and to its own config/cache
    dirs under `home` (never the user's). Shared by the chart test modules."""

    def __init__(self, kube: Cluster, home: Path):
        try:
            self.binary = find_assets(("helm",)) / "helm"
        except ControlPlaneError as e:
            pytest.fail(f"helm is needed for the chart tests: {e}")
        self.kube = kube
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kube.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{proc.stderr}")
        return proc


def crd_namespace(kube: Cluster, kube_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the requesting test module, with cronwell's CRDs
    installed. Fixtures `yield from` it."""
    kube.install_crds([ROOT / "crds"])
    yield from fresh_namespace(kube, kube_api, _module_prefix(request).replace("_", "-"))


def store_database(
    pg_server: EmbeddedPostgres, template_db: str, request: pytest.FixtureRequest
) -> str:
    """A migrated database of its own, named after the requesting test module: the URL its
    operator and workers share."""
    prefix = _module_prefix(request)
    return create_database(pg_server.port, template_db, f"{prefix}_{uuid.uuid4().hex[:8]}")


def _module_prefix(request: pytest.FixtureRequest) -> str:
    name: str = request.module.__name__
    return name.rsplit(".", 1)[-1].removeprefix("test_")[:20]


@pytest.fixture(name="ns")
def namespace_per_test(
    kube: Cluster, kube_api: Any, request: pytest.FixtureRequest
) -> Iterator[str]:
    """`ns` for one test (conftest's is per module): import it into a module to override."""
    yield from crd_namespace(kube, kube_api, request)


@pytest.fixture(name="store")
def store_per_test(
    pg_server: EmbeddedPostgres, template_db: str, request: pytest.FixtureRequest
) -> str:
    """`store` for one test (conftest's is per module): import it into a module to override."""
    return store_database(pg_server, template_db, request)


#: Status writes as fast as tests need them (the defaults protect a shared API server).
FAST_STATUS_ARGS = ("--status-qps", "100", "--status-burst", "100")


def operator_args(ns: str, *extra: str) -> list[str]:
    """The operator serving `ns` alone, with a Lease of its own and fast lease timings."""
    return ["-n", ns, "--lease-name", f"op-{ns}", *FAST_LEASE_ARGS, *extra]


@contextmanager
def running_operator(
    kube: Cluster, ns: str, store: str, log: Path, *extra: str, identity: str = "op-1"
) -> Iterator[OperatorProcess]:
    """An operator (`operator_args`) started and ready; stopped on the way out."""
    op = OperatorProcess(
        kube.kubeconfig, store, log, identity=identity, args=operator_args(ns, *extra)
    )
    try:
        op.start().wait_ready(120)
        yield op
    finally:
        op.stop()


def module_operator(
    kube: Cluster, ns: str, store: str, tmp: pytest.TempPathFactory, identity: str
) -> Iterator[OperatorProcess]:
    """A module's operator (fast status writes), its ScheduledJobs deleted on the way out
    (their finalizers need it running)."""
    log = tmp.mktemp("operator") / "operator.log"
    with running_operator(kube, ns, store, log, "--status-qps", "100", identity=identity) as op:
        yield op
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)


def set_job_status(kube_api: Any, namespace: str, name: str, outcome: str) -> None:
    """What the Job controller would write when the Job finishes."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    now = start + timedelta(seconds=4)
    cond = {
        "status": "True",
        "lastProbeTime": now.isoformat(),
        "lastTransitionTime": now.isoformat(),
    }
    if outcome == "Complete":
        status = {
            "startTime": start.isoformat(),
            "completionTime": now.isoformat(),
            "succeeded": 1,
            "conditions": [
                {**cond, "type": "SuccessCriteriaMet", "reason": "CompletionsReached"},
                {**cond, "type": "Complete", "reason": "CompletionsReached"},
            ],
        }
    else:
        message = "Job has reached the specified backoff limit"
        status = {
            "startTime": start.isoformat(),
            "failed": 1,
            "conditions": [
                {**cond, "type": "FailureTarget", "reason": "BackoffLimitExceeded",
                 "message": message},
                {**cond, "type": "Failed", "reason": "BackoffLimitExceeded", "message": message},
            ],
        }  # fmt: skip
    client.BatchV1Api(kube_api).patch_namespaced_job_status(
        name, namespace, {"status": status}, _content_type="application/merge-patch+json"
    )


@contextmanager
def running_stack(
    kube: Cluster, ns: str, store: str, logs: Path, *worker_args: str, worker_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """Operator (fast status writes), scheduler and one worker (`worker_args`, environment
    plus `worker_env`), all on `store`; on the way out the namespace's ScheduledJobs are
    deleted and the processes stopped, and the worker log's tail is printed."""
    op = OperatorProcess(
        kube.kubeconfig, store, logs / "operator.log", args=operator_args(ns, *FAST_STATUS_ARGS)
    )
    env = {"CRONWELL_DATABASE_URL": store}
    scheduler = procs.spawn("scheduler", env=env, log=logs / "scheduler.log")
    worker = procs.spawn("worker", *worker_args, env=env | worker_env, log=logs / "worker.log")
    try:
        op.start().wait_ready(120)
        yield op
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)
    finally:
        op.stop()
        for p in (scheduler, worker):
            procs.stop(p)
        print("\n--- worker log (tail) ---\n" + (logs / "worker.log").read_text()[-3000:])
