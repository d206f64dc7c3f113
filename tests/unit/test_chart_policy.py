"""Policy checks on what ships: checkov (offline) on the rendered chart and the Dockerfile,
the Dockerfile's shape (non-root user, `cronwell` entrypoint) and the console script.

checkov is a tool, not a dependency of cronwell: it pins old versions of packages the
project uses (packaging, python-dateutil), so it lives in its own virtualenv
(`make checkov`: ~/.cache/cronwell/checkov). Found through $CHECKOV, PATH or that venv;
skipped when absent, except under CI=true, where its absence fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_chart import CHART, NAMESPACE, RELEASE, WORKERPOOL_SERVED, helm

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"

#: Checks skipped on every render, each for a reason:
ALWAYS_SKIPPED = {
    # "CPU limits should be set": deliberately absent. CPU limits throttle a process that
    # has idle cores next to it, which shows up as start lag during :00 bursts; requests
    # (scheduling) and memory limits (the resource that cannot be throttled) are set.
    # Users can still set resources.limits.cpu per component.
    "CKV_K8S_11",
}
#: Skipped only for the default render, because they are the user's choice of image, and
#: the full render (digest + pullPolicy Always) passes them:
DEFAULT_ONLY_SKIPPED = {
    "CKV_K8S_43",  # "Image should use digest": image.digest / pools[].image.digest
    "CKV_K8S_15",  # "Image Pull Policy should be Always": IfNotPresent suits immutable tags
}
# Skipped inside the chart itself (annotation `checkov.io/skip1`, so users' scans see it):
# CKV_K8S_38 on the operator Deployment, the one pod that needs an API token.
# Skipped inside the Dockerfile (comment): CKV_DOCKER_2, HEALTHCHECK (Kubernetes ignores it);
# CKV_DOCKER_7, a tagged base, which checkov cannot see through `FROM ${BASE_IMAGE}` (the
# test below checks the ARG's default instead).


def checkov_binary() -> str:
    candidates = [
        os.environ.get("CHECKOV"),
        shutil.which("checkov"),
        str(Path.home() / ".cache" / "cronwell" / "checkov" / "bin" / "checkov"),
    ]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    if os.environ.get("CI"):
        pytest.fail("checkov is not installed: run `make checkov`")
    pytest.skip("checkov is not installed (`make checkov`)")


def checkov(target: Path, framework: str, skip: set[str]) -> dict[str, Any]:
    """Run checkov offline (no policy download, no platform) and return its JSON report."""
    argv = [checkov_binary(), "--framework", framework, "--skip-download",
            "--compact", "-o", "json"]  # fmt: skip
    argv += ["-d", str(target)] if target.is_dir() else ["-f", str(target)]
    if skip:
        argv += ["--skip-check", ",".join(sorted(skip))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_"))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    (ours,) = [r for r in reports if r["check_type"] == framework]
    return dict(ours)


def failures(report: dict[str, Any]) -> list[str]:
    return [
        f"{c['check_id']} {c['check_name']}: {c['resource']}"
        for c in report["results"]["failed_checks"]
    ]


@pytest.mark.parametrize(
    ("values", "api_versions", "skip"),
    [
        # as on a fresh install: no WorkerPools, worker Deployments with `replicas`
        ("default-values.yaml", (), ALWAYS_SKIPPED | DEFAULT_ONLY_SKIPPED),
        # WorkerPools rendered, worker replicas left to the operator
        ("full-values.yaml", WORKERPOOL_SERVED, ALWAYS_SKIPPED),
    ],
)
def test_rendered_chart_passes_checkov(
    values: str, api_versions: tuple[str, ...], skip: set[str], tmp_path: Path
) -> None:
    out = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "-f", str(CHART / "ci" / values), *api_versions,
    ).stdout  # fmt: skip
    (tmp_path / "manifests.yaml").write_text(out)
    report = checkov(tmp_path, "kubernetes", skip)
    summary = report["summary"]
    print(f"checkov kubernetes {values}: {summary}", file=sys.stderr)
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 100
    assert not failures(report), "\n".join(failures(report))
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped == {"CKV_K8S_38"}, "only the operator's documented skip"


def test_dockerfile_passes_checkov(tmp_path: Path) -> None:
    shutil.copy(DOCKERFILE, tmp_path / "Dockerfile")
    report = checkov(tmp_path, "dockerfile", set())
    print(f"checkov dockerfile: {report['summary']}", file=sys.stderr)
    assert not failures(report), "\n".join(failures(report))
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped == {"CKV_DOCKER_2", "CKV_DOCKER_7"}


# --------------------------------------------------------------------------- Dockerfile


def _stages() -> list[list[tuple[str, str]]]:
    """(INSTRUCTION, arguments) per build stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        if instr.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr.upper(), rest.strip()))
    return stages


def test_dockerfile_is_multi_stage_non_root_with_cronwell_entrypoint() -> None:
    builder, runtime = _stages()
    # The base is an argument (hack/build-image.sh passes a local Debian base); Docker users
    # get the official slim bookworm Python 3.11 image, by tag.
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm", base.group(1))
    assert builder[0][1] == "${BASE_IMAGE} AS builder"
    assert any(i == "RUN" and "pip wheel" in a for i, a in builder)
    assert runtime[0][1] == "${BASE_IMAGE} AS runtime"
    users = [a for i, a in runtime if i == "USER"]
    assert users, "the runtime stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid == "10001" and gid in ("", "10001"), "numeric non-root uid (runAsNonRoot checks it)"
    assert any(i == "RUN" and "--uid 10001" in a for i, a in runtime)
    entrypoint = [json.loads(a) for i, a in runtime if i == "ENTRYPOINT"]
    cmd = [json.loads(a) for i, a in runtime if i == "CMD"]
    assert entrypoint[-1] == ["cronwell"]
    assert cmd[-1] == ["--help"]
    values_uid = re.search(r"runAsUser: (\d+)", (CHART / "values.yaml").read_text())
    assert values_uid and values_uid.group(1) == uid, "the chart runs as the image's user"
    # `make docker-build`/`make image` tag pyproject's version; the chart's default tag is
    # its appVersion: the two must name the same image for `make deploy` and kind load.
    app_version = re.search(
        r'^appVersion: "?([^"\s]+)"?$', (CHART / "Chart.yaml").read_text(), re.M
    )
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert app_version and app_version.group(1) == version


def test_dockerignore_keeps_what_the_build_copies() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    (builder, _) = _stages()
    copied = {
        src.rstrip("/")
        for i, a in builder
        if i == "COPY" and "--from" not in a
        for src in a.split()[:-1]
    }
    assert copied <= allowed, copied - allowed
    assert {"pyproject.toml", "README.md", "cronwell", "operator", "worker"} <= copied


@pytest.mark.parametrize(
    "command", ["--help", "scheduler --help", "worker --help", "migrate --help"]
)
def test_console_script_runs_the_image_commands(command: str) -> None:
    """What the image's ENTRYPOINT runs: the installed `cronwell` console script."""
    script = Path(sys.executable).parent / "cronwell"
    proc = subprocess.run(
        [str(script), *command.split()], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage: cronwell" in proc.stdout
