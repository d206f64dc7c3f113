"""examples/gitops (Flux) and examples/argocd: the kustomize folders build, the chart's
values in both pass its strict schema and render, the Flux paths exist, ScheduledJobs wait
for cronwell, the sample ScheduledJob is valid, worker replicas are left to the operator
(never in Git, drift ignored), and the Argo CD health checks (Lua, run with lupa) map the
statuses the operator's own code builds to the right health."""

from __future__ import annotations

import dataclasses
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell.loader import load
from cronwell.store.status_changes import JobStatus
from cronwell.testing.controlplane import ControlPlaneError, find_assets
from cronwell_operator import status_build
from tests.unit.test_chart import CHART, WORKERPOOL_SERVED, helm
from tests.unit.test_crd_status import NOW, row

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "examples" / "gitops"
ARGOCD = ROOT / "examples" / "argocd"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(GITOPS.rglob("*.yaml")) for d in docs(p)]


def one(kind: str) -> dict[str, Any]:
    (found,) = [d for d in all_docs() if d["kind"] == kind]
    return found


def kustomize(path: Path) -> list[dict[str, Any]]:
    try:
        kubectl = find_assets(("kubectl",)) / "kubectl"
    except ControlPlaneError as e:
        pytest.skip(f"kubectl not available: {e}")
    out = subprocess.run(
        [str(kubectl), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_flux_kustomizations_point_at_existing_folders_in_order() -> None:
    ks = {
        d["metadata"]["name"]: d
        for d in all_docs()
        if d["apiVersion"].startswith("kustomize.toolkit.fluxcd.io/")
    }
    assert sorted(ks) == ["cronwell", "scheduledjobs"]
    for k in ks.values():
        assert (ROOT / k["spec"]["path"]).is_dir(), k["spec"]["path"]
        assert k["spec"]["prune"] is True and k["spec"]["wait"] is True
    assert ks["scheduledjobs"]["spec"]["dependsOn"] == [{"name": "cronwell"}]


def test_kustomize_builds_and_namespace_enforces_restricted() -> None:
    built = kustomize(GITOPS / "apps" / "cronwell")
    (ns,) = [d for d in built if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    (release,) = [d for d in built if d["kind"] == "HelmRelease"]
    assert release["metadata"]["namespace"] == ns["metadata"]["name"]
    jobs = kustomize(GITOPS / "apps" / "scheduledjobs")
    assert {d["kind"] for d in jobs} == {"Namespace", "ScheduledJob"}


def test_helmrelease_chart_and_values_render(tmp_path: Path) -> None:
    release = one("HelmRelease")
    source = one("GitRepository")
    chart = release["spec"]["chart"]["spec"]
    assert chart["sourceRef"]["name"] == source["metadata"]["name"]
    assert (ROOT / chart["chart"]).resolve() == CHART
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(release["spec"]["values"]))
    ns = release["metadata"]["namespace"]
    # helm-controller renders with the cluster's API versions: the WorkerPool CRD is served
    # once the first install created it.
    out = helm("template", release["spec"]["releaseName"], str(CHART), "-n", ns, "-f", str(values),
               *WORKERPOOL_SERVED)  # fmt: skip
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    workers = [
        d
        for d in rendered
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert len(workers) == 2
    assert all("replicas" not in p for p in release["spec"]["values"]["worker"]["pools"])
    assert all("replicas" not in w["spec"] for w in workers), "the operator owns replicas"
    ignore = release["spec"]["driftDetection"]["ignore"][0]
    assert ignore["paths"] == ["/spec/replicas"]
    selector = dict([ignore["target"]["labelSelector"].split("=")])
    assert all(selector.items() <= w["metadata"]["labels"].items() for w in workers)


def test_sample_scheduledjob_is_valid() -> None:
    loaded, errors = load((GITOPS / "apps" / "scheduledjobs",))
    assert not errors, errors
    assert [i.job.metadata.name for i in loaded] == ["nightly-report"]


# ----------------------------------------------------------------------------- Argo CD


def argo_app(path: str) -> dict[str, Any]:
    (app,) = [
        d
        for d in docs(ARGOCD / "application.yaml")
        if d["kind"] == "Application" and d["spec"]["source"]["path"] == path
    ]
    return app


def test_argocd_chart_app_renders_and_leaves_worker_replicas_to_the_operator(
    tmp_path: Path,
) -> None:
    app = argo_app("charts/cronwell")
    source, ns = app["spec"]["source"], app["spec"]["destination"]["namespace"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    # Argo CD passes the cluster's API versions (--api-versions) from its first sync after
    # the WorkerPool CRD exists.
    out = helm("template", source["helm"]["releaseName"], str(CHART), "-n", ns, "-f", str(values),
               *WORKERPOOL_SERVED)  # fmt: skip
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    workers = {
        d["metadata"]["name"]: d
        for d in rendered
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    assert workers and all("replicas" not in w["spec"] for w in workers.values())
    ignored = {
        i["name"]
        for i in app["spec"]["ignoreDifferences"]
        if (i["group"], i["kind"], i["jsonPointers"]) == ("apps", "Deployment", ["/spec/replicas"])
    }
    assert ignored == set(workers), "one ignoreDifferences entry per worker Deployment"
    assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]
    # `helm template` cannot look up the previous certificate: cert-manager makes it stable.
    assert {d["kind"] for d in rendered} >= {"Certificate", "ValidatingWebhookConfiguration"}
    labels = app["spec"]["syncPolicy"]["managedNamespaceMetadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_argocd_scheduledjobs_app_diffs_server_side() -> None:
    app = argo_app("scheduledjobs")
    assert app["metadata"]["annotations"]["argocd.argoproj.io/compare-options"] == (
        "ServerSideDiff=true"
    )
    assert "ignoreDifferences" not in app["spec"], "nothing of a ScheduledJob may drift"


def health_script(kind: str) -> str:
    (cm,) = docs(ARGOCD / "argocd-cm.yaml")
    assert cm["metadata"]["name"] == "argocd-cm"
    script: str = cm["data"][f"resource.customizations.health.cronwell.dev_{kind}"]
    return script


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """Run the health check as Argo CD does (Lua 5.1, the object as global `obj`)."""
    lua51 = pytest.importorskip("lupa.lua51", reason="lupa runs the Argo CD Lua health checks")
    lua = lua51.LuaRuntime()

    def clean(v: Any) -> Any:  # the API server never returns nulls
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    lua.globals().obj = lua.table_from(clean(obj), recursive=True)
    hs = lua.execute(health_script(kind))
    return str(hs["status"]), str(hs["message"])


def scheduled_job(st: dict[str, Any] | None, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "j", "generation": generation}}
    if st is not None:
        obj["status"] = st
    return obj


DEAD = row(consecutive_failures=2, dead=2, last_state="dead", last_reason="AttemptsExhausted",
           last_failure_time=NOW - timedelta(minutes=1), last_error="HTTP 500",
           last_key="k")  # fmt: skip


@pytest.mark.parametrize(
    ("job_row", "spec_error", "generation", "expected", "in_message"),
    [
        pytest.param(row(), None, 3, "Healthy", "the store runs", id="scheduled"),
        pytest.param(row(schedule_done=True), None, 3, "Healthy", "no further run", id="done"),
        pytest.param(None, None, 1, "Progressing", "not in the store", id="not-reconciled"),
        pytest.param(None, (1, "spec.schedule: bad"), 1, "Degraded", "spec.schedule", id="invalid"),
        pytest.param(row(), (4, "spec.timeZone: bad"), 4, "Degraded", "InvalidSpec", id="bad-edit"),
        pytest.param(row(), None, 4, "Progressing", "generation 4", id="edit-pending"),
        pytest.param(
            row(suspended=True, suspended_reason="Manual"),
            None,
            3,
            "Suspended",
            "suspended",
            id="suspended",
        ),
        pytest.param(
            dataclasses.replace(DEAD, suspended=True, suspended_reason="SuspendedAfterFailures"),
            None,
            3,
            "Degraded",
            "SuspendedAfterFailures",
            id="auto-suspended",
        ),
        pytest.param(DEAD, None, 3, "Degraded", "dead-lettered", id="dead-lettered"),
        pytest.param(
            row(last_failure_time=NOW - timedelta(seconds=5), last_error="timeout", failed=1),
            None,
            3,
            "Healthy",
            "timeout",
            id="retrying",
        ),
    ],
)
def test_scheduledjob_health_from_the_operators_statuses(
    job_row: JobStatus | None,
    spec_error: tuple[int, str] | None,
    generation: int,
    expected: str,
    in_message: str,
) -> None:
    st = status_build.build_status(job_row, previous=None, spec_error=spec_error, now=NOW)
    state, message = health("ScheduledJob", scheduled_job(st, generation))
    assert state == expected, message
    assert in_message in message


def test_scheduledjob_without_status_is_progressing() -> None:
    assert health("ScheduledJob", scheduled_job(None))[0] == "Progressing"
    assert health("ScheduledJob", scheduled_job({"counters": {}}))[0] == "Progressing"


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], "Progressing"),
        (
            [
                {
                    "type": "TargetFound",
                    "status": "False",
                    "reason": "NotFound",
                    "message": "deployment w not found",
                }
            ],
            "Degraded",
        ),
        (
            [{"type": "TargetFound", "status": "True"}, {"type": "Ready", "status": "True"}],
            "Healthy",
        ),
        (
            [{"type": "TargetFound", "status": "True"}, {"type": "Ready", "status": "False"}],
            "Degraded",
        ),
        ([{"type": "Ready", "status": "Unknown"}], "Progressing"),
    ],
)
def test_workerpool_health(conditions: list[dict[str, str]], expected: str) -> None:
    obj = {"metadata": {"name": "default"}, "status": {"conditions": conditions}}
    assert health("WorkerPool", obj)[0] == expected
