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
  success to the last status shown, and the peak rate between two scrapes (2 s apart);
- floor_s = CRs / QPS (one patch per changed CR is the least the writer can do at that rate)
  and over_floor_pct: how much longer than that the writer took, from the first success to
  the last status shown;
- api_server_patches_per_s: what this API server takes from plain client threads (as many
  as the writer's concurrency, one small status merge patch per CR, 10 s, just before the
  burst, the operator's watch open): on one machine its share of the cores can be below
  the QPS. floor_here_s = CRs / min(QPS, that rate) and over_floor_here_pct: the writer's
  own overhead on this machine;
- failures first: `--failing` more CRs (default 10) whose target always fails (a refused
  connection, one attempt: dead-lettered at once), due at the same T among the N successes.
  failure_on_cr_max_s: from a failure's finished_at to its CR showing lastFailureTime, the
  worst of them; successes_shown_before_last_failure: how many success statuses the writer
  wrote before the last failure's (0 when every failure went first).

One machine runs everything (API server, etcd, PostgreSQL, operator, workers): the API
server's CPU is shared, so figures are upper bounds of what a real cluster would show.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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

from bench.common import RESULTS, ROOT, discard, stop_all, worker_argv
from cronwell.embedded import EmbeddedPostgres, free_port
from cronwell.models import GROUP, VERSION
from cronwell.testing.controlplane import ControlPlane, find_assets
from cronwell_operator.settings import StatusSettings
from cronwell_operator.testing import OperatorProcess, sql, wait_until

NS = "bench"
#: The operator's status requests in flight (its default), also the raw probe's threads.
STATUS_CONCURRENCY = StatusSettings.model_fields["concurrency"].default
PLURAL = "scheduledjobs"
SPEC = {"schedule": "0 0 1 1 *", "target": {"log": {"message": "bench"}}}
#: Always fails at once: nothing listens on port 9 (discard); one attempt, then dead-lettered.
FAILING_SPEC = {
    "schedule": "0 0 1 1 *",
    "target": {"http": {"url": "http://127.0.0.1:9/fail", "connectTimeoutSeconds": 1}},
    "retry": {"maxAttempts": 1},
}


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


def create_crs(api: client.ApiClient, n: int, failing: int, threads: int = 8) -> float:
    """n succeeding ScheduledJobs (j000000...) and `failing` failing ones (f000...), created
    in parallel; seconds taken."""
    custom = client.CustomObjectsApi(api)
    wanted = [(f"j{i:06d}", SPEC) for i in range(n)] + [
        (f"f{i:03d}", FAILING_SPEC) for i in range(failing)
    ]

    def one(item: tuple[str, dict[str, Any]]) -> None:
        name, spec = item
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, wanted))
    return time.monotonic() - t0


