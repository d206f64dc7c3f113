"""Issue 28: cronwell on CloudNativePG, its primary Pod force-deleted under a per-second job.

On a node of its own with Services (kube-proxy and the cluster DNS: CloudNativePG's
standby replicates from ``<cluster>-rw`` by name, and so does cronwell): CloudNativePG's
operator from its release manifest, the operator image and the operand image (Debian's
PostgreSQL) from `hack/cnpg.sh`, nothing pulled; a ``Cluster`` of two instances with
synchronous replication (quorum of one standby, ``dataDurability: required``) on two
hostPath PersistentVolumes; the chart installed as docs/deploy.md says, its database Secret
naming ``<cluster>-rw.<namespace>.svc`` with ``sslmode=verify-full`` against the cluster's own
CA (``database.sslRootCert.existingSecret``).

A ``* * * * * *`` ScheduledJob calls a ledger on the host; once effects flow, the primary Pod
is deleted with ``--grace-period=0 --force``. CloudNativePG promotes the standby, moves the
``-rw`` Service to it and brings the old primary back as a standby. Asserted: every instant of
the window has an accepted effect (nothing lost), every key one success in the store
(nothing doubled), a key's fences increase from one delivery to the next and its recorded
success holds the highest, no fence value reaches two keys, and the first effect after the
``-rw`` switch comes within a generous bound (no wedge). Printed: the time from the deletion
to the ``-rw`` switch, to the first new effect, and the longest silence at the ledger.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cronwell.testing.controlplane import ControlPlaneError, find_assets
from cronwell.testing.node import KUBE_PROXY, NODE_BINARIES, NODE_HINT, Node
from tests.helpers.kube import Helm
from tests.node import chart

CNPG_SCRIPT = chart.ROOT / "hack" / "cnpg.sh"
UPSTREAM_IMAGE = "ghcr.io/cloudnative-pg/cloudnative-pg:{version}"
OPERATOR_IMAGE = "localhost/cnpg-manager:{version}"
OPERATOR_NS = "cnpg-system"
DB_NS = "cnpg-db"
CLUSTER = "pg"
RELEASE = "cwpg"
JOB = "tick"
PATH = "/tick"
#: Effects flowing before the deletion, and the window kept after the cluster is healthy.
STEADY_SECONDS = 15
AFTER_SECONDS = 40
#: No wedge: the first effect after the -rw switch comes within this (printed, not tuned).
WEDGE_SECONDS = 90
pytestmark = pytest.mark.timeout(1800)


def build_cnpg() -> Path:
    """The directory `hack/cnpg.sh` fills (manager, manifest, two image archives)."""
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(CNPG_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"hack/cnpg.sh failed:\n{proc.stderr[-3000:]}", pytrace=False)
    directory = Path(proc.stdout.strip().splitlines()[-1])
    print(f"\ncnpg: {directory} ready in {time.monotonic() - started:.0f}s")
    return directory


def operator_manifest(directory: Path) -> str:
    """The release manifest, its operator image swapped for the local one, never pulled."""
    version = directory.name
    text = (directory / "cnpg.yaml").read_text()
    upstream = UPSTREAM_IMAGE.format(version=version)
    assert upstream in text, f"{upstream} not in the release manifest"
    text = text.replace(upstream, OPERATOR_IMAGE.format(version=version))
    return text.replace("imagePullPolicy: Always", "imagePullPolicy: IfNotPresent")


def storage(pv_root: Path, count: int) -> list[dict[str, Any]]:
    """A StorageClass without a provisioner and ``count`` hostPath volumes owned by UID 26
    (no fsGroup is applied to hostPath: the directories must be the postgres user's)."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "cnpg-local"},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
        }
    ]
    for i in range(count):
        path = pv_root / f"pv{i}"
        path.mkdir(mode=0o700)
        os.chown(path, 26, 26)
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"cnpg-pv{i}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "cnpg-local",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(path), "type": "Directory"},
                },
            }
        )
    return objects


def cluster_manifest(image: str) -> dict[str, Any]:
    """Two instances, synchronous replication: a commit waits for the standby's flush."""
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": DB_NS},
        "spec": {
            "instances": 2,
            "imageName": image,
            "imagePullPolicy": "Never",
            "storage": {"size": "1Gi", "storageClass": "cnpg-local"},
            "postgresql": {
                "synchronous": {"method": "any", "number": 1, "dataDurability": "required"}
            },
            "bootstrap": {"initdb": {"database": "cronwell", "owner": "cronwell"}},
        },
    }


