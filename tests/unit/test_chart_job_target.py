"""The chart's RBAC for job targets (`jobTarget.namespaces`): in each listed namespace the
workers may create, get, list, watch and delete Jobs and the operator may create them (the
webhook's dry-run); nothing else, nowhere else. Without the value the workers keep having
no Kubernetes API access (tests/unit/test_chart.py)."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.test_chart import (
    CHART,
    NAMESPACE,
    WORKERPOOL_SERVED,
    helm,
    of_kind,
    pod_specs,
    render,
)

WORKERS = ["cw-worker-default", "cw-worker-reports"]
OPERATOR = "cw-operator"
WORKER_ROLE = "cw-worker-jobs"
DRY_RUN_ROLE = "cw-operator-jobs-dry-run"


def _with_jobs(*namespaces: str) -> list[dict[str, Any]]:
    ns = "{" + ",".join(namespaces) + "}"
    return render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED,
                  "--set", f"jobTarget.namespaces={ns}")  # fmt: skip


def _in(docs: list[dict[str, Any]], kind: str, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in of_kind(docs, kind)
        if d["metadata"].get("namespace") == namespace
    }


def test_each_listed_namespace_gets_the_workers_and_the_operators_job_roles() -> None:
    docs = _with_jobs("team-a", "team-b")
    for ns in ("team-a", "team-b"):
        roles = _in(docs, "Role", ns)
        assert {WORKER_ROLE, DRY_RUN_ROLE} <= set(roles)
        assert roles[WORKER_ROLE]["rules"] == [
            {"apiGroups": ["batch"], "resources": ["jobs"],
             "verbs": ["create", "get", "list", "watch", "delete"]},
        ]  # fmt: skip
        assert roles[DRY_RUN_ROLE]["rules"] == [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
        ]
        bindings = _in(docs, "RoleBinding", ns)
        workers = bindings[WORKER_ROLE]
        assert workers["roleRef"]["name"] == WORKER_ROLE
        assert [(s["kind"], s["name"], s["namespace"]) for s in workers["subjects"]] == [
            ("ServiceAccount", w, NAMESPACE) for w in WORKERS
        ]
        op = bindings[DRY_RUN_ROLE]
        assert op["roleRef"]["name"] == DRY_RUN_ROLE
        assert [s["name"] for s in op["subjects"]] == [OPERATOR]
    # Nothing about Jobs anywhere else, and never Secrets or Pods through this value.
    for d in of_kind(docs, "Role") + of_kind(docs, "ClusterRole"):
        for r in d.get("rules") or []:
            if "jobs" in r["resources"]:
                assert d["kind"] == "Role" and d["metadata"]["namespace"] in ("team-a", "team-b")
    assert WORKER_ROLE not in _in(docs, "Role", "team-c")


def test_workers_mount_a_token_only_when_they_run_job_targets() -> None:
    docs = _with_jobs("team-a")
    for sa in of_kind(docs, "ServiceAccount"):
        if sa["metadata"]["name"] in WORKERS:
            assert sa["automountServiceAccountToken"] is True
        elif sa["metadata"]["name"] != OPERATOR:
            assert sa["automountServiceAccountToken"] is False, sa["metadata"]["name"]
    for where, spec in pod_specs(docs):
        if spec["serviceAccountName"] in WORKERS:
            assert spec["automountServiceAccountToken"] is True, where
    without = render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED)
    for where, spec in pod_specs(without):
        if spec["serviceAccountName"] in WORKERS:
            assert spec["automountServiceAccountToken"] is False, where
    assert not [d for d in of_kind(without, "Role") if "jobs" in d["metadata"]["name"]]


def test_the_webhook_admits_job_targets_in_the_listed_namespaces_only() -> None:
    def env(docs: list[dict[str, Any]]) -> dict[str, Any]:
        (op,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == OPERATOR]
        (c,) = op["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in c["env"]}

    listed = env(_with_jobs("team-a", "team-b"))
    assert json.loads(listed["CRONWELL_OPERATOR_WEBHOOK_JOB_NAMESPACES"]) == ["team-a", "team-b"]
    none = env(render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED))
    assert json.loads(none["CRONWELL_OPERATOR_WEBHOOK_JOB_NAMESPACES"]) == []


def test_a_namespace_that_is_not_a_dns_label_is_refused_by_the_schema() -> None:
    out = helm("template", "cw", str(CHART), "-f", str(CHART / "ci" / "default-values.yaml"),
               "--set", "jobTarget.namespaces={Team_A}", check=False)  # fmt: skip
    assert out.returncode != 0, out.stdout
    assert "at '/jobTarget/namespaces/0': 'Team_A' does not match pattern" in out.stderr


def test_worker_egress_allows_the_api_server_only_with_job_targets() -> None:
    def peers(docs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        (policy,) = [d for d in of_kind(docs, "NetworkPolicy")
                     if d["metadata"]["name"].endswith("worker-egress")]  # fmt: skip
        return [rule.get("to") or [] for rule in policy["spec"]["egress"]]

    # full-values.yaml enables workerEgress and lists the API server's addresses.
    api = [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.18.0.2/32"}}]
    assert api in peers(_with_jobs("team-a"))
    without = render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED)
    assert api not in peers(without)
