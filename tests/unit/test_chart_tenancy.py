"""The chart's tenant-safety settings: the egress policy and the secrets key reach the
operator and the workers, static pools carry their namespaces and handlers, and the
opt-in NetworkPolicy bounds the workers' egress by the same denied addresses."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.test_chart import CHART, WORKERPOOL_SERVED, render


def _full() -> list[dict[str, Any]]:
    return render("-f", str(CHART / "ci" / "full-values.yaml"), *WORKERPOOL_SERVED)


def _default() -> list[dict[str, Any]]:
    return render("-f", str(CHART / "ci" / "default-values.yaml"))


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _env(deploy: dict[str, Any]) -> dict[str, Any]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def _mounts(deploy: dict[str, Any]) -> dict[str, str]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return {m["name"]: m["mountPath"] for m in c["volumeMounts"]}


def test_egress_secrets_key_and_pool_tenancy_reach_the_processes() -> None:
    docs = _full()
    op = _one(docs, "Deployment", "cw-operator")
    reports = _one(docs, "Deployment", "cw-worker-reports")
    default = _one(docs, "Deployment", "cw-worker-default")
    for d in (op, reports, default):
        env = _env(d)
        assert env["CRONWELL_EGRESS_ALLOW_CIDRS"] == "10.0.7.0/24"
        assert env["CRONWELL_EGRESS_DENY_CIDRS"] == (
            "10.0.0.0/16,fd00:10::/32,10.96.0.1/32,172.18.0.2/32"
        )
        assert env["CRONWELL_EGRESS_DENY_HOSTS"] == "*.corp.example"
        assert env["CRONWELL_SECRETS_KEY_FILE"] == "/etc/cronwell/secrets-key/fernet"
        assert _mounts(d)["secrets-key"] == "/etc/cronwell/secrets-key"
        vols = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert vols["secrets-key"]["secret"]["secretName"] == "cronwell-secrets-key"
    assert _env(reports)["CRONWELL_POOL_NAMESPACES"] == "team-a,team-b"
    assert _env(reports)["CRONWELL_POOL_HANDLERS"] == "reports.nightly,reports.weekly"
    assert _env(default)["CRONWELL_POOL_NAMESPACES"] == "*"
    assert "CRONWELL_POOL_HANDLERS" not in _env(default)  # any handler
    assert json.loads(_env(op)["CRONWELL_OPERATOR_POOL_NAMESPACES"]) == {
        "default": "*", "reports": "team-a,team-b",
    }  # fmt: skip
    assert json.loads(_env(op)["CRONWELL_OPERATOR_POOL_HANDLERS"]) == {
        "reports": "reports.nightly,reports.weekly"
    }
    wp = _one(docs, "WorkerPool", "reports")
    assert wp["spec"]["namespaces"] == ["team-a", "team-b"]
    assert wp["spec"]["handlers"] == ["reports.nightly", "reports.weekly"]
    assert not [d for d in docs if d["kind"] == "Secret" and "secrets-key" in d["metadata"]["name"]]


def test_the_default_render_generates_a_secrets_key() -> None:
    docs = _default()
    (secret,) = [
        d for d in docs if d["kind"] == "Secret" and "secrets-key" in d["metadata"]["name"]
    ]
    import base64

    key = base64.b64decode(secret["data"]["key"])
    assert len(base64.urlsafe_b64decode(key)) == 32  # a Fernet key
    from cryptography.fernet import Fernet

    Fernet(key)
    assert not [d for d in docs if d["metadata"]["name"].endswith("worker-egress")]  # opt-in


def test_worker_egress_network_policy() -> None:
    docs = _full()
    pol = _one(docs, "NetworkPolicy", "cw-worker-egress")
    assert pol["spec"]["policyTypes"] == ["Egress"]
    assert pol["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    dns, db, anywhere = pol["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    assert db["ports"] == [{"port": 5432, "protocol": "TCP"}]
    assert db["to"] == [{"ipBlock": {"cidr": "10.0.5.10/32"}}]
    v4, v6 = (peer["ipBlock"] for peer in anywhere["to"])
    assert v4["cidr"] == "0.0.0.0/0" and v6["cidr"] == "::/0"
    for cidr in ("169.254.0.0/16", "127.0.0.0/8", "10.0.0.0/16", "10.96.0.1/32", "172.18.0.2/32"):
        assert cidr in v4["except"]
    for cidr in ("fe80::/10", "::1/128", "fd00:10::/32"):
        assert cidr in v6["except"]
    ingress = _one(docs, "NetworkPolicy", "cw")
    webhook = [r for r in ingress["spec"]["ingress"] if r["ports"][0]["port"] == "webhook"]
    assert webhook[0]["from"] == [{"ipBlock": {"cidr": "10.0.0.2/32"}}]
