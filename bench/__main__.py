"""cronwell benchmarks: figures to compare, never assertions.

    .venv/bin/python hack/bench.py [--jobs 50000] [--workers 2] [--only materialise,burst]

Runs against a fresh embedded PostgreSQL (durability on, as in production) on this
machine, prints a table and writes bench/results/<name>.json.

- materialise: N jobs due in the same second; one scheduler owning all partitions turns
  them into occurrences. Time, occurrences/s, database round trips and CPU per occurrence.
- burst: the same N occurrences due at one instant T, executed by worker *processes*
  with a no-op handler. Start lag (actual start - nominal T) p50/p95/p99/max from the
  database's clock, and the time until all succeeded.
- prescale: one burst with the worker pool at its minimum (1 process) vs pre-scaled (the
  processes the operator's forecast plans), start lag side by side (hack/bench_prescale.py).
- retention: simulated days of history (1M occurrences/day with --retention-full) with the
  pruner after each day: table size, due scan, claim and status batch per day
  (hack/bench_retention.py).
- schedule: `next_after` per call (median, p99) for per-minute, per-second and yearly
  schedules, outside and an hour before DST changes (hack/bench_schedule.py; no database).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import lag_stats, succeeded_lags  # noqa: E402

from cronwell import jobs  # noqa: E402
from cronwell.embedded import EmbeddedPostgres  # noqa: E402
from cronwell.models import ScheduledJobSpec  # noqa: E402
from cronwell.scheduler import Scheduler  # noqa: E402
from cronwell.settings import SchedulerSettings  # noqa: E402
from cronwell.store import Database, migrate  # noqa: E402

NOOP_MODULE = """
import cronwell

@cronwell.handler("bench.noop")
async def noop(ctx):
    return None
"""


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _postgres_cpu() -> float:
    """CPU seconds of every postgres process on the machine (the bench's server)."""
    total = 0.0
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == "postgres":
            with contextlib.suppress(psutil.Error):
                total += _cpu(p.pid)
    return total


async def seed(
    db: Database, n: int, due_sql: str, target: dict[str, Any], schedule: str = "0 0 1 1 *"
) -> None:
    """n jobs whose next_run_at is the same instant (bulk SQL: seeding is not measured)."""
    spec = jobs.spec_document(
        ScheduledJobSpec.model_validate(
            {"schedule": schedule, "target": target, "concurrencyPolicy": "Skip"}
        )
    )
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_jobs CASCADE"
        )
        await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            " next_run_at) SELECT gen_random_uuid(), 'bench', 'j' || i, %s::jsonb, 'h',"
            " 'default', i %% 16, " + due_sql + " FROM generate_series(1, %s) i",
            (json.dumps(spec), n),
        )
        await conn.execute("ANALYZE")


async def _keep_leases(s: Scheduler) -> None:
    while True:
        await asyncio.sleep(s.settings.partition_lease_seconds / 3)
        await s.balance()


async def materialise(db: Database, n: int) -> dict[str, Any]:
    await seed(
        db, n, "date_trunc('second', now()) + interval '10 seconds'", {"log": {"message": "x"}}
    )
    s = Scheduler(db, SchedulerSettings(partitions=16, horizon_seconds=30))
    await db.execute("PartitionEnsure", {"partitions": 16})
    await s.balance()
    keep = asyncio.create_task(_keep_leases(s))
    st0, tx0 = db.statements, db.transactions
    cpu0, t0 = time.process_time(), time.perf_counter()
    done = await s.materialise_until_idle()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    keep.cancel()
    trips = (db.statements - st0) + 2 * (db.transactions - tx0)
    await s.resign()
    assert done == n, (done, n)
    return {
        "occurrences": n,
        "seconds": round(wall, 3),
        "per_second": round(n / wall),
        "round_trips_per_occurrence": round(trips / n, 4),
        "scheduler_cpu_ms_per_occurrence": round(1000 * cpu / n, 4),
    }


async def prepare_burst(db: Database, n: int, lead: float) -> None:
    """n occurrences due at T = now + lead, materialised by one scheduler (not measured)."""
    await seed(
        db,
        n,
        f"date_trunc('second', now()) + interval '{int(lead)} seconds'",
        {"handler": {"name": "bench.noop"}},
    )
    s = Scheduler(db, SchedulerSettings(partitions=16, horizon_seconds=lead + 5))
    await db.execute("PartitionEnsure", {"partitions": 16})
    await s.balance()
    keep = asyncio.create_task(_keep_leases(s))
    await s.materialise_until_idle()
    keep.cancel()
    await s.resign()


