"""Status convergence after a burst: how long until every ScheduledJob's status shows its
run, and at what API request rate, for each status QPS setting.

    .venv/bin/python -m bench.status [--jobs 10000] [--qps 20,100] [--workers 2]

A local control plane (etcd + kube-apiserver, no kubelet), an embedded PostgreSQL and real
processes: worker processes (log target: no work) and, per QPS setting, one `cronwell
operator` with that `--status-qps`. N CRs are created once (server-side, in parallel
threads) and reconciled; then, per setting, one occurrence per job is materialised due at
one instant T (inserted in SQL as the scheduler would, with the status triggers off for
that statement only: a CR whose status already shows T as its next run is the real
situation before a burst, and this keeps the writer from patching that first), the workers
run them, and a watch on the CRs records when each status shows the run
(lastScheduleTime = T and a lastSuccessfulTime). Figures:

- converged_after_last_success_s: from the last success (the store's finished_at) to the
  moment every CR shows it; the figure the brief asks for;
- cr_p50/p99 after T: when a CR's status shows its run, from T;
- api requests of the status writer (patches, Events, GETs) from the burst's set-up until
  every CR shows its run, from the operator's own metrics; their mean rate from the first
  success to the last status shown, and the peak rate between two scrapes (2 s apart).

One machine runs everything (API server, etcd, PostgreSQL, operator, workers): the API
server's CPU is shared, so figures are upper bounds of what a real cluster would show.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

from bench.common import RESULTS, ROOT, stop_all, worker_argv
from cronwell.embedded import EmbeddedPostgres, free_port
from cronwell.models import GROUP, VERSION
from cronwell.testing.controlplane import ControlPlane, find_assets
from cronwell_operator.testing import OperatorProcess, sql, wait_until

NS = "bench"
PLURAL = "scheduledjobs"
SPEC = {"schedule": "0 0 1 1 *", "target": {"log": {"message": "bench"}}}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scrape(port: int) -> dict[str, float]:
    """Operator metrics: 'name{k=v,...}' -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def api_requests(m: dict[str, float]) -> dict[str, float]:
    kinds = ("status_patch", "event", "status_get")
    return {k: m.get(f"cronwell_operator_api_requests_total{{kind={k}}}", 0.0) for k in kinds}


def create_crs(api: client.ApiClient, n: int, threads: int = 8) -> float:
    """n ScheduledJobs, created in parallel; seconds taken."""
    custom = client.CustomObjectsApi(api)

    def one(i: int) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledJob",
            "metadata": {"name": f"j{i:06d}", "namespace": NS},
            "spec": SPEC,
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))
    return time.monotonic() - t0


class Converged:
    """Watches the CRs; records when each one's status first shows the run at T."""

    def __init__(self, api: client.ApiClient, t_iso: str, n: int):
        self.custom = client.CustomObjectsApi(api)
        self.t_iso = t_iso
        self.n = n
        self.at: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _shows(self, obj: dict[str, Any]) -> bool:
        st = obj.get("status") or {}
        return st.get("lastScheduleTime") == self.t_iso and bool(st.get("lastSuccessfulTime"))

    def _see(self, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        if uid not in self.at and self._shows(obj):
            self.at[uid] = time.time()

    def start(self) -> Converged:
        self.thread.start()
        return self

    def _run(self) -> None:
        rv = ""
        while not self.stop.is_set():
            if not rv:  # (re)list: a snapshot, then watch from its version
                cont, rv = None, ""
                while True:
                    kw: dict[str, Any] = {"limit": 1000}
                    if cont:
                        kw["_continue"] = cont
                    page: Any = self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, NS, PLURAL, **kw
                    )
                    for obj in page["items"]:
                        self._see(obj)
                    rv = page["metadata"].get("resourceVersion") or rv
                    cont = page["metadata"].get("continue")
                    if not cont:
                        break
            w = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NS,
                    PLURAL,
                    resource_version=rv,
                    timeout_seconds=60,
                ):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":  # 410 Gone: list again
                        rv = ""
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    self._see(obj)
                    if self.stop.is_set():
                        break
            except Exception:  # 410, a dropped stream, or the control plane stopping
                rv = ""
            finally:
                w.stop()  # type: ignore[no-untyped-call]


