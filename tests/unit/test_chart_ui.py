"""The dashboard in the chart (ui.*), rendered with `helm template`: nothing by default;
enabled, a restricted pod running `cronwell ui --auth kubernetes` probed on the path it
serves without a token, a ServiceAccount whose ClusterRole is the two reviews (plus the
ScheduledJob verbs only with actions), a Service and a NetworkPolicy admitting its port
only. Restricted Pod Security, checkov and the CLI flags are checked for every pod by
test_chart.py and test_chart_policy.py on the full render, which enables the dashboard."""

from __future__ import annotations

import json
from typing import Any

from cronwell.ui.app import HEALTH_PATH
from tests.unit.test_chart import CHART, NAMESPACE, RELEASE, component, helm, named, of_kind, render

DEFAULT = ("-f", str(CHART / "ci" / "default-values.yaml"))
UI = f"{RELEASE}-cronwell-ui"


def _ui(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "ui"
    ]


def _enabled(*extra: str) -> list[dict[str, Any]]:
    return render(*DEFAULT, "--set", "ui.enabled=true", *extra)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = named(docs, "Deployment", UI)["spec"]["template"]["spec"]["containers"]
    return dict(c)


def test_disabled_by_default_renders_nothing() -> None:
    assert _ui(render(*DEFAULT)) == []


def test_enabled_runs_the_dashboard_with_kubernetes_auth_read_only() -> None:
    docs = _enabled()
    assert sorted(d["kind"] for d in _ui(docs)) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy", "Service",
        "ServiceAccount",
    ]  # fmt: skip
    c = _container(docs)
    assert c["args"] == ["ui", "--host=0.0.0.0", "--port=8480", "--auth=kubernetes"]
    assert c["ports"] == [{"name": "ui", "containerPort": 8480, "protocol": "TCP"}]
    # The kubelet's probes carry no token: they must ask the one path served without one.
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": HEALTH_PATH, "port": "ui"}
    spec = named(docs, "Deployment", UI)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == UI and spec["automountServiceAccountToken"] is True
    assert named(docs, "ServiceAccount", UI)["automountServiceAccountToken"] is False
    env = {e["name"] for e in c["env"]}
    assert "CRONWELL_DATABASE_URL_FILE" in env and "CRONWELL_DATABASE_URL" not in env


def test_actions_and_audience_are_passed_on() -> None:
    c = _container(_enabled("--set", "ui.allowActions=true", "--set", "ui.authAudience=aud-x",
                            "--set", "ui.port=9000"))  # fmt: skip
    assert c["args"] == ["ui", "--host=0.0.0.0", "--port=9000", "--auth=kubernetes",
                         "--allow-actions", "--auth-audience=aud-x"]  # fmt: skip
    assert c["ports"][0]["containerPort"] == 9000


def _rules(docs: list[dict[str, Any]]) -> list[tuple[list[str], list[str], list[str]]]:
    (role,) = [r for r in of_kind(docs, "ClusterRole") if component(r) == "ui"]
    return [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]]


def test_rbac_is_the_reviews_and_scheduledjobs_only_with_actions() -> None:
    reviews = [
        (["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
        (["cronwell.dev"], ["workerpools"], ["list"]),
    ]
    read_only = _enabled()
    assert _rules(read_only) == reviews
    acting = _enabled("--set", "ui.allowActions=true")
    assert _rules(acting) == [
        *reviews,
        (["cronwell.dev"], ["scheduledjobs"], ["get", "list", "patch"]),
    ]
    (binding,) = [b for b in of_kind(acting, "ClusterRoleBinding") if component(b) == "ui"]
    (role,) = [r for r in of_kind(acting, "ClusterRole") if component(r) == "ui"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": UI, "namespace": NAMESPACE}]


def test_service_and_network_policy_admit_the_dashboard_port_only() -> None:
    docs = _enabled()
    svc = named(docs, "Service", UI)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "ui", "port": 8480, "targetPort": "ui", "protocol": "TCP"}
    ]
    pod_labels = named(docs, "Deployment", UI)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "ui"
    policy = named(docs, "NetworkPolicy", UI)
    assert policy["spec"]["podSelector"]["matchLabels"] == svc["spec"]["selector"]
    # Default: only pods of the release namespace (an empty podSelector in `from`).
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "ui", "protocol": "TCP"}], "from": [{"podSelector": {}}]}
    ]
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
    listed = named(
        _enabled("--set-json", f"ui.networkPolicy.from=[{json.dumps(peer)}]"),
        "NetworkPolicy", UI,
    )  # fmt: skip
    assert listed["spec"]["ingress"][0]["from"] == [peer]
    off = _enabled("--set", "networkPolicy.enabled=false")
    assert not [d for d in _ui(off) if d["kind"] == "NetworkPolicy"]


def test_unknown_ui_values_are_refused() -> None:
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *DEFAULT,
                "--set", "ui.enable=true", check=False)  # fmt: skip
    assert proc.returncode != 0 and "'enable' not allowed" in proc.stderr, proc.stderr
