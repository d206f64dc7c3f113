"""`kubectl cronwell ...` through the real kubectl binary (which finds `kubectl-cronwell` on
PATH), against a real API server with the CRD, a real PostgreSQL and the real operator:
trigger sets the annotation the operator turns into one occurrence, runs and dlq read the
CR's rows from the store, suspend/resume patch spec.suspend, status condenses status, and
mistakes are one line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell import dispatch
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import (
    OperatorProcess,
    sql,
    wait_until,
)
from tests.helpers.kube import module_operator
from tests.helpers.store import fail_dead
from tests.unit.test_chart import CHART, render

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from module_operator(kube, ns, store, tmp_path_factory, "op-plugin")


@pytest.fixture(scope="module")
def kubeconfig(kube: Cluster, ns: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's kubeconfig with the test namespace as the context's namespace, so
    commands without -n exercise the default as users get it."""
    doc = yaml.safe_load(Path(kube.kubeconfig).read_text())
    for c in doc["contexts"]:
        c["context"]["namespace"] = ns
    path = tmp_path_factory.mktemp("kubeconfig") / "config"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def kubectl_cronwell(
    kube: Cluster, kubeconfig: Path, *args: str, db: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl cronwell ARGS` with the venv's bin on PATH, as a user with the plugin
    installed runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWELL_")}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "KUBECONFIG": str(kubeconfig)}
    if db is not None:
        env["CRONWELL_DATABASE_URL"] = db
    return subprocess.run(
        [str(kube.kubectl_binary), "cronwell", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def apply_sj(kube: Cluster, ns: str, name: str, extra: str = "") -> str:
    kube.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=(
            "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\n"
            f"metadata: {{name: {name}}}\n"
            "spec: {schedule: '0 0 1 1 *', target: {log: {message: hi}}" + extra + "}\n"
        ),
    )
    uid: str = get_sj(kube, ns, name)["metadata"]["uid"]
    return uid


def get_sj(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json").stdout)
    return out


def in_store(store: str, uid: str) -> dict[str, Any]:
    rows = wait_until(
        lambda: sql(store, "SELECT * FROM cronwell_jobs WHERE id = %s", (uid,)),
        60,
        f"job {uid} never reached the store",
    )
    return rows[0]


def test_plugin_is_found_by_kubectl(kube: Cluster, kubeconfig: Path) -> None:
    r = kubectl_cronwell(kube, kubeconfig, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage: kubectl cronwell" in r.stdout
    commands = r.stdout.split("Commands:")[1]
    listed = {line.split()[0] for line in commands.splitlines() if line.startswith("  ")}
    assert listed >= {"runs", "trigger", "dlq", "suspend", "resume", "status", "ui"}


def test_trigger_runs_once_per_id_and_runs_shows_it(
    kube: Cluster, kubeconfig: Path, ns: str, store: str, operator: OperatorProcess
) -> None:
    uid = apply_sj(kube, ns, "trig")
    in_store(store, uid)
    r = kubectl_cronwell(kube, kubeconfig, "trigger", "trig")  # context namespace
    assert r.returncode == 0, r.stderr
    value = get_sj(kube, ns, "trig")["metadata"]["annotations"]["cronwell.dev/trigger"]
    key = f"{uid}:trigger:{value}"
    assert f"requested trigger {value}" in r.stdout and f"idempotency key: {key}" in r.stdout
    wait_until(
        lambda: sql(store, "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = %s", (key,)),
        60,
        "the operator never turned the trigger annotation into an occurrence",
    )
    fixed = kubectl_cronwell(kube, kubeconfig, "trigger", "trig", "-n", ns, "--id", "deploy-7")
    assert f"idempotency key: {uid}:trigger:deploy-7" in fixed.stdout, fixed.stderr
    again = kubectl_cronwell(kube, kubeconfig, "trigger", "trig", "--id", "deploy-7")
    assert again.returncode == 0 and "already requested" in again.stdout
    wait_until(
        lambda: (
            len(sql(store, "SELECT 1 FROM cronwell_occurrences WHERE job_id = %s", (uid,))) == 2
        ),
        60,
        "expected exactly the two triggered occurrences",
    )

    runs = kubectl_cronwell(kube, kubeconfig, "runs", "trig", "--json", db=store)
    assert runs.returncode == 0, runs.stderr
    rows = [json.loads(line) for line in runs.stdout.splitlines()]
    assert {r["idempotency_key"] for r in rows} == {key, f"{uid}:trigger:deploy-7"}
    assert {(r["origin"], r["state"]) for r in rows} == {("trigger", "pending")}
    table = kubectl_cronwell(kube, kubeconfig, "runs", "trig", "-n", ns, db=store)
    assert table.stdout.splitlines()[0].split()[:3] == ["JOB", "SCHEDULED", "(UTC)"]
    assert table.stdout.count(f"{ns}/trig") == 2


def test_dlq_lists_dead_occurrences_of_the_namespace(
    kube: Cluster, kubeconfig: Path, ns: str, store: str, operator: OperatorProcess
) -> None:
    uid = apply_sj(kube, ns, "doomed")
    in_store(store, uid)
    assert kubectl_cronwell(kube, kubeconfig, "trigger", "doomed", "--id", "x").returncode == 0
    key = f"{uid}:trigger:x"

    async def kill() -> None:
        async with Database(store) as db:
            for _ in range(100):
                got = [
                    c
                    for c in await dispatch.claim(
                        db, pool="default", worker_id="w", limit=10, lease_seconds=60
                    )
                    if c.key == key
                ]
                if got:
                    error = "boom: the target said no"
                    state = await fail_dead(db, key, got[0].fence, "AttemptsExhausted", error)
                    assert state == "dead"
                    return
                await asyncio.sleep(0.2)
            raise AssertionError(f"{key} was never claimable")

    asyncio.run(kill())
    r = kubectl_cronwell(kube, kubeconfig, "dlq", db=store)
    assert r.returncode == 0, r.stderr
    assert key in r.stdout and "AttemptsExhausted" in r.stdout and "boom" in r.stdout
    other = kubectl_cronwell(kube, kubeconfig, "dlq", "-n", "elsewhere", db=store)
    assert key not in other.stdout and "(no dead occurrences)" in other.stderr
    everywhere = kubectl_cronwell(kube, kubeconfig, "dlq", "-A", "--json", db=store)
    assert key in {json.loads(line)["idempotency_key"] for line in everywhere.stdout.splitlines()}


def test_suspend_resume_patch_spec_and_status_shows_it(
    kube: Cluster, kubeconfig: Path, ns: str, store: str, operator: OperatorProcess
) -> None:
    uid = apply_sj(kube, ns, "pausable")
    in_store(store, uid)
    r = kubectl_cronwell(kube, kubeconfig, "suspend", "pausable")
    assert r.returncode == 0 and "spec.suspend=true" in r.stdout, r.stderr
    assert "next sync reverts it" in r.stderr
    assert get_sj(kube, ns, "pausable")["spec"]["suspend"] is True
    wait_until(lambda: in_store(store, uid)["suspended"], 60, "the store never suspended")

    def status() -> str:
        return kubectl_cronwell(kube, kubeconfig, "status", "pausable").stdout

    out = wait_until(
        lambda: next((s for s in [status()] if "Suspended=True" in s), None),
        60,
        "status never showed Suspended=True",
    )
    assert f"ScheduledJob {ns}/pausable (uid {uid})" in out
    assert "schedule:    '0 0 1 1 *' (UTC), suspend=true" in out

    assert kubectl_cronwell(kube, kubeconfig, "resume", "pausable").returncode == 0
    assert get_sj(kube, ns, "pausable")["spec"]["suspend"] is False
    wait_until(lambda: not in_store(store, uid)["suspended"], 60, "the store never resumed")
    wait_until(lambda: "Suspended=False" in status(), 60, "status never resumed")

    # `cronwell pause` suspends in the store; the CR's spec.suspend wins at its next change.
    paused = subprocess.run(
        [sys.executable, "-m", "cronwell", "--database-url", store, "pause", "pausable", "-n", ns],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert paused.returncode == 0 and f"{ns}/pausable paused" in paused.stdout, paused.stderr
    assert in_store(store, uid)["suspended_reason"] == "Paused"
    assert kubectl_cronwell(kube, kubeconfig, "suspend", "pausable").returncode == 0
    wait_until(
        lambda: (
            get_sj(kube, ns, "pausable").get("status", {}).get("observedGeneration")
            == get_sj(kube, ns, "pausable")["metadata"]["generation"]
        ),
        60,
        "the operator never observed the suspend",
    )
    assert kubectl_cronwell(kube, kubeconfig, "resume", "pausable").returncode == 0
    wait_until(lambda: not in_store(store, uid)["suspended"], 60, "spec.suspend did not win")


def test_mistakes_are_one_line(
    kube: Cluster, kubeconfig: Path, ns: str, store: str, operator: OperatorProcess
) -> None:
    missing = kubectl_cronwell(kube, kubeconfig, "runs", "nope", db=store)
    assert missing.returncode == 1
    assert f"ScheduledJob {ns}/nope: not found" in missing.stderr
    uid = apply_sj(kube, ns, "nodb")
    in_store(store, uid)
    no_db = kubectl_cronwell(kube, kubeconfig, "runs", "nodb")
    assert no_db.returncode == 1 and "no database configured" in no_db.stderr
    bad_db = kubectl_cronwell(kube, kubeconfig, "dlq", db="postgresql://u:secret@127.0.0.1:1/none")
    assert bad_db.returncode == 1 and "cannot connect to PostgreSQL" in bad_db.stderr
    for r in (missing, no_db, bad_db):
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_ui_finds_the_charts_dashboard_and_port_forwards_to_it(
    kube: Cluster, kubeconfig: Path, ns: str
) -> None:
    """The Service and Deployment as the chart renders them (ui.enabled): the plugin finds
    the Service by its labels, reads the token audience from the Deployment, prints how to
    get and send a token, and hands over to `kubectl port-forward` on that Service. No
    kubelet runs here, so no pod ever runs and port-forward gives up after its timeout;
    the node test (tests/node/test_ui.py) forwards to a real pod."""
    missing = kubectl_cronwell(kube, kubeconfig, "ui")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == (
        f"Error: no cronwell dashboard Service in namespace {ns}: install the chart with "
        "--set ui.enabled=true (or pass -n NAMESPACE of the release)"
    )
    docs = render(
        "-f", str(CHART / "ci" / "default-values.yaml"), "--namespace", ns,
        "--set", "ui.enabled=true", "--set", "ui.authAudience=cronwell-ui",
        "--set", "ui.service.port=8080",
    )  # fmt: skip
    objects = [
        {**d, "metadata": {**d["metadata"], "namespace": ns}}
        for d in docs
        if d["kind"] in ("Service", "Deployment")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "ui"
    ]
    assert len(objects) == 2
    kube.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    r = kubectl_cronwell(kube, kubeconfig, "ui", "--local-port", "0", "--pod-running-timeout=2s")
    lines = r.stdout.splitlines()
    assert lines[0] == "cronwell dashboard: http://127.0.0.1:PORT/"
    assert "  Authorization: Bearer TOKEN" in lines
    assert (
        f"e.g. a ServiceAccount's: TOKEN=$(kubectl create token SERVICEACCOUNT -n {ns} "
        "--audience cronwell-ui)" in lines
    )
    # kubectl port-forward ran against the Service and found no running pod behind it.
    assert r.returncode == 1, r.stderr
    assert "timed out waiting for the condition" in r.stderr, r.stderr
    other = kubectl_cronwell(kube, kubeconfig, "ui", "--release", "other")
    assert "no cronwell dashboard Service" in other.stderr
