"""cronwell benchmarks: figures to compare, never assertions.

    .venv/bin/python -m bench [--jobs 50000] [--workers 2] [--only materialise,burst]

Runs against a fresh embedded PostgreSQL (durability on, as in production) on this
machine, prints a table and writes bench/results/<name>.json. This module parses the
arguments, runs the sections asked for in order and prints the figures; each section is a
module of this package that says what it measures (materialise and burst: `bench.burst`;
the rest: `bench.<section>`), and bench/README.md lists them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import (
    burst,
    ceiling,
    growth,
    peer,
    prescale,
    profile,
    retention,
    schedule,
    status,
    sustained,
)
from bench.common import RESULTS, BenchError, bench_server, db_url, worker_env
from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, migrate

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
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
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
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    full = args.retention_full
    growth_sizes = [int(x) for x in args.growth_sizes.split(",") if x]
    retention_jobs = 10_000 if full else args.retention_jobs
    try:  # sizes a section cannot measure: say so before PostgreSQL starts
        if "growth" in only:
            growth.check(growth_sizes)
        if "retention" in only:
            retention.check(retention_jobs)
        if "prescale" in only:
            prescale.check(args.prescale_max_workers)
        if "sustained" in only:
            sustained.check(args.sustained_seconds, args.sustained_warmup)
        if "profile" in only and not burst.PY_SPY.exists():
            raise BenchError(f"profile needs py-spy ({burst.PY_SPY}): pip install -e '.[bench]'")
    except BenchError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")  # one line, no usage block
    server = bench_server()
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
                done("materialise", await burst.materialise(db, args.jobs))
            if "burst" in only:
                done(
                    "burst",
                    await burst.burst(
                        db, url, args.jobs, args.workers, args.concurrency, args.lead
                    ),
                )
            if "ceiling" in only:
                await burst.prepare_burst(db, args.jobs, args.lead)
                done(
                    "ceiling",
                    await ceiling.ceiling(db, url, args.jobs, args.workers, args.ceiling_batch),
                )
            peer_n = args.peer_jobs or args.jobs
            if "peer" in only and peer_n != args.jobs:
                done(
                    "burst_at_peer_n",
                    await burst.burst(
                        db, url, peer_n, args.workers, args.concurrency, args.peer_lead
                    ),
                )
            if "peer" in only:
                done(
                    "peer",
                    await peer.peer_burst(
                        url,
                        peer_n,
                        args.workers,
                        args.concurrency,
                        args.peer_lead,
                        args.peer_poll,
                    ),
                )
            if "sustained" in only:
                done(
                    "sustained",
                    await sustained.sustained(
                        db,
                        worker_env(url),
                        args.sustained_jobs,
                        args.workers,
                        args.concurrency,
                        args.sustained_seconds,
                        args.sustained_warmup,
                    ),
                )
            if "growth" in only:
                spec = jobs.spec_document(
                    ScheduledJobSpec.model_validate(
                        {"schedule": "* * * * *", "target": {"handler": {"name": "bench.noop"}}}
                    )
                )
                done(
                    "growth",
                    await growth.growth(
                        db, spec, growth_sizes, args.growth_history, args.growth_reps
                    ),
                )
            if "profile" in only:
                pdir = args.out / "profile"
                for f in pdir.glob("worker-*.txt"):
                    f.unlink()
                figs = await burst.burst(
                    db,
                    url,
                    args.profile_jobs,
                    args.workers,
                    args.concurrency,
                    args.lead,
                    profile=pdir,
                )
                prof = profile.analyse(sorted(pdir.glob("worker-*.txt")))
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
                done("schedule", schedule.schedule_bench(args.schedule_calls))
            if "status" in only:
                # Its own database (the operator migrates it), a local control plane.
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DROP DATABASE IF EXISTS cronwell_status_bench")
                    conn.execute("CREATE DATABASE cronwell_status_bench")
                qps = [float(q) for q in args.status_qps.split(",") if q]
                settings = await asyncio.to_thread(
                    status.run, db_url(url, "cronwell_status_bench"), args.status_jobs, qps
                )
                done("status", {"settings": settings})
            if "prescale" in only:
                figs = await prescale.prescale(
                    db,
                    url,
                    args.prescale_n,
                    args.prescale_concurrency,
                    args.prescale_duration,
                    args.prescale_max_workers,
                    args.lead,
                )
                done("prescale", figs)
                prescale.report(figs)
            if "retention" in only:

                def doc(spec: dict[str, Any]) -> dict[str, Any]:
                    return jobs.spec_document(ScheduledJobSpec.model_validate(spec))

                done(
                    "retention",
                    await retention.retention(
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
                        n_jobs=retention_jobs,
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
    try:
        asyncio.run(main())
    except BenchError as e:  # found mid-run (the server is stopped by then)
        sys.exit(f"error: {e}")
