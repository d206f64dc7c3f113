"""The node itself: Ready, runs a locked-down Pod from a local image, never pulls."""

from __future__ import annotations

import json
import time
import urllib.request

from cronwell.testing.node import Node
from tests.node.conftest import CANARY_REGISTRY, TEST_IMAGE

# Writes what the container sees into /www/facts (an emptyDir), then serves it: the
# readiness probe and the test both read it over HTTP.
FACTS_SCRIPT = """\
set -e
cd /www
echo "uid=$(busybox id -u)" > facts
if busybox touch /rootfs-probe 2>/dev/null; then echo rootfs=writable; \
else echo rootfs=readonly; fi >> facts
echo "memory_limit=$(busybox cat /sys/fs/cgroup/memory/memory.limit_in_bytes)" >> facts
exec busybox httpd -f -p 8080 -h /www
"""


def _pod(name: str, image: str, pull_policy: str = "Never") -> str:
    container = {
        "name": "main",
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["/bin/busybox", "sh", "-c", FACTS_SCRIPT],
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}},
        "readinessProbe": {"httpGet": {"path": "/facts", "port": 8080}, "periodSeconds": 1},
        "volumeMounts": [{"name": "www", "mountPath": "/www"}],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "securityContext": {
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [{"name": "www", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 1,
        },
    }
    return json.dumps(pod)


def test_node_is_ready(node: Node) -> None:
    nodes = json.loads(node.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == [node.node_name]
    conditions = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    addresses = {a["type"]: a["address"] for a in nodes[0]["status"]["addresses"]}
    assert addresses["InternalIP"] == node.node_ip


def test_locked_down_pod_becomes_ready_from_a_local_image(node: Node) -> None:
    node.kubectl("apply", "-f", "-", input=_pod("facts", TEST_IMAGE))
    try:
        node.kubectl("wait", "--for=condition=Ready", "pod/facts", "--timeout=120s", timeout=150)
        pod = json.loads(node.kubectl("get", "pod", "facts", "-o", "json").stdout)
        ip = pod["status"]["podIP"]
        assert ip.startswith(node.pod_cidr.rsplit(".", 2)[0])
        # Pod IPs are inside the node's namespace; the host routes to them over the veth.
        with urllib.request.urlopen(f"http://{ip}:8080/facts", timeout=10) as resp:
            facts = dict(line.split("=", 1) for line in resp.read().decode().split())
        assert facts == {
            "uid": "10001",
            "rootfs": "readonly",
            "memory_limit": str(64 * 1024 * 1024),
        }
        assert node.pull_attempts() == []
    finally:
        node.kubectl("delete", "pod", "facts", "--wait=false", check=False)


def test_missing_image_fails_fast_without_a_pull(node: Node) -> None:
    node.kubectl("apply", "-f", "-", input=_pod("absent", "localhost/cronwell/absent:1"))
    try:
        deadline = time.monotonic() + 60
        reason = ""
        while time.monotonic() < deadline and reason != "ErrImageNeverPull":
            out = node.kubectl(
                "get",
                "pod",
                "absent",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
            )
            reason = out.stdout.strip()
            time.sleep(0.5)
        assert reason == "ErrImageNeverPull"
        assert node.pull_attempts() == []
    finally:
        node.kubectl("delete", "pod", "absent", "--wait=false", check=False)


def test_a_pull_attempt_is_noticed(node: Node) -> None:
    """The detector itself: a deliberate pull from the node's own closed loopback port."""
    image = f"{CANARY_REGISTRY}cronwell/canary:1"
    node.kubectl("apply", "-f", "-", input=_pod("canary", image, pull_policy="Always"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not node.pull_attempts():
            time.sleep(0.5)
        attempts = node.pull_attempts()
        assert attempts and all(CANARY_REGISTRY in line for line in attempts), attempts
    finally:
        node.kubectl("delete", "pod", "canary", "--wait=false", check=False)