async def burst(
    db: Database,
    url: str,
    n: int,
    workers: int,
    concurrency: int,
    lead: float,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Materialise n occurrences due at T = now + lead, then let worker processes run them.
    With `profile`, py-spy samples every worker process (raw collapsed stacks there)."""
    await prepare_burst(db, n, lead)
    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / "cronwell_bench_noop.py").write_text(NOOP_MODULE)
    env = os.environ | {
        "PYTHONPATH": str(mod_dir),
        "CRONWELL_DATABASE_URL": url,
        "CRONWELL_LOG_LEVEL": "WARNING",
        "CRONWELL_CLAIM_BATCH_SIZE": "500",
    }
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
            [
                sys.executable,
                "-m",
                "cronwell",
                "worker",
                "--concurrency",
                str(concurrency),
                "--import",
                "cronwell_bench_noop",
            ],
            env=env,
            start_new_session=True,
        )
        for _ in range(workers)
    ]
    spies: list[subprocess.Popen[bytes]] = []
    pg_cpu0 = _postgres_cpu()
    try:
        row = await db.fetchone("OccurrenceNextDue", {"pool": "default"})
        assert row is not None and row["next_due"] is not None
        due_in = (row["next_due"] - row["db_now"]).total_seconds()
        if due_in < 1:
            print(f"warning: materialisation left only {due_in:.2f}s before T", file=sys.stderr)
        if profile is not None:
            # Sample from just before T: worker start-up (imports) is not the hot path.
            profile.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
            await asyncio.sleep(max(0.0, due_in - 1.0))
            spies = [
                subprocess.Popen(  # noqa: ASYNC220
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "--format",
                        "raw",
                        "--rate",
                        "200",
                        "--nonblocking",
                        "-o",
                        str(profile / f"worker-{i}.txt"),
                        "-p",
                        str(p.pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for i, p in enumerate(procs)
            ]
        deadline = time.monotonic() + due_in + 300
        while time.monotonic() < deadline:
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'succeeded') AS done FROM "
                    "cronwell_occurrences"
                )
                done = (await cur.fetchone() or {"done": 0})["done"]
            if done >= n:
                break
            await asyncio.sleep(0.25)
        worker_cpu = sum(_cpu(p.pid) for p in procs)
        pg_cpu = _postgres_cpu() - pg_cpu0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.terminate()
    async with db.connection() as conn:
        lags, done_after = await succeeded_lags(conn)
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cronwell_attempts WHERE outcome = 'succeeded'"
        )
        successes = (await cur.fetchone() or {"n": 0})["n"]
    if done_after is None:
        return {"occurrences": n, "succeeded": 0}
    return {
        "occurrences": n,
        "succeeded": len(lags),
        "success_attempt_rows": successes,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        **lag_stats(lags),  # sorts `lags` in place (the CDF below reads them sorted)
        "all_succeeded_after_s": round(done_after, 3),
        "worker_cpu_ms_per_occurrence": round(1000 * worker_cpu / n, 3),
        "postgres_cpu_ms_per_occurrence": round(1000 * pg_cpu / n, 3),
        "per_second": round(len(lags) / max(done_after, 1e-3)),
        "_lags": lags,
    }


SECTIONS = (
    "materialise",
    "burst",
    "ceiling",
    "peer",
    "sustained",
    "growth",
    "profile",
    "status",
    "prescale",
    "retention",
    "schedule",
)
COMPARED = (
    "per_second",
    "start_lag_p50_s",
    "start_lag_p95_s",
    "start_lag_p99_s",
    "start_lag_max_s",
    "all_succeeded_after_s",
)


def worker_env(url: str) -> dict[str, str]:
    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / "cronwell_bench_noop.py").write_text(NOOP_MODULE)
    return os.environ | {
        "PYTHONPATH": str(mod_dir),
        "CRONWELL_DATABASE_URL": url,
        "CRONWELL_LOG_LEVEL": "WARNING",
        "CRONWELL_CLAIM_BATCH_SIZE": "500",
    }


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return "-"
    return f"{a / b:.2f}x"


def _table(title: str, cw: dict[str, Any], peer: dict[str, Any], ceil: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(
        f"{'figure':<24}{'cronwell':>12}{'peer':>12}{'ceiling':>12}"
        f"{'cw/peer':>10}{'cw/ceiling':>12}"
    )
    for k in COMPARED:
        a, b, c = cw.get(k, "-"), peer.get(k, "-"), ceil.get(k, "-")
        print(f"{k:<24}{a!s:>12}{b!s:>12}{c!s:>12}{ratio(a, b):>10}{ratio(a, c):>12}")


def report(results: dict[str, Any]) -> None:
    cw, peer, ceil = (results.get(k, {}) for k in ("burst", "peer", "ceiling"))
    small = results.get("burst_at_peer_n")
    if small:
        _table(f"burst of {small.get('occurrences')} due at T (cronwell vs peer)", small, peer, {})
        peer = {}
    if cw:
        _table(f"burst of {cw.get('occurrences')} due at T", cw, peer, ceil)
        goal = cw.get("start_lag_p99_s")
        if isinstance(goal, int | float):
            verdict = "meets" if goal <= 5 else "MISSES"
            print(f"goal p99 start lag <= 5 s: {verdict} ({goal} s)")
    print(f"\n{'figure':<56} value")
    for section, figs in results.items():
        for k, v in figs.items():
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    print(f"{section + '.' + k + '.' + k2:<56} {v2}")
            else:
                print(f"{section + '.' + k:<56} {v}")


def plot(lags: dict[str, list[float]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, xs in lags.items():
        if xs:
            xs = sorted(xs)
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.axvline(5, color="grey", linestyle=":", label="goal: p99 <= 5 s")
    ax.axhline(0.99, color="lightgrey", linestyle=":")
    ax.set_xlabel("start lag (s, database clock)")
    ax.set_ylabel("fraction of occurrences started")
    ax.set_title("Start-lag CDF, burst due at T")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--lead", type=float, default=40.0, help="burst T = now + lead seconds")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"any of {','.join(SECTIONS)}")
    ap.add_argument(
        "--peer-jobs",
        type=int,
        default=10_000,
        help="burst size for the peer (0: same as --jobs); when it differs, cronwell's burst"
        " is also run at this size so the ratios compare like with like",
    )
    ap.add_argument("--peer-lead", type=float, default=15.0)
    ap.add_argument(
        "--peer-poll", type=float, default=1.0, help="procrastinate fetch polling interval"
    )
    ap.add_argument("--ceiling-batch", type=int, default=500)
    ap.add_argument("--sustained-jobs", type=int, default=2000)
    ap.add_argument("--sustained-seconds", type=float, default=40.0)
    ap.add_argument("--sustained-warmup", type=float, default=10.0)
    ap.add_argument("--growth-sizes", default="10000,100000,1000000")
    ap.add_argument("--growth-history", type=int, default=1, help="succeeded occurrences per job")
    ap.add_argument("--growth-reps", type=int, default=7)
    ap.add_argument("--profile-jobs", type=int, default=20_000)
    ap.add_argument("--prescale-n", type=int, default=50_000, help="prescale: burst size")
    ap.add_argument(
        "--prescale-duration", type=float, default=0.2, help="prescale: handler seconds"
    )
    ap.add_argument("--prescale-concurrency", type=int, default=64)
    ap.add_argument("--prescale-max-workers", type=int, default=4)
    ap.add_argument("--status-jobs", type=int, default=10_000, help="CRs of the status bench")
    ap.add_argument("--status-qps", default="20,100", help="operator --status-qps settings")
    ap.add_argument("--retention-days", type=int, default=10, help="retention: simulated days")
    ap.add_argument(
        "--retention-per-day", type=int, default=100_000, help="retention: occurrences a day"
    )
    ap.add_argument("--retention-jobs", type=int, default=1000, help="retention: recurring jobs")
    ap.add_argument(
        "--retention-full",
        action="store_true",
        help="retention: 30 days of 1,000,000 occurrences over 10,000 jobs (about an hour)",
    )
    ap.add_argument("--schedule-calls", type=int, default=10_000, help="schedule: calls per case")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    server = EmbeddedPostgres(
        Path(tempfile.mkdtemp(prefix="cronwell-bench-")),
        settings={"max_connections": "300", "shared_buffers": "512MB"},
    )
    url = server.start()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    lags: dict[str, list[float]] = {}
    args.out.mkdir(parents=True, exist_ok=True)

    def done(name: str, figs: dict[str, Any]) -> None:
        if "_lags" in figs:
            lags[name] = figs.pop("_lags")
        results[name] = figs
        print(f"{name}:", json.dumps(figs), flush=True)

    t_all = time.perf_counter()
    try:
        async with Database(url, max_size=4) as db:
            await migrate(db)
            if "materialise" in only:
                done("materialise", await materialise(db, args.jobs))
            if "burst" in only:
                done(
                    "burst",
                    await burst(db, url, args.jobs, args.workers, args.concurrency, args.lead),
                )
            if "ceiling" in only:
                import bench_ceiling

                await prepare_burst(db, args.jobs, args.lead)
                done(
                    "ceiling",
                    await bench_ceiling.ceiling(
                        db, url, args.jobs, args.workers, args.ceiling_batch
                    ),
                )
            peer_n = args.peer_jobs or args.jobs
            if "peer" in only and peer_n != args.jobs:
                done(
                    "burst_at_peer_n",
                    await burst(db, url, peer_n, args.workers, args.concurrency, args.peer_lead),
                )
            if "peer" in only:
                import bench_peer

                done(
                    "peer",
                    await bench_peer.peer_burst(
                        url,
                        peer_n,
                        args.workers,
                        args.concurrency,
                        args.peer_lead,
                        args.peer_poll,
                    ),
                )
            if "sustained" in only:
                import bench_sustained

                done(
                    "sustained",
                    await bench_sustained.sustained(
                        db,
                        url,
                        seed,
                        worker_env(url),
                        args.sustained_jobs,
                        args.workers,
                        args.concurrency,
                        args.sustained_seconds,
                        args.sustained_warmup,
                    ),
                )
            if "growth" in only:
                import bench_growth

                spec = jobs.spec_document(
                    ScheduledJobSpec.model_validate(
                        {"schedule": "* * * * *", "target": {"handler": {"name": "bench.noop"}}}
                    )
                )
                sizes = [int(x) for x in args.growth_sizes.split(",") if x]
                done(
                    "growth",
                    await bench_growth.growth(
                        db, spec, sizes, args.growth_history, args.growth_reps
                    ),
                )
            if "profile" in only:
                import bench_profile

                pdir = args.out / "profile"
                for f in pdir.glob("worker-*.txt"):
                    f.unlink()
                figs = await burst(
                    db,
                    url,
                    args.profile_jobs,
                    args.workers,
                    args.concurrency,
                    args.lead,
                    profile=pdir,
                )
                prof = bench_profile.analyse(sorted(pdir.glob("worker-*.txt")))
                done(
                    "profile",
                    {
                        "occurrences": args.profile_jobs,
                        "per_second_under_py_spy": figs.get("per_second"),
                        "start_lag_p99_s": figs.get("start_lag_p99_s"),
                    }
                    | prof,
                )
            if "schedule" in only:
                import bench_schedule

                done("schedule", bench_schedule.schedule_bench(args.schedule_calls))
            if "status" in only:
                import bench_status
                import psycopg
                from bench_common import db_url

                # Its own database (the operator migrates it), a local control plane.
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DROP DATABASE IF EXISTS cronwell_status_bench")
                    conn.execute("CREATE DATABASE cronwell_status_bench")
                qps = [float(q) for q in args.status_qps.split(",") if q]
                settings = await asyncio.to_thread(
                    bench_status.run, db_url(url, "cronwell_status_bench"), args.status_jobs, qps
                )
                done("status", {"settings": settings})
            if "prescale" in only:
                import bench_prescale

                figs = await bench_prescale.prescale(
                    db,
                    url,
                    seed,
                    args.prescale_n,
                    args.prescale_concurrency,
                    args.prescale_duration,
                    args.prescale_max_workers,
                    args.lead,
                )
                done("prescale", figs)
                bench_prescale.report(figs)
            if "retention" in only:
                import bench_retention

                def doc(spec: dict[str, Any]) -> dict[str, Any]:
                    return jobs.spec_document(ScheduledJobSpec.model_validate(spec))

                full = args.retention_full
                done(
                    "retention",
                    await bench_retention.retention(
                        db,
                        # 10 dead runs kept: the limit is reached within the simulated days
                        doc(
                            {
                                "schedule": "* * * * *",
                                "failedJobsHistoryLimit": 10,
                                "target": {"log": {}},
                            }
                        ),
                        doc({"runAt": "2020-01-01T00:00:00Z", "target": {"log": {}}}),
                        days=30 if full else args.retention_days,
                        per_day=1_000_000 if full else args.retention_per_day,
                        n_jobs=10_000 if full else args.retention_jobs,
                    ),
                )
    finally:
        server.stop("fast")
    results["machine"]["total_seconds"] = round(time.perf_counter() - t_all, 1)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2))
    if lags:
        (args.out / "start_lags.json").write_text(json.dumps(lags))
        cdf = {
            f"{k} (n={results[k].get('occurrences')})": v
            for k, v in lags.items()
            if k in ("burst", "burst_at_peer_n", "peer")
        }
        png = plot(cdf, args.out / "start_lag_cdf.png") if cdf else None
        if png:
            print(f"plot: {png}")
    report(results)


if __name__ == "__main__":
    asyncio.run(main())