def apply(node: Node, objects: list[dict[str, Any]], timeout: float = 120) -> None:
    """kubectl apply, retried while the operator's webhook is not answering yet."""
    deadline = time.monotonic() + timeout
    text = "\n".join(json.dumps(o) for o in objects)
    while (proc := node.kubectl("apply", "-f", "-", input=text, check=False)).returncode:
        if time.monotonic() > deadline:
            raise AssertionError(f"kubectl apply failed: {proc.stderr}")
        time.sleep(2)


def cluster_status(node: Node) -> dict[str, Any]:
    out = node.kubectl("-n", DB_NS, "get", "cluster", CLUSTER, "-o", "json", check=False)
    return json.loads(out.stdout).get("status", {}) if out.returncode == 0 else {}


def wait_healthy(node: Node, timeout: float, not_primary: str = "") -> dict[str, Any]:
    """The Cluster's status once it is healthy with every instance ready (and its primary
    is not ``not_primary``)."""
    deadline = time.monotonic() + timeout
    while True:
        status = cluster_status(node)
        if (
            status.get("phase") == "Cluster in healthy state"
            and status.get("readyInstances") == 2
            and status.get("currentPrimary") not in ("", None, not_primary)
        ):
            return status
        if time.monotonic() > deadline:
            print(node.kubectl("-n", DB_NS, "get", "pods,pvc,jobs", "-o", "wide").stdout)
            print(node.kubectl("-n", OPERATOR_NS, "logs", "deploy/cnpg-controller-manager",
                               "--tail=30", check=False).stdout)  # fmt: skip
            raise AssertionError(f"Cluster not healthy after {timeout}s: {status}")
        time.sleep(1)


def secret_value(node: Node, ns: str, name: str, key: str) -> str:
    path = key.replace(".", "\\.")
    out = node.kubectl("-n", ns, "get", "secret", name, "-o", f"jsonpath={{.data.{path}}}")
    return base64.b64decode(out.stdout).decode()


def pod_ip(node: Node, ns: str, pod: str) -> str:
    return node.kubectl("-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.podIP}").stdout


def psql(node: Node, pod: str, sql: str) -> str:
    """Run ``sql`` on an instance through its Unix socket (the postgres superuser)."""
    argv = ("-n", DB_NS, "exec", pod, "-c", "postgres", "--", "psql", "-XAtc", sql)
    return node.kubectl(*argv).stdout.strip()