def raw_patch_rate(kubeconfig: str, n: int, threads: int, seconds: float = 10.0) -> float:
    """Status patches per second this API server takes, here and now, from `threads` plain
    client threads (the same kubernetes client, no operator logic), a merge patch of one
    status field per CR (j000000...), for at most `seconds`: on one machine the API
    server's share of the cores, not the QPS setting, may be what bounds a writer."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig
    )
    api.configuration.connection_pool_maxsize = threads
    custom = client.CustomObjectsApi(api)
    names = [f"j{i:06d}" for i in range(n)]
    body = {"status": {"lastScheduleTime": "2000-01-01T00:00:00Z"}}  # never the bench's T
    stop_at = time.monotonic() + seconds

    def one(name: str) -> int:
        if time.monotonic() > stop_at:
            return 0
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name, body, _content_type="application/merge-patch+json"
        )
        return 1

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        done = sum(pool.map(one, names))
    rate = done / (time.monotonic() - t0)
    api.close()  # type: ignore[no-untyped-call]
    return rate


class Converged:
    """Watches the CRs; records when each one's status first shows the run at T: `at` for
    the succeeding CRs (by uid), `failed_at` for the failing ones (by name)."""

    def __init__(self, api: client.ApiClient, t_iso: str, n: int):
        self.custom = client.CustomObjectsApi(api)
        self.t_iso = t_iso
        self.n = n
        self.at: dict[str, float] = {}
        self.failed_at: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _see(self, obj: dict[str, Any]) -> None:
        st = obj.get("status") or {}
        if st.get("lastScheduleTime") != self.t_iso:
            return
        name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
        if name.startswith("f"):
            if name not in self.failed_at and st.get("lastFailureTime"):
                self.failed_at[name] = time.time()
        elif uid not in self.at and st.get("lastSuccessfulTime"):
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
    failing: int,
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
            return seen >= n + failing and backlog == 0

        wait_until(resumed, timeout, "the operator resumed every CR", interval=1, check=op._alive)
        # What the API server takes here, with the operator's watch and one like the bench's
        # open (the measured run has both): the floor on this machine.
        probe_watch = Converged(api, "", n).start()
        probe = subprocess.run(  # its own process: the bench's threads share one GIL
            [sys.executable, "-m", "bench.status", "--raw-probe", str(plane.kubeconfig), str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        raw = float(probe.stdout)
        probe_watch.stop.set()
        log(f"qps={qps:g}: this API server takes {raw:.0f} status patches/s")
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
            dead = sql(
                url,
                "SELECT count(*) AS n FROM cronwell_occurrences "
                "WHERE scheduled_for = %s AND state = 'dead'",
                (t_burst,),
            )[0]
            return r if int(r["n"]) >= n and int(dead["n"]) >= failing else None

        runs: Any = wait_until(done, lead + timeout, "every run succeeded", interval=0.5)
        failed_done = {
            r["name"]: float(r["at"])
            for r in sql(
                url,
                "SELECT j.name, extract(epoch FROM o.finished_at) AS at "
                "FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id "
                "WHERE o.scheduled_for = %s AND o.state = 'dead'",
                (t_burst,),
            )
        }
        if len(failed_done) != failing:
            raise AssertionError(f"{len(failed_done)} of {failing} failing runs dead-lettered")
        t_last = float(runs["last"])
        log(f"qps={qps:g}: all {n} runs succeeded {t_last - t_burst.timestamp():.1f}s after T")
        peak, prev = 0.0, (time.time(), sum(api_requests(m0).values()))
        deadline = time.monotonic() + timeout
        while len(watcher.at) < n or len(watcher.failed_at) < failing:
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
        fail_lags = sorted(watcher.failed_at[k] - v for k, v in failed_done.items())
        last_fail_shown = max(watcher.failed_at.values(), default=0.0)
        floor = (n + failing) / qps
        floor_here = (n + failing) / min(qps, raw)
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
            "floor_s": round(floor, 1),
            "writer_window_s": round(window, 1),
            "over_floor_pct": round((window / floor - 1) * 100, 1),
            "api_server_patches_per_s": round(raw, 1),
            "floor_here_s": round(floor_here, 1),
            "over_floor_here_pct": round((window / floor_here - 1) * 100, 1),
            "failing": failing,
            "failure_on_cr_p50_s": round(fail_lags[len(fail_lags) // 2], 1) if fail_lags else None,
            "failure_on_cr_max_s": round(fail_lags[-1], 1) if fail_lags else None,
            "successes_shown_before_last_failure": sum(
                t < last_fail_shown for t in watcher.at.values()
            ),
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
    failing: int = 10,
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
                secs = create_crs(api, n, failing)
                log(f"{n + failing} CRs created in {secs:.1f}s ({(n + failing) / secs:.0f}/s)")
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
                        >= n + failing
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
                figs = one_setting(plane, api, url, qps, n, failing, lead, logs, timeout)
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
    ap.add_argument("--failing", type=int, default=10, help="CRs whose run fails, among them")
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
            args.failing,
        )
    finally:
        discard(server)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "status": results}))


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--raw-probe":
    # internal: `python -m bench.status --raw-probe KUBECONFIG N` prints raw_patch_rate
    print(raw_patch_rate(sys.argv[2], int(sys.argv[3]), STATUS_CONCURRENCY))
elif __name__ == "__main__":
    # SIGTERM (a timeout, a kill) unwinds like Ctrl-C: its PostgreSQL is stopped and removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
