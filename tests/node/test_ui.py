"""The dashboard from the chart (ui.enabled, ui.allowActions) on a real node, reached as
users reach it, with `kubectl cronwell ui` (a port-forward through the kubelet): its pod
runs restricted, a request without a token is 401, and real ServiceAccount tokens (the
TokenRequest API) are checked by real TokenReviews and SubjectAccessReviews: a viewer
(get/list scheduledjobs) sees the dead letter and is refused its replay, an editor
(get/list/update) replays it and the worker runs it again.

The dead letter is real: a ScheduledJob triggered once whose http target's port is closed
dies after its one attempt; a receiver then listens there, so the replay succeeds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cronwell.testing.node import Node
from cronwell.ui.app import csrf_of
from cronwell_operator.testing import wait_until
from tests.helpers.http import BurstServer
from tests.node.release import RELEASE, _component, _pods, _ready

pytestmark = pytest.mark.timeout(1800)
VENV_BIN = Path(sys.executable).parent
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture(scope="module")
def tenant(node: Node, release: dict[str, Any]) -> Iterator[dict[str, str]]:
    """A namespace with two ServiceAccounts bound to Roles on scheduledjobs (viewer:
    get/list; editor: get/list/update) and their tokens from the TokenRequest API."""
    ns = f"ui-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", ns)
    verbs = {"viewer": "get,list", "editor": "get,list,update"}
    tokens = {"ns": ns}
    for who, verb in verbs.items():
        node.kubectl("-n", ns, "create", "serviceaccount", who)
        node.kubectl("-n", ns, "create", "role", who, f"--verb={verb}",
                     "--resource=scheduledjobs.cronwell.dev")  # fmt: skip
        node.kubectl("-n", ns, "create", "rolebinding", who, f"--role={who}",
                     f"--serviceaccount={ns}:{who}")  # fmt: skip
        tokens[who] = node.kubectl("-n", ns, "create", "token", who).stdout.strip()
    try:
        yield tokens
    finally:
        node.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def dashboard(node: Node, release: dict[str, Any]) -> Iterator[str]:
    """`kubectl cronwell ui -n NS --local-port 0`: the base URL it forwards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWELL_")}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{Path(node.kubectl_binary).parent}{os.pathsep}"
            f"{env.get('PATH', '')}", "KUBECONFIG": str(node.kubeconfig)}  # fmt: skip
    proc = subprocess.Popen(
        [str(node.kubectl_binary), "cronwell", "ui", "-n", release["ns"], "--local-port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    port = None
    for line in proc.stdout:
        seen.append(line)
        if m := re.match(r"Forwarding from 127\.0\.0\.1:(\d+)", line):
            port = m.group(1)
            break
    assert port, "kubectl cronwell ui never forwarded:\n" + "".join(seen)
    assert "  Authorization: Bearer TOKEN\n" in seen
    # Keep reading its output, or the pipe fills and kubectl blocks.
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def call(url: str, token: str | None = None, form: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a GET, or of a POST of `form`; redirects are answers, not followed."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def state(database: dict[str, str], key: str) -> str:
    with psycopg.connect(database["local"]) as conn:
        row = conn.execute(
            "SELECT state FROM cronwell_occurrences WHERE idempotency_key = %s", (key,)
        ).fetchone()
    return str(row[0]) if row else ""


@pytest.fixture(scope="module")
def dead_letter(node: Node, tenant: dict[str, str], database: dict[str, str]) -> tuple[str, int]:
    """A dead occurrence of a job in the tenant namespace: (its key, the closed port its
    target calls)."""
    ns, port = tenant["ns"], _free_port(node.host_ip)
    job = {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "ScheduledJob",
        "metadata": {"name": "doomed", "namespace": ns,
                     "annotations": {"cronwell.dev/trigger": "ui-node"}},
        "spec": {
            "schedule": "0 0 1 1 *",
            "retry": {"maxAttempts": 1},
            "target": {"http": {"url": f"http://{node.host_ip}:{port}/doomed", "method": "POST"}},
        },
    }  # fmt: skip
    node.kubectl("apply", "-f", "-", input=json.dumps(job))
    uid = json.loads(node.kubectl("-n", ns, "get", "sj", "doomed", "-o", "json").stdout)[
        "metadata"
    ]["uid"]
    key = f"{uid}:trigger:ui-node"
    wait_until(lambda: state(database, key) == "dead", 180, f"{key} never died")
    return key, port


def test_ui_pod_runs_restricted(node: Node, release: dict[str, Any]) -> None:
    (pod,) = [p for p in _pods(node, release["ns"]) if _component(p) == "ui"]
    assert _ready(pod), "the dashboard never became Ready through GET /healthz"
    spec = pod["spec"]
    assert spec["serviceAccountName"] == f"{RELEASE}-cronwell-ui"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert "--auth=kubernetes" in c["args"] and "--allow-actions" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_tokens_are_reviewed_and_only_update_may_replay(
    node: Node,
    dashboard: str,
    tenant: dict[str, str],
    dead_letter: tuple[str, int],
    database: dict[str, str],
) -> None:
    key, port = dead_letter
    ns = tenant["ns"]
    assert call(f"{dashboard}/healthz") == (200, "ok")
    status, body = call(f"{dashboard}/")
    assert status == 401, body
    assert call(f"{dashboard}/", "not-a-token")[0] == 401

    viewer, editor = tenant["viewer"], tenant["editor"]
    for path in ("/", "/runs", f"/dead?namespace={ns}", f"/jobs/{ns}/doomed"):
        status, body = call(f"{dashboard}{path}", viewer)
        assert status == 200, f"{path}: {status} {body[:300]}"
    status, page = call(f"{dashboard}/dead?namespace={ns}", viewer)
    assert key in page
    assert CSRF.search(page) is None  # no Replay form for a user who may not update
    status, page = call(f"{dashboard}/dead?namespace={ns}", editor)
    csrf = CSRF.search(page)
    assert csrf, "no CSRF token on the editor's dead-letter page"
    form = {"csrf_token": csrf.group(1), "key": key}
    # The editor's form with the viewer's token: refused (a form is good only for its user).
    status, body = call(f"{dashboard}/dead/replay", viewer, form)
    assert status == 403 and "CSRF" in body, body
    # The viewer's own token (derived from its bearer token): refused by RBAC.
    status, body = call(f"{dashboard}/dead/replay", viewer, form | {"csrf_token": csrf_of(viewer)})
    assert status == 403, body
    assert f"You may not update ScheduledJobs in namespace {ns}" in body
    assert state(database, key) == "dead"

    # The target answers from now on: the replayed occurrence succeeds.
    received: list[str | None] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(self.headers.get("Idempotency-Key"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = BurstServer((node.host_ip, port), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, body = call(f"{dashboard}/dead/replay", editor, form)
        assert status == 303, body
        assert state(database, key) != "dead"
        wait_until(lambda: state(database, key) == "succeeded", 120, "the replay never ran")
        assert received == [key]
    finally:
        server.shutdown()
        server.server_close()
