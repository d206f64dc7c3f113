"""The egress policy on URLs as written (admission: webhook and `cronwell apply`): the
secure default, the cluster's lists, a namespace's tightening, and the messages."""

from __future__ import annotations

import pytest

from cronwell import tenancy
from cronwell.egress import EgressDenied, EgressPolicy, NamespaceEgress

DEFAULT = EgressPolicy.from_lists(api_server_host="10.96.0.1")


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://169.254.169.254/latest/meta-data", "link-local (cloud metadata) (169.254.0.0/16)"),
        ("http://[fe80::1%25eth0]/", "link-local (cloud metadata) (fe80::/10)"),
        ("http://[fd00:ec2::254]/", "the AWS metadata service"),
        ("http://metadata.google.internal/computeMetadata/v1/", "a cloud metadata host name"),
        ("http://METADATA./", "a cloud metadata host name"),
        ("http://127.0.0.1:8080/", "loopback (127.0.0.0/8)"),
        ("http://2130706433/", "loopback (127.0.0.0/8)"),  # 127.0.0.1 as one number
        ("http://0x7f.1/", "loopback (127.0.0.0/8)"),
        ("http://[::ffff:127.0.0.1]/", "loopback (127.0.0.0/8)"),
        ("http://[::1]/", "loopback (::1/128)"),
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local (cloud metadata) (169.254.0.0/16)"),  # NAT64
        ("http://[2002:7f00:1::]/", "loopback (127.0.0.0/8)"),  # 6to4
        ("http://localhost:9000/", "loopback (localhost)"),
        ("http://0.0.0.0/", "unspecified"),
        ("https://kubernetes.default.svc.cluster.local/api", "the Kubernetes API server"),
        ("https://kubernetes.default/api", "the Kubernetes API server"),
        ("https://10.96.0.1:443/api", "the Kubernetes API server (KUBERNETES_SERVICE_HOST)"),
    ],
)
def test_the_secure_default_denies(url: str, rule: str) -> None:
    with pytest.raises(EgressDenied) as e:
        DEFAULT.check_url(url)
    msg = str(e.value)
    assert msg.startswith("spec.target.http.url: host ") and rule in msg, msg
    assert "egress.allowCidrs/allowHosts (CRONWELL_EGRESS_ALLOW_CIDRS/_HOSTS)" in msg  # the fix


@pytest.mark.parametrize(
    "url",
    ["https://api.example.com/x", "http://10.0.0.5/", "http://[2001:db8::1]/", "http://svc.ns/"],
)
def test_the_rest_is_allowed(url: str) -> None:
    DEFAULT.check_url(url)


def test_the_cluster_allow_and_deny_lists() -> None:
    p = EgressPolicy.from_lists(
        allow_cidrs=["127.0.0.1/32"], allow_hosts=["localhost"], deny_hosts=["*.corp"],
        deny_cidrs=["10.0.0.0/8"], api_server_host="",
    )  # fmt: skip
    p.check_url("http://127.0.0.1:8080/")
    p.check_url("http://localhost/")
    with pytest.raises(EgressDenied, match=r"127\.0\.0\.2'.* is loopback"):
        p.check_url("http://127.0.0.2/")
    with pytest.raises(EgressDenied, match=r"cluster's egress deny list \(\*\.corp\)"):
        p.check_url("https://billing.corp/")
    with pytest.raises(EgressDenied, match=r"deny list \(10\.0\.0\.0/8\)"):
        p.check_url("http://10.1.2.3/")
    with pytest.raises(EgressDenied, match="is neither a CIDR"):
        EgressPolicy.from_lists(deny_cidrs=["10.0.0.0/33"])


def test_a_namespace_only_tightens() -> None:
    ns = NamespaceEgress.from_annotations(
        "team-a",
        {"cronwell.dev/egress-allow": "*.example.com, 203.0.113.0/24",
         "cronwell.dev/egress-deny": "secret.example.com"},
    )  # fmt: skip
    p = DEFAULT.for_namespace(ns)
    p.check_url("https://api.example.com/")
    p.check_url("http://203.0.113.9/")
    with pytest.raises(EgressDenied) as e:
        p.check_url("http://198.51.100.1/")
    assert "not in namespace team-a's cronwell.dev/egress-allow annotation" in str(e.value)
    with pytest.raises(EgressDenied, match=r"namespace team-a.s cronwell\.dev/egress-deny"):
        p.check_url("https://secret.example.com/")
    # An allow list never opens what the cluster denies.
    opened = DEFAULT.for_namespace(
        NamespaceEgress.from_annotations("b", {"cronwell.dev/egress-allow": "169.254.0.0/16"})
    )
    with pytest.raises(EgressDenied, match="link-local"):
        opened.check_url("http://169.254.169.254/")
    # An empty allow list allows nothing.
    with pytest.raises(EgressDenied, match="empty: nothing is allowed"):
        DEFAULT.for_namespace(
            NamespaceEgress.from_annotations("c", {"cronwell.dev/egress-allow": ""})
        ).check_url("https://api.example.com/")


def test_pool_policy_namespaces_selector_and_handlers() -> None:
    pay = tenancy.PoolPolicy(
        "payments", "payments", ("billing",), {"matchLabels": {"team": "pay"}}, ("charge",)
    )
    assert tenancy.check([pay], pool="payments", namespace="payments", labels={},
                         handler="charge") is None  # fmt: skip
    assert tenancy.check([pay], pool="payments", namespace="billing", labels={},
                         handler=None) is None  # fmt: skip
    assert tenancy.check([pay], pool="payments", namespace="x", labels={"team": "pay"},
                         handler="charge") is None  # fmt: skip
    r = tenancy.check([pay], pool="payments", namespace="x", labels={}, handler="charge")
    assert r is not None and r.reason == "PoolNotAllowed"
    assert "namespace x may not use pool 'payments'" in r.message
    assert "WorkerPool payments in namespace payments" in r.message
    r = tenancy.check([pay], pool="payments", namespace="billing", labels={}, handler="refund")
    assert r is not None and r.reason == "HandlerNotAllowed"
    assert "does not serve handler 'refund' (it serves: charge)" in r.message
    assert tenancy.check([], pool="p", namespace="x", labels={}, handler="h") is None
    expr = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}
    assert tenancy.selector_matches(expr, {"tier": "gold"})
    assert not tenancy.selector_matches(expr, {"tier": "bronze"})
    assert not tenancy.selector_matches({}, {"tier": "gold"})
