"""What the chart tests on the node share: the image build and import, the database the
chart's Secret names, the HTTP ledger, `helm install` as users run it, and pod queries.

The image archive comes from $CRONWELL_IMAGE_ARCHIVE, else from `hack/build-image.sh`.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.node import Node
from tests.helpers.http import BurstServer, serve
from tests.helpers.kube import Helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cronwell"
BUILD_SCRIPT = ROOT / "hack" / "build-image.sh"
DB_PASSWORD = "node-e2e-" + uuid.uuid4().hex[:12]


@dataclass
class Ledger:
    """An HTTP receiver that records every request's Idempotency-Key and fence token.

    The first request with a key is the accepted effect; later ones are redeliveries
    (a receiver deduplicating on the key would ignore them).
    """

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    holds: dict[str, float] = field(default_factory=dict)
    """Path prefix -> seconds a request is held before the answer (a slow receiver: the
    occurrences calling it really last that long)."""

    def hold(self, path: str) -> float:
        return max((s for p, s in self.holds.items() if path.startswith(p)), default=0.0)

    def record(self, path: str, headers: Any) -> None:
        with self.lock:
            self.requests.append(
                {
                    "path": path,
                    "key": headers.get("Idempotency-Key"),
                    "fence": headers.get("Cronwell-Fence-Token"),
                    "at": time.time(),
                }
            )

    def accepted(self, path: str) -> dict[str, dict[str, Any]]:
        """First request per key for ``path``."""
        first: dict[str, dict[str, Any]] = {}
        with self.lock:
            for req in self.requests:
                if req["path"] == path:
                    first.setdefault(req["key"], req)
        return first


def serve_ledger(address: str) -> tuple[BurstServer, Ledger]:
    ledger = Ledger()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            path, _, query = self.path.partition("?")
            ledger.record(path, self.headers)
            # ?delay=S answers after S seconds, so that faults hit attempts in flight.
            delay = float(query.removeprefix("delay=")) if query.startswith("delay=") else 0.0
            time.sleep(max(delay, ledger.hold(path)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = serve(address, Handler)
    return server, ledger


def build_image(tag: str | None = None) -> str:
    """The archive of the image `hack/build-image.sh` builds (under ``tag``, else its default)."""
    if not BUILD_SCRIPT.is_file():
        pytest.skip("hack/build-image.sh is not in this tree (issue 19 item 1)")
    started = time.monotonic()
    argv = ["bash", str(BUILD_SCRIPT), *(["--tag", tag] if tag else [])]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        pytest.fail(f"hack/build-image.sh failed:\n{proc.stderr[-3000:]}", pytrace=False)
    archive = proc.stdout.strip().splitlines()[-1]
    print(f"\nimage: {archive} ready in {time.monotonic() - started:.0f}s")
    return archive


def import_image(node: Node, archive: str) -> str:
    """Import ``archive`` into the node; returns the image's name."""
    before = set(node.ctr("images", "ls", "-q").split())
    started = time.monotonic()
    node.import_image(archive)
    print(f"\nimage: imported {archive} in {time.monotonic() - started:.1f}s")
    names = sorted(set(node.ctr("images", "ls", "-q").split()) - before)
    names = [n for n in names if not n.startswith("sha256:")]
    assert names, f"{archive} named no new image"
    # An archive may carry several names of one image (localhost/x and docker.io/library/x).
    return next((n for n in names if n.startswith("localhost/")), names[0])


def start_database(node: Node, data: Path) -> Iterator[dict[str, str]]:
    """PostgreSQL on the host side of the node's veth (pods reach it, nothing else does),
    password-authenticated for the pod network. ``url``: what the chart's Secret holds;
    ``local``: the same database from the test, over loopback."""
    hba = data / "pg_hba.conf"
    hba.write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        f"host all all {node.pod_cidr} scram-sha-256\n"
    )
    hba.chmod(0o644)
    server = EmbeddedPostgres(
        data,
        settings={
            "listen_addresses": f"'127.0.0.1,{node.host_ip}'",
            "hba_file": f"'{hba}'",
            "fsync": "off",
            "synchronous_commit": "off",
        },
    )
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE cronwell LOGIN PASSWORD '{DB_PASSWORD}'")  # type: ignore[arg-type]
            conn.execute("CREATE DATABASE cronwell OWNER cronwell")
        yield {
            "url": f"postgresql://cronwell:{DB_PASSWORD}@{node.host_ip}:{server.port}/cronwell",
            "local": f"postgresql://postgres@127.0.0.1:{server.port}/cronwell",
        }
    finally:
        server.stop("immediate")


