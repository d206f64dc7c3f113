"""examples/gitops (Flux): the kustomize folders build, the HelmRelease's values pass the
chart's strict schema and render, the Flux paths exist, ScheduledJobs wait for cronwell,
and the sample ScheduledJob is valid."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell.loader import load
from cronwell.testing.controlplane import ControlPlaneError, find_assets
from tests.unit.test_chart import CHART, helm

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "examples" / "gitops"


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
    out = helm("template", release["spec"]["releaseName"], str(CHART), "-n", ns, "-f", str(values))
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    workers = [
        d
        for d in rendered
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert len(workers) == 2
    ignore = release["spec"]["driftDetection"]["ignore"][0]
    assert ignore["paths"] == ["/spec/replicas"]
    selector = dict([ignore["target"]["labelSelector"].split("=")])
    assert all(selector.items() <= w["metadata"]["labels"].items() for w in workers)


def test_sample_scheduledjob_is_valid() -> None:
    loaded, errors = load((GITOPS / "apps" / "scheduledjobs",))
    assert not errors, errors
    assert [i.job.metadata.name for i in loaded] == ["nightly-report"]
