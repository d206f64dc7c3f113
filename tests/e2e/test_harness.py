"""The e2e harness is a real API server: these behaviours exist only in kube-apiserver.

Status subresource semantics, server-side schema validation, server-side printing of
additionalPrinterColumns, RBAC and watches are exactly what fakes get wrong, so each is
checked with an assertion that fails against anything less than the real thing.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from cronwell.testing.controlplane import Cluster, ControlPlane, KubectlError

GROUP = "harness.cronwell.dev"
CRD_NAME = f"widgets.{GROUP}"
CRD_YAML = f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {CRD_NAME}
spec:
  group: {GROUP}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}}
  versions:
    - name: v1
      served: true
      storage: true
      subresources:
        status: {{}}
      additionalPrinterColumns:
        - {{name: Size, type: integer, jsonPath: .spec.size}}
        - {{name: Phase, type: string, jsonPath: .status.phase}}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {{type: integer, minimum: 1}}
            status:
              type: object
              properties:
                phase: {{type: string}}
"""


def widget(name: str, size: Any) -> str:
    return json.dumps(
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"size": size},
            # Ignored on create: with a status subresource, status is written only there.
            "status": {"phase": "Forged"},
        }
    )


def get_json(kube: Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def widget_crd(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("crds") / "widgets.yaml"
    path.write_text(CRD_YAML)
    assert kube.install_crds([path]) == [CRD_NAME]
    return CRD_NAME


def test_namespace_and_configmap_round_trip(kube: Cluster, namespace: str) -> None:
    assert get_json(kube, "namespace", namespace)["status"]["phase"] == "Active"
    kube.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=a=1")
    cm = get_json(kube, "configmap", "settings", "-n", namespace)
    assert cm["data"] == {"a": "1"}
    assert cm["metadata"]["uid"]  # assigned by the server
    assert int(cm["metadata"]["resourceVersion"]) > 0


def test_crd_printer_columns_and_status_subresource(
    kube: Cluster, widget_crd: str, namespace: str
) -> None:
    crd = get_json(kube, "customresourcedefinition", widget_crd)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"

    kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("w1", 3))
    created = get_json(kube, "widget", "w1", "-n", namespace)
    assert created["spec"] == {"size": 3}
    assert "status" not in created, "status must be dropped on create (status subresource)"

    # Server-side schema validation, not just a client check.
    with pytest.raises(KubectlError, match=r"spec\.size"):
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=widget("w2", 0))

    patch = json.dumps({"status": {"phase": "Ready"}})
    kube.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", patch,
    )  # fmt: skip
    # Writing status through the main resource is silently ignored.
    kube.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--type=merge",
        "-p", json.dumps({"status": {"phase": "Hacked"}, "spec": {"size": 5}}),
    )  # fmt: skip

    # additionalPrinterColumns are rendered by the server (Table), kubectl just prints.
    lines = kube.kubectl("get", "widgets", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "PHASE"]
    assert [line.split() for line in lines[1:]] == [["w1", "5", "Ready"]]
    # The short name from the CRD is served by discovery too.
    assert kube.kubectl("get", "wdg", "w1", "-n", namespace, "-o", "name").stdout.strip() == (
        f"widget.{GROUP}/w1"
    )


def test_rbac_is_enforced(kube: Cluster, namespace: str) -> None:
    def can_i(*args: str, ns: str = namespace) -> str:
        out = kube.kubectl("auth", "can-i", *args, "-n", ns, check=False)
        return out.stdout.strip()

    assert can_i("create", "configmaps") == "yes"  # the harness user is an admin
    assert can_i("create", "configmaps", "--as=mallory") == "no"
    # A Role with explicit rules: the aggregated ClusterRoles (edit, view, admin) are
    # filled by kube-controller-manager, which the local control plane does not run.
    kube.kubectl(
        "create", "role", "configmap-writer", "-n", namespace, "--verb=get,create",
        "--resource=configmaps",
    )  # fmt: skip
    kube.kubectl(
        "create", "rolebinding", "mallory-writes-configmaps", "-n", namespace,
        "--role=configmap-writer", "--user=mallory",
    )  # fmt: skip
    deadline = time.monotonic() + 10  # the authorizer's informer catches up quickly
    while can_i("create", "configmaps", "--as=mallory") != "yes":
        assert time.monotonic() < deadline, "RoleBinding never took effect"
        time.sleep(0.2)
    assert can_i("delete", "configmaps", "--as=mallory") == "no"  # only what was granted
    assert can_i("create", "configmaps", "--as=mallory", ns="default") == "no"


def test_watch_sees_added_and_modified(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    # Watching from the list's resourceVersion: no event can slip by between list and watch.
    listed = core.list_namespaced_config_map(namespace)
    assert listed.metadata is not None
    start_rv = listed.metadata.resource_version
    Event = tuple[str, str, dict[str, str] | None]
    events: queue.Queue[Event] = queue.Queue()
    stream = watch.Watch()
    stopping = threading.Event()

    def pump() -> None:
        try:
            for event in stream.stream(
                core.list_namespaced_config_map,
                namespace,
                resource_version=start_rv,
                timeout_seconds=30,
            ):
                obj = event["object"]
                events.put((event["type"], obj.metadata.name, obj.data))
        except Exception as exc:  # Watch.stop() closes the response under our feet
            if not stopping.is_set():
                events.put(("ERROR", repr(exc), None))

    watcher = threading.Thread(target=pump, daemon=True)
    watcher.start()
    seen: list[Event] = []
    try:
        core.create_namespaced_config_map(
            namespace,
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name="watched"), data={"v": "1"}),
        )
        core.patch_namespaced_config_map("watched", namespace, {"data": {"v": "2"}})
        deadline = time.monotonic() + 20
        while ("MODIFIED", "watched", {"v": "2"}) not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no MODIFIED event within 20s; saw {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(events.get(timeout=remaining))
            if seen and seen[-1][0] == "ERROR":
                pytest.fail(f"watch failed: {seen}")
    finally:
        stopping.set()
        stream.stop()
        watcher.join(timeout=35)
    assert seen == [("ADDED", "watched", {"v": "1"}), ("MODIFIED", "watched", {"v": "2"})]
    assert not watcher.is_alive()


def _gone(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    # A reused pid is fine, our server is not.
    return not any(name in cmdline for name in (b"etcd", b"kube-apiserver"))


@pytest.mark.parametrize("body_raises", [None, RuntimeError, KeyboardInterrupt])
def test_teardown_leaves_no_processes(
    control_plane_assets: Path, body_raises: type[BaseException] | None
) -> None:
    plane = ControlPlane(control_plane_assets)
    pids: dict[str, int] = {}
    workdir: Path | None = None
    try:
        with plane:
            pids = plane.pids()
            workdir = plane.dir
            assert set(pids) == {"etcd", "kube-apiserver"}
            assert not any(_gone(pid) for pid in pids.values())
            assert plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
            if body_raises is not None:
                raise body_raises("boom")
    except (RuntimeError, KeyboardInterrupt) as exc:
        assert body_raises is not None and isinstance(exc, body_raises)
    assert pids, "the control plane never started"
    assert [pid for pid in pids.values() if not _gone(pid)] == []
    assert workdir is not None and not workdir.exists()
    assert plane.processes == {}