def image_values(image: str) -> list[str]:
    """`--set` flags that point the chart at ``image`` (never pulled)."""
    repository, tag = image.rsplit(":", 1)
    return [
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
    ]  # fmt: skip


def helm_install(
    node: Node,
    helm: Helm,
    release: str,
    ns: str,
    image: str,
    database_url: str,
    *extra: str,
    secrets: dict[str, dict[str, str]] | None = None,
) -> float:
    """As docs/deploy.md tells users: the namespace enforcing Pod Security "restricted",
    the database Secret (and ``secrets``: name -> key -> value, e.g. a CA the values name),
    `helm install --wait`. Returns the seconds until all was Ready."""
    node.kubectl("create", "namespace", ns)
    node.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    secret = ("create", "secret", "generic", "cronwell-database")
    node.kubectl("-n", ns, *secret, f"--from-literal=url={database_url}")
    for name, data in (secrets or {}).items():
        literals = [f"--from-literal={key}={value}" for key, value in data.items()]
        node.kubectl("-n", ns, "create", "secret", "generic", name, *literals)
    # The CRDs are cluster-wide and kept by `helm uninstall` (crds.keep): a release installed
    # after another one in this session adopts them, as a user reinstalling would.
    crd = node.kubectl("get", "crd", "scheduledjobs.cronwell.dev", check=False)
    adopt = ["--take-ownership"] if crd.returncode == 0 else []
    started = time.monotonic()
    try:
        helm(
            "install", release, str(CHART), "--namespace", ns, "--wait", "--timeout", "10m",
            *adopt, *image_values(image),
            "--set", "database.existingSecret=cronwell-database",
            # The test server has no TLS; production keeps verify-full.
            "--set", "database.sslmode=disable",
            "--set", "operator.replicas=2", "--set", "scheduler.replicas=2",
            *extra,
            timeout=660,
        )  # fmt: skip
    except AssertionError:
        dump(node, ns)
        raise
    ready = time.monotonic() - started
    print(f"\nhelm install --wait: all Ready in {ready:.1f}s")
    return ready


def dump(node: Node, ns: str) -> None:
    """What a failed install looked like (pods, events, logs) into the test output."""
    print(node.kubectl("-n", ns, "get", "pods,jobs", "-o", "wide", check=False).stdout)
    print(node.kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout)
    pods = node.kubectl("-n", ns, "get", "pods", "-o", "name", check=False).stdout.split()
    for pod in pods:
        logs = node.kubectl("-n", ns, "logs", pod, "--all-containers", "--tail=20", check=False)
        print(f"--- {pod}\n{logs.stdout}{logs.stderr}")


def pods(node: Node, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        node.kubectl("-n", ns, "get", "pods", "-o", "json").stdout
    )["items"]
    return items


def component(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get("app.kubernetes.io/component"))


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def per_second_job(ns: str, name: str, url: str) -> dict[str, Any]:
    """A `* * * * * *` ScheduledJob POSTing to ``url``, kept whole for a ledger's checks."""
    return {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "ScheduledJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedule": "* * * * * *",
            # Every instant runs even while an earlier one is still active: with the
            # default (Skip) a slow attempt skips the next instant by design, which
            # would hide a lost one.
            "concurrencyPolicy": "Allow",
            # The store keeps the whole window (the default keeps the newest 100).
            "successfulJobsHistoryLimit": 10000,
            "retry": {"maxAttempts": 20, "initialDelaySeconds": 1, "maxDelaySeconds": 5},
            "timeoutSeconds": 10,
            "target": {"http": {"url": url, "method": "POST"}},
        },
    }


def instant(key: str) -> float:
    """The nominal instant of an idempotency key (<job uid>:<UTC instant>)."""
    return (
        datetime.strptime(key.split(":", 1)[1], "%Y-%m-%dT%H:%M:%SZ")
        .replace(tzinfo=UTC)
        .timestamp()
    )