class EndpointWatch:
    """The ready addresses behind the ``-rw`` Service, sampled every 0.25 s: when it moved."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.samples: list[tuple[float, frozenset[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = (
            "-n", DB_NS, "get", "endpointslices", "-l",
            f"kubernetes.io/service-name={CLUSTER}-rw", "-o",
            'jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}'
            '{.addresses[0]}{" "}{end}',
        )  # fmt: skip
        while not self._stop.wait(0.25):
            out = self.node.kubectl(*query, check=False)
            if out.returncode == 0:
                self.samples.append((time.time(), frozenset(out.stdout.split())))

    def switched(self, after: float, old: str) -> float | None:
        """When the Service first had ready addresses, none of them ``old``, after ``after``."""
        return next((t for t, ips in self.samples if t > after and ips and old not in ips), None)

    def __enter__(self) -> EndpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def cnpg_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node of this module alone, with Services; the CloudNativePG images imported."""
    try:
        assets = find_assets((*NODE_BINARIES, KUBE_PROXY))
    except ControlPlaneError as exc:
        pytest.fail(f"node tests need the node's binaries: {exc}\n({NODE_HINT})", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("node tests need root (network namespaces, mounts, cgroups)", pytrace=False)
    directory = build_cnpg()
    images = [directory / "operator.tar", directory / "postgresql.tar"]
    with Node(assets, images=images, services=True) as running:
        print(f"\nnode (with Services): Ready in {running.start_seconds:.1f}s")
        yield running
        running.assert_no_pulls()


def test_cnpg_primary_force_deleted_nothing_lost_or_doubled(
    cnpg_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> None:
    node = cnpg_node
    directory = build_cnpg()  # cached: the fixture built it
    operand = (directory / "postgresql.image").read_text().strip()
    image = chart.import_image(
        node, os.environ.get("CRONWELL_IMAGE_ARCHIVE") or chart.build_image()
    )
    figures: dict[str, float] = {}

    # CloudNativePG: the operator, then storage and the Cluster.
    started = time.monotonic()
    node.kubectl("apply", "--server-side", "-f", "-", input=operator_manifest(directory))
    node.kubectl(
        "-n", OPERATOR_NS, "rollout", "status", "deploy/cnpg-controller-manager",
        "--timeout=300s", timeout=330,
    )  # fmt: skip
    figures["operator Ready"] = time.monotonic() - started
    node.kubectl("create", "namespace", DB_NS)
    apply(node, storage(tmp_path_factory.mktemp("cnpg-pv"), 3))
    started = time.monotonic()
    apply(node, [cluster_manifest(operand)])
    status = wait_healthy(node, 600)
    figures["Cluster healthy (2 instances)"] = time.monotonic() - started
    primary = status["currentPrimary"]
    replication = psql(node, primary, "SELECT application_name, state, sync_state"
                                      " FROM pg_stat_replication")  # fmt: skip
    print(f"\ncnpg: primary {primary}, pg_stat_replication: {replication}")
    assert "|streaming|" in replication and replication.split("|")[-1] in ("sync", "quorum")

    # cronwell, pointed at the -rw Service by name, verifying the server's certificate.
    password = urllib.parse.quote(secret_value(node, DB_NS, f"{CLUSTER}-app", "password"), safe="")
    url = f"postgresql://cronwell:{password}@{CLUSTER}-rw.{DB_NS}.svc:5432/cronwell"
    ca = secret_value(node, DB_NS, f"{CLUSTER}-ca", "ca.crt")
    ns = f"cronwell-pg-{uuid.uuid4().hex[:6]}"
    helm = Helm(node, tmp_path_factory.mktemp("helm-cnpg"))
    chart.helm_install(
        node, helm, RELEASE, ns, image, url,
        "--set", "database.sslmode=verify-full",
        "--set", "database.sslRootCert.existingSecret=cnpg-ca",
        secrets={"cnpg-ca": {"ca.crt": ca}},
    )  # fmt: skip
    server, recorded = chart.serve_ledger(node.host_ip)
    try:
        base = f"http://{node.host_ip}:{server.server_address[1]}"
        node.kubectl(
            "apply", "-f", "-", input=json.dumps(chart.per_second_job(ns, JOB, base + PATH))
        )
        uid = node.kubectl("-n", ns, "get", "sj", JOB, "-o", "jsonpath={.metadata.uid}").stdout
        deadline = time.monotonic() + 300
        while not recorded.accepted(PATH):
            assert time.monotonic() < deadline, "no first effect within 300 s"
            time.sleep(0.5)
        time.sleep(STEADY_SECONDS)

        # The fault: the primary's Pod goes, now.
        old_ip = pod_ip(node, DB_NS, primary)
        with EndpointWatch(node) as watch:
            time.sleep(1)
            deleted = time.time()
            node.kubectl("-n", DB_NS, "delete", "pod", primary, "--grace-period=0", "--force")
            status = wait_healthy(node, 600, not_primary=primary)
            healthy = time.time()
        new_primary = status["currentPrimary"]
        switched = watch.switched(deleted, old_ip)
        time.sleep(AFTER_SECONDS)

        # Stop the window; let the last occurrences' retries land.
        suspended_at = time.time()
        node.kubectl(
            "-n", ns, "patch", "sj", JOB, "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        time.sleep(15)
        rows, succeeded, timelines = _store(node, new_primary, password, ca, uid)
    finally:
        server.shutdown()
        server.server_close()
        print(node.kubectl("-n", DB_NS, "get", "pods", "-o", "wide", check=False).stdout)

    accepted = recorded.accepted(PATH)
    requests = [r for r in recorded.requests if r["path"] == PATH]
    first = min(chart.instant(k) for k in accepted)
    # Instants due more than 10 s before the suspension must have landed (the job's timeout).
    expected = [first + i for i in range(int(suspended_at - 10 - first) + 1)]
    landed = {chart.instant(k) for k in accepted}
    missing = [t for t in expected if t not in landed]
    arrivals = sorted(r["at"] for r in accepted.values())
    after = [t for t in arrivals if switched is not None and t >= switched]
    gaps = [(b - a, a) for a, b in itertools.pairwise(arrivals) if b > deleted - 5]
    silence, silence_from = max(gaps, default=(0.0, deleted))
    redelivered = Counter(r["key"] for r in requests)
    print(
        f"\ncnpg: {len(expected)} expected instants, {len(accepted)} accepted effects, "
        f"{len(missing)} missing, {len(requests) - len(accepted)} redeliveries over "
        f"{sum(1 for n in redelivered.values() if n > 1)} keys; primary {primary} -> "
        f"{new_primary}; store: {Counter(st for st, _ in rows.values())}, fence timelines "
        f"{sorted(timelines)}"
    )
    for name, seconds in figures.items():
        print(f"  {name}: {seconds:.1f}s")
    print(f"  force-delete -> -rw switched to the new primary: {_after(switched, deleted)}")
    print(f"  force-delete -> Cluster healthy again: {healthy - deleted:.1f}s")
    print(f"  force-delete -> first effect after the -rw switch: "
          f"{_after(after[0] if after else None, deleted)}")  # fmt: skip
    print(f"  longest silence at the ledger: {silence:.1f}s from "
          f"{silence_from - deleted:+.1f}s after the deletion")  # fmt: skip

    assert switched is not None, "the -rw Service never left the deleted primary"
    assert after and after[0] - switched < WEDGE_SECONDS, "no effect after the -rw switch"
    assert all(k.startswith(f"{uid}:") for k in accepted), set(accepted)
    assert not missing, [time.strftime("%H:%M:%S", time.gmtime(t)) for t in missing]
    # Nothing doubled: each key succeeded once in the store.
    for t in expected:
        key = f"{uid}:{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))}"
        assert rows.get(key) == ("succeeded", 1), (key, rows.get(key))
    _check_fences(requests, succeeded)


def _after(t: float | None, origin: float) -> str:
    return "never" if t is None else f"{t - origin:.1f}s"


def _store(
    node: Node, primary: str, password: str, ca: str, uid: str
) -> tuple[dict[str, tuple[str, int]], list[tuple[str, int]], set[int]]:
    """From the primary, over the pod network: state and number of successes per key, the
    (key, fence) of every success, and the timelines the fences carry (bits 40-53)."""
    ca_file = Path(node.dir or ".") / "cnpg-ca.crt"
    ca_file.write_text(ca)
    dsn = (
        f"postgresql://cronwell:{password}@{pod_ip(node, DB_NS, primary)}:5432/cronwell"
        f"?sslmode=verify-ca&sslrootcert={ca_file}"
    )
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT o.idempotency_key, o.state,"
            " (SELECT count(*) FROM cronwell_attempts a"
            "   WHERE a.occurrence_id = o.id AND a.outcome = 'succeeded')"
            " FROM cronwell_occurrences o WHERE o.job_id = %s",
            (uid,),
        ).fetchall()
        succeeded = conn.execute(
            "SELECT idempotency_key, fence FROM cronwell_attempts WHERE outcome = 'succeeded'"
        ).fetchall()
    timelines = {(fence >> 40) & 0x3FFF for _, fence in succeeded}
    return {k: (st, n) for k, st, n in rows}, [(k, f) for k, f in succeeded], timelines


def _check_fences(requests: list[dict[str, Any]], succeeded: list[tuple[str, int]]) -> None:
    """A key's fences increase delivery after delivery, its success holds the highest one
    and ran, and no fence value reaches two keys."""
    per_key: dict[str, list[int]] = defaultdict(list)
    owner: dict[int, str] = {}
    reused = []
    for r in sorted(requests, key=lambda r: r["at"]):
        fence = int(r["fence"])
        per_key[r["key"]].append(fence)
        if owner.setdefault(fence, r["key"]) != r["key"]:
            reused.append((fence, owner[fence], r["key"]))
    assert not reused, f"{len(reused)} fence values sent for two keys: {reused[:5]}"
    backwards = {k: f for k, f in per_key.items() if f != sorted(set(f))}
    assert not backwards, f"fences not increasing per key: {list(backwards.items())[:5]}"
    ran = {(r["key"], int(r["fence"])) for r in requests}
    for key, fence in succeeded:
        if key in per_key:
            assert (key, fence) in ran, f"{key}: success under fence {fence}, never delivered"
            assert fence == max(per_key[key]), (key, fence, per_key[key])
