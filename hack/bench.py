"""cronwell benchmarks: figures to compare, never assertions.

    .venv/bin/python hack/bench.py [--jobs 50000] [--workers 2] [--only materialise,burst]

Runs against a fresh embedded PostgreSQL (durability on, as in production) on this
machine, prints a table and writes bench/results/<name>.json.

- materialise: N jobs due in the same second; one scheduler owning all partitions turns
  them into occurrences. Time, occurrences/s, database round trips and CPU per occurrence.
- burst: the same N occurrences due at one instant T, executed by worker *processes*
  with a no-op handler. Start lag (actual start - nominal T) p50/p95/p99/max from the
  database's clock, and the time until all succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


async def seed(db: Database, n: int, due_sql: str, target: dict[str, Any]) -> None:
    """n jobs whose next_run_at is the same instant (bulk SQL: seeding is not measured)."""
    spec = jobs.spec_document(
        ScheduledJobSpec.model_validate(
            {"schedule": "0 0 1 1 *", "target": target, "concurrencyPolicy": "Skip"}
        )
    )
    async with db.connection() as conn:
        await conn.execute("TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_jobs")
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


async def burst(
    db: Database, url: str, n: int, workers: int, concurrency: int, lead: float
) -> dict[str, Any]:
    """Materialise n occurrences due at T = now + lead, then let worker processes run them."""
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
    pg_cpu0 = _postgres_cpu()
    try:
        row = await db.fetchone("OccurrenceNextDue", {"pool": "default"})
        assert row is not None and row["next_due"] is not None
        due_in = (row["next_due"] - row["db_now"]).total_seconds()
        if due_in < 1:
            print(f"warning: materialisation left only {due_in:.2f}s before T", file=sys.stderr)
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
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM o.started_at - o.scheduled_for) AS lag,"
            " extract(epoch FROM o.finished_at - o.scheduled_for) AS done_after"
            " FROM cronwell_occurrences o WHERE o.state = 'succeeded'"
        )
        rows = await cur.fetchall()
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cronwell_attempts WHERE outcome = 'succeeded'"
        )
        successes = (await cur.fetchone() or {"n": 0})["n"]
    lags = sorted(float(r["lag"]) for r in rows)
    if not lags:
        return {"occurrences": n, "succeeded": 0}

    def pct(p: float) -> float:
        return round(lags[min(len(lags) - 1, int(p * len(lags)))], 3)

    return {
        "occurrences": n,
        "succeeded": len(lags),
        "success_attempt_rows": successes,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        "start_lag_p50_s": pct(0.50),
        "start_lag_p95_s": pct(0.95),
        "start_lag_p99_s": pct(0.99),
        "start_lag_max_s": round(lags[-1], 3),
        "start_lag_mean_s": round(statistics.fmean(lags), 3),
        "all_succeeded_after_s": round(max(float(r["done_after"]) for r in rows), 3),
        "worker_cpu_ms_per_occurrence": round(1000 * worker_cpu / n, 3),
        "postgres_cpu_ms_per_occurrence": round(1000 * pg_cpu / n, 3),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--lead", type=float, default=40.0, help="burst T = now + lead seconds")
    ap.add_argument("--only", default="materialise,burst")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    only = set(args.only.split(","))
    server = EmbeddedPostgres(
        Path(tempfile.mkdtemp(prefix="cronwell-bench-")),
        settings={"max_connections": "300", "shared_buffers": "512MB"},
    )
    url = server.start()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    try:
        async with Database(url, max_size=4) as db:
            await migrate(db)
            if "materialise" in only:
                results["materialise"] = await materialise(db, args.jobs)
                print("materialise:", json.dumps(results["materialise"]), flush=True)
            if "burst" in only:
                results["burst"] = await burst(
                    db, url, args.jobs, args.workers, args.concurrency, args.lead
                )
                print("burst:", json.dumps(results["burst"]), flush=True)
    finally:
        server.stop("fast")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'figure':<40} value")
    for section, figs in results.items():
        for k, v in figs.items():
            print(f"{section + '.' + k:<40} {v}")


if __name__ == "__main__":
    asyncio.run(main())