def one_setting(
    plane: ControlPlane,
    api: client.ApiClient,
    url: str,
    qps: float,
    n: int,
    lead: float,
    logs: Path,
    timeout: float,
) -> dict[str, Any]:
    port = free_port()
    args = ["-n", NS, "--no-leader-election", "--status-qps", str(qps)]
    args += ["--metrics-port", str(port), "--identity", f"bench-q{qps:g}"]
    # WARNING: kopf's line per handled object is CPU the measured operator should not spend.
    op = OperatorProcess(
        plane.kubeconfig,
        url,
        logs / f"operator-q{qps:g}.log",
        args=args,
        env={"CRONWELL_LOG_LEVEL": "WARNING"},
    )
    op.start()
    try:
        # Resume: every CR handled once (the writer learns the status each shows); nothing
        # left in the change log.
        def resumed() -> bool:
            try:
                m = scrape(port)
            except OSError:
                return False
            seen = sum(
                m.get(f"cronwell_operator_reconciles_total{{outcome={o}}}", 0.0)
                for o in ("applied", "unchanged")
            )
            backlog = m.get("cronwell_operator_status_backlog{}", -1.0)
            return seen >= n and backlog == 0

        wait_until(resumed, timeout, "the operator resumed every CR", interval=1, check=op._alive)
        m0 = scrape(port)
        with psycopg.connect(url, autocommit=True) as conn:
            t_burst: datetime = conn.execute(  # type: ignore[index]
                "SELECT date_trunc('second', now()) + make_interval(secs => %s)", (lead,)
            ).fetchone()[0]
            conn.execute("SET session_replication_role = replica")  # no status-log rows
            conn.execute(
                "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
                " run_at, state, origin, overlap, delivery, max_attempts, timeout_seconds) "
                "SELECT id::text || ':' || to_char(%(t)s AT TIME ZONE 'UTC', "
                "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), id, pool, %(t)s, %(t)s, 'pending', "
                "'schedule', spec->>'concurrencyPolicy', spec->>'delivery', "
                "coalesce((spec->'retry'->>'maxAttempts')::int, 3), "
                "(spec->>'timeoutSeconds')::int "
                "FROM cronwell_jobs WHERE namespace = %(ns)s AND deleted_at IS NULL",
                {"t": t_burst, "ns": NS},
            )
        t_iso = t_burst.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        watcher = Converged(api, t_iso, n).start()
        log(f"qps={qps:g}: {n} jobs due at {t_iso}")

        def done() -> dict[str, Any] | None:
            r = sql(
                url,
                "SELECT count(*) AS n, extract(epoch FROM min(finished_at)) AS first, "
                "extract(epoch FROM max(finished_at)) AS last "
                "FROM cronwell_occurrences WHERE scheduled_for = %s AND state = 'succeeded'",
                (t_burst,),
            )[0]
            return r if int(r["n"]) >= n else None

        runs: Any = wait_until(done, lead + timeout, "every run succeeded", interval=0.5)
        t_last = float(runs["last"])
        log(f"qps={qps:g}: all {n} runs succeeded {t_last - t_burst.timestamp():.1f}s after T")
        peak, prev = 0.0, (time.time(), sum(api_requests(m0).values()))
        deadline = time.monotonic() + timeout
        while len(watcher.at) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(watcher.at)}/{n} statuses converged")
            op._alive()
            time.sleep(2)
            now, total = time.time(), sum(api_requests(scrape(port)).values())
            peak = max(peak, (total - prev[1]) / max(now - prev[0], 1e-3))
            prev = (now, total)
            log(f"qps={qps:g}: {len(watcher.at)}/{n} statuses show the run")
        watcher.stop.set()
        t_all = max(watcher.at.values())
        m1 = scrape(port)
        req = {k: v - api_requests(m0)[k] for k, v in api_requests(m1).items()}
        window = t_all - float(runs["first"])  # from the first success to the last status
        after_t = sorted(t - t_burst.timestamp() for t in watcher.at.values())
        return {
            "qps": qps,
            "crs": n,
            "runs_done_after_t_s": round(t_last - t_burst.timestamp(), 1),
            "converged_after_last_success_s": round(t_all - t_last, 1),
            "cr_p50_after_t_s": round(after_t[len(after_t) // 2], 1),
            "cr_p99_after_t_s": round(after_t[min(n - 1, int(0.99 * n))], 1),
            "api_requests": {k: int(v) for k, v in req.items()},
            "api_rps_mean": round(sum(req.values()) / window, 1),
            "api_rps_peak": round(peak, 1),
        }
    finally:
        op.stop()


def run(
    url: str,
    n: int,
    qps_list: list[float],
    workers: int = 2,
    concurrency: int = 500,
    lead: float = 20.0,
    timeout: float = 1800.0,
) -> list[dict[str, Any]]:
    """The whole bench against the PostgreSQL database at `url` (migrated by the operator)."""
    logs = Path(tempfile.mkdtemp(prefix="cronwell-bench-status-"))
    log(f"logs in {logs}")
    env = os.environ | {"CRONWELL_DATABASE_URL": url, "CRONWELL_LOG_LEVEL": "WARNING"}
    results: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[bytes]] = []
    with ControlPlane(find_assets()) as plane:
        plane.install_crds([ROOT / "crds"])
        plane.kubectl("create", "namespace", NS)
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(plane.kubeconfig)
        )
        api.configuration.connection_pool_maxsize = 16
        try:
            # Set-up (not measured): create and reconcile the CRs, their first status written
            # at a high QPS so that the measured operators start from a drained log.
            setup = OperatorProcess(
                plane.kubeconfig,
                url,
                logs / "operator-setup.log",
                identity="bench-setup",
                args=["-n", NS, "--no-leader-election", "--status-qps", "1000"],
            )
            with setup:
                setup.wait_ready(120)
                secs = create_crs(api, n)
                log(f"{n} CRs created in {secs:.1f}s ({n / secs:.0f}/s)")
                wait_until(
                    lambda: (
                        int(
                            sql(
                                url,
                                "SELECT count(*) AS n FROM cronwell_jobs WHERE namespace = %s "
                                "AND deleted_at IS NULL",
                                (NS,),
                            )[0]["n"]
                        )
                        >= n
                    ),
                    timeout,
                    "every CR in the store",
                    interval=1,
                    check=setup._alive,
                )
                wait_until(
                    lambda: not sql(url, "SELECT 1 FROM cronwell_status_changes LIMIT 1"),
                    timeout,
                    "the first statuses written",
                    interval=1,
                    check=setup._alive,
                )
                log("set-up done: every CR reconciled, its first status written")
            for i in range(workers):
                procs.append(
                    subprocess.Popen(
                        worker_argv(concurrency),
                        env=env
                        | {"CRONWELL_CLAIM_BATCH_SIZE": "500", "CRONWELL_POLL_SECONDS": "1"},
                        stdout=(logs / f"worker-{i}.log").open("ab"),
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            for qps in qps_list:
                figs = one_setting(plane, api, url, qps, n, lead, logs, timeout)
                results.append(figs)
                print(f"status qps={qps:g}:", json.dumps(figs), flush=True)
        finally:
            stop_all(procs)
            api.close()  # type: ignore[no-untyped-call]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--qps", default="20,100", help="status QPS settings, comma-separated")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--lead", type=float, default=20.0, help="T = now + lead seconds")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per phase, seconds")
    ap.add_argument("--out", type=Path, default=RESULTS / "status.json")
    args = ap.parse_args()
    server = EmbeddedPostgres(
        Path(tempfile.mkdtemp(prefix="cronwell-bench-status-pg-")),
        settings={"max_connections": "300", "shared_buffers": "256MB"},
    )
    url = server.start()
    try:
        results = run(
            url,
            args.jobs,
            [float(q) for q in args.qps.split(",") if q],
            args.workers,
            args.concurrency,
            args.lead,
            args.timeout,
        )
    finally:
        server.stop("fast")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "status": results}))


if __name__ == "__main__":
    main()
