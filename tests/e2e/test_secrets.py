"""Secret-backed headers, end to end with a real API server, operator, scheduler, worker and
HTTP server: the operator alone reads the Secret (in the job's namespace) and stores the
value encrypted; the worker sends it; it appears nowhere else (the CR, Events, the store in
plaintext, `cronwell runs`, `cronwell dlq show`, the processes' logs); a rotated Secret
reaches the next attempt."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import OperatorProcess, sql, wait_until
from tests.helpers import procs
from tests.helpers.kube import operator_args

KEY = Fernet.generate_key().decode()


class Server:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.seen.append((self.path, headers))
                # /echo answers 400 with the request's headers in the body, as some servers
                # do: the worker must not carry the credential into the error it records.
                status = 400 if self.path == "/echo" else 200
                echo = f"bad credentials: {headers.get('authorization')}"
                body = echo.encode() if status == 400 else b"{}"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def auth(self, path: str) -> list[str]:
        return [h.get("authorization", "") for p, h in self.seen if p == path]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture(scope="module")
def stack(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OperatorProcess, Path]]:
    logs = tmp_path_factory.mktemp("secrets")
    args = operator_args(ns)
    common = {"CRONWELL_SECRETS_KEY": KEY}
    op = OperatorProcess(
        kube.kubeconfig, store, logs / "operator.log", args=args,
        env=common | {"CRONWELL_OPERATOR_TENANCY_SYNC_SECONDS": "1"},
    )  # fmt: skip
    env = common | {"CRONWELL_DATABASE_URL": store, "CRONWELL_LOG_LEVEL": "DEBUG"}
    scheduler = procs.spawn("scheduler", env=env, log=logs / "scheduler.log")
    worker = procs.spawn(
        "worker", env=env | {"CRONWELL_EGRESS_ALLOW_CIDRS": "127.0.0.1/32"},
        log=logs / "worker.log",
    )  # fmt: skip
    try:
        op.start().wait_ready(120)
        yield op, logs
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)
    finally:
        op.stop()
        for p in (scheduler, worker):
            procs.stop(p)


def _secret(kube: Cluster, ns: str, value: str) -> None:
    manifest = kube.kubectl(
        "create", "secret", "generic", "api", "-n", ns, f"--from-literal=token={value}",
        "--dry-run=client", "-o", "yaml",
    ).stdout  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=manifest)


def _job(kube: Cluster, ns: str, name: str, url: str) -> None:
    kube.kubectl("apply", "-n", ns, "-f", "-", input=f"""
apiVersion: cronwell.dev/v1alpha1
kind: ScheduledJob
metadata: {{name: {name}}}
spec:
  schedule: "0 0 1 1 *"
  retry: {{maxAttempts: 1}}
  target:
    http:
      url: {url}
      headers:
        - {{name: Authorization, valueFrom: {{secretKeyRef: {{name: api, key: token}}}}}}
        - {{name: X-Plain, value: plain}}
""")  # fmt: skip


def _trigger(kube: Cluster, ns: str, name: str, value: str) -> None:
    kube.kubectl("annotate", "sj", name, "-n", ns, f"cronwell.dev/trigger={value}", "--overwrite")


def _cli(store: str, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "cronwell", "--database-url", store, *args],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return r.stdout + r.stderr


def test_secret_headers_are_sent_rotated_and_never_shown(
    kube: Cluster,
    ns: str,
    store: str,
    server: Server,
    stack: tuple[OperatorProcess, Path],
) -> None:
    op, logs = stack
    v1, v2 = f"Bearer s3cr3t-{secrets.token_hex(8)}", f"Bearer r0tat3d-{secrets.token_hex(8)}"
    _secret(kube, ns, v1)
    _job(kube, ns, "calls", f"{server.base}/ok")
    _trigger(kube, ns, "calls", "t1")
    wait_until(lambda: server.auth("/ok"), 60, "the first call", check=op._alive)
    assert server.auth("/ok") == [v1]
    assert [h["x-plain"] for p, h in server.seen if p == "/ok"] == ["plain"]

    # Rotation: the operator re-reads the Secret (every second here) and the next attempt
    # sends the new value.
    before = sql(store, "SELECT ciphertext FROM cronwell_job_secrets")
    _secret(kube, ns, v2)
    wait_until(
        lambda: sql(store, "SELECT ciphertext FROM cronwell_job_secrets") != before,
        60, "the rotated value in the store", check=op._alive,
    )  # fmt: skip
    _trigger(kube, ns, "calls", "t2")
    wait_until(lambda: len(server.auth("/ok")) == 2, 60, "the second call", check=op._alive)
    assert server.auth("/ok") == [v1, v2]

    # A server that echoes the request in its error answer: the recorded error is redacted.
    _job(kube, ns, "echo", f"{server.base}/echo")
    _trigger(kube, ns, "echo", "e1")
    (dead,) = wait_until(
        lambda: sql(store, "SELECT idempotency_key FROM cronwell_occurrences o JOIN "
                    "cronwell_jobs j ON j.id = o.job_id WHERE j.name = 'echo' AND "
                    "o.state = 'dead'"),
        60, "the echo call dead-lettered", check=op._alive,
    )  # fmt: skip
    assert server.auth("/echo") == [v2]
    shown = _cli(store, "dlq", "show", dead["idempotency_key"])
    assert "answered 400: bad credentials: ***" in shown, shown
    outputs = {
        "dlq show": shown,
        "dlq show --json": _cli(store, "dlq", "show", dead["idempotency_key"], "--json"),
        "runs": _cli(store, "runs", "-n", ns),
        "runs --json": _cli(store, "runs", "-n", ns, "--json"),
        "dlq list": _cli(store, "dlq", "list"),
        "the CRs": kube.kubectl("get", "sj", "-n", ns, "-o", "yaml").stdout,
        "the Events": kube.kubectl("get", "events", "-n", ns, "-o", "yaml").stdout,
    }
    # Every row of every cronwell table, as text: nothing in plaintext.
    tables = sql(store, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'cronwell_%%'")
    for t in tables:
        rows = sql(store, f"SELECT t::text AS row FROM {t['tablename']} t")
        outputs[f"table {t['tablename']}"] = "\n".join(r["row"] for r in rows)
    assert any("cronwell_job_secrets" in k and v for k, v in outputs.items())
    for f in ("operator.log", "scheduler.log", "worker.log"):
        outputs[f] = (logs / f).read_text()
    for where, text in outputs.items():
        for value in (v1, v2):
            token = value.split()[1]
            assert token not in text, f"the credential appears in {where}"


def test_a_missing_secret_is_a_warning_event_and_nothing_is_sent(
    kube: Cluster, ns: str, store: str, server: Server, stack: tuple[OperatorProcess, Path]
) -> None:
    op, _ = stack
    kube.kubectl("apply", "-n", ns, "-f", "-", input=f"""
apiVersion: cronwell.dev/v1alpha1
kind: ScheduledJob
metadata: {{name: nosecret}}
spec:
  schedule: "0 0 1 1 *"
  retry: {{maxAttempts: 1}}
  target:
    http:
      url: {server.base}/nosecret
      headers: [{{name: Authorization, valueFrom: {{secretKeyRef: {{name: absent, key: k}}}}}}]
""")  # fmt: skip

    def warnings() -> list[dict[str, Any]]:
        out = kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout
        return [
            e
            for e in json.loads(out)["items"]
            if (e.get("type"), e.get("reason")) == ("Warning", "SecretUnresolved")
            and "absent" in (e.get("message") or "")
        ]

    def warned() -> bool:
        return bool(warnings())

    wait_until(warned, 60, "a Warning Event naming the missing Secret", check=op._alive)
    _trigger(kube, ns, "nosecret", "n1")
    (o,) = wait_until(
        lambda: sql(store, "SELECT o.reason, o.last_error FROM cronwell_occurrences o JOIN "
                    "cronwell_jobs j ON j.id = o.job_id WHERE j.name = 'nosecret' AND "
                    "o.state = 'dead'"),
        60, "the attempt failed", check=op._alive,
    )  # fmt: skip
    assert o["reason"] in ("SecretUnresolved", "AttemptsExhausted"), o
    assert server.auth("/nosecret") == []
    # once per transition: kopf's retries of the reconcile posted no second Event
    assert sum(int(e.get("count") or 1) for e in warnings()) == 1


def test_namespaces_and_workerpools_are_synced_for_the_workers(
    kube: Cluster, ns: str, store: str, stack: tuple[OperatorProcess, Path]
) -> None:
    """The workers read no Kubernetes object: the leader copies what they enforce (a
    Namespace's labels and egress annotations, a WorkerPool's tenancy) into the store, and
    forgets it when it is gone."""
    op, _ = stack
    kube.kubectl("annotate", "namespace", ns, "cronwell.dev/egress-deny=10.0.0.0/8,*.corp",
                 "--overwrite")  # fmt: skip
    kube.kubectl("label", "namespace", ns, "team=pay", "--overwrite")
    kube.apply(
        f"apiVersion: cronwell.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: payments, "
        f"namespace: {ns}}}\nspec: {{scaleTargetRef: {{name: worker-payments}}, "
        "namespaces: [billing], handlers: [charge], "
        "namespaceSelector: {matchLabels: {team: pay}}}\n"
    )
    row = wait_until(
        lambda: sql(store, "SELECT labels, egress_allow, egress_deny FROM "
                    "cronwell_namespace_policies WHERE namespace = %s AND egress_deny IS NOT "
                    "NULL AND labels ? 'team'", (ns,)),
        60, "the namespace's policy in the store", check=op._alive,
    )[0]  # fmt: skip
    assert row["labels"]["team"] == "pay"
    assert (row["egress_allow"], row["egress_deny"]) == (None, "10.0.0.0/8,*.corp")
    pool = wait_until(
        lambda: sql(store, "SELECT * FROM cronwell_pool_policies WHERE pool = 'payments'"),
        60, "the WorkerPool's policy in the store", check=op._alive,
    )[0]  # fmt: skip
    assert pool["owner_namespace"] == ns and pool["namespaces"] == ["billing"]
    assert pool["handlers"] == ["charge"]
    assert pool["namespace_selector"] == {"matchLabels": {"team": "pay"}, "matchExpressions": []}
    kube.kubectl("delete", "workerpool", "payments", "-n", ns)
    wait_until(
        lambda: not sql(store, "SELECT 1 FROM cronwell_pool_policies WHERE pool = 'payments'"),
        60, "the WorkerPool's policy gone", check=op._alive,
    )  # fmt: skip
