"""Pre-scaling: start lag of one burst with the worker pool at its minimum vs pre-scaled.

    .venv/bin/python -m bench.prescale [--n 50000] [--concurrency 64] [--duration 0.2]
    .venv/bin/python -m bench --only prescale --prescale-n 10000

N jobs whose cron fires at one instant T (seconds field, so T is seconds away) are seeded
in a fresh store. The operator's forecast (`Forecaster.forecast` + `plan_replicas`, the code the
pre-scaler runs) is asked how many replicas the pool needs for it, with
concurrencyPerReplica = the workers' --concurrency and defaultDurationSeconds = the
handler's duration. Then the burst runs twice on fresh data, each time with the worker
processes up before T (worker processes on this machine stand in for replicas):

- at minimum: 1 worker process (minReplicas = 1, nothing scaled ahead);
- pre-scaled: the planned replicas, capped at --max-workers (this machine's cores).

The handler sleeps --duration seconds, so a worker's concurrency is what limits the
start rate, as with real jobs (a no-op handler measures the database instead, which more
worker processes on one machine do not scale). Start lag = started_at - scheduled_for,
database clock. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    SETUP_DEADLINE_SECONDS,
    BenchError,
    bench_server,
    discard,
    lag_stats,
    seed,
    stop_all,
    succeeded_lags,
    unfinished,
    worker_argv,
    worker_env,
)
from cronwell.fleet_forecast import Forecaster
from cronwell.forecast import plan_replicas, upcoming_burst
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store import Database, clock, migrate, partitions
from cronwell.workerpool import WorkerPoolSpec

SLEEP_MODULE = """
import asyncio
import cronwell

@cronwell.handler("bench.sleep")
async def sleep(ctx):
    await asyncio.sleep(float(ctx.payload.get("seconds", 0)))
"""


def _cron_at(t: datetime) -> str:
    """A 6-field cron (seconds first) that fires at `t` (UTC) once a year."""
    return f"{t.second} {t.minute} {t.hour} {t.day} {t.month} *"


async def _seed_burst(db: Database, n: int, lead: float, duration: float) -> datetime:
    """n jobs due at T = now + lead (whole second), materialised; T."""
    at = (await clock.now(db) + timedelta(seconds=lead)).replace(microsecond=0)
    await seed(
        db,
        n,
        f"'{at.isoformat()}'::timestamptz",
        {"handler": {"name": "bench.sleep", "payload": {"seconds": duration}}},
        schedule=_cron_at(at),
    )
    return at


async def _materialise(db: Database, lead: float) -> None:
    # A job is visited when its instant is within half the horizon: T is, by 5 s.
    s = Scheduler(db, SchedulerSettings(partitions=16, horizon_seconds=2 * (lead + 5)))
    await partitions.ensure_leases(db, partitions=16)
    await s.balance()
    await s.materialise_until_idle()
    await s.resign()


def _one_worker(spec: WorkerPoolSpec) -> int:
    """About the most occurrences at one instant one worker starts within the SLO (each
    slot starts one every handler duration)."""
    per_slot = math.floor(spec.start_slo_seconds / spec.default_duration_seconds) + 1
    return spec.concurrency_per_replica * per_slot


def check(max_workers: int) -> None:
    """Settings the section can compare (raises BenchError before anything is seeded)."""
    if max_workers < 2:
        raise BenchError(
            "prescale compares 1 worker with more: the maximum workers (--prescale-max-workers;"
            f" --max-workers alone) must be at least 2, got {max_workers}"
        )


async def plan(db: Database, spec: WorkerPoolSpec, horizon: float) -> dict[str, Any]:
    """What the pre-scaler would do for the seeded burst (pool `default`)."""
    forecasts = await Forecaster().forecast(db, horizon, pools={"default": spec})
    pf = forecasts["default"]
    p = plan_replicas(pf, spec, pf.start)
    burst = upcoming_burst(pf, p, spec)
    conc = max(pf.concurrency)
    if burst is None:  # the plan never rises above minReplicas: nothing to pre-scale
        raise BenchError(
            f"prescale: the forecast plans 1 worker for this burst (needs concurrency {conc},"
            f" {spec.concurrency_per_replica} per worker), so there is nothing to pre-scale:"
            f" make the burst (--prescale-n; --n alone) larger than about {_one_worker(spec)}"
        )
    return {
        "forecast_burst_size": burst.size,
        "forecast_concurrency": conc,
        "replicas_for_slo": math.ceil(conc / spec.concurrency_per_replica),
        "planned_replicas": burst.replicas,  # capped at maxReplicas (--max-workers)
    }


async def run_burst(
    db: Database,
    url: str,
    n: int,
    workers: int,
    concurrency: int,
    duration: float,
    lead: float,
) -> dict[str, Any]:
    """Seed + materialise a burst at T, start `workers` worker processes before T, wait for
    every occurrence to succeed; start-lag figures."""
    at = await _seed_burst(db, n, lead, duration)
    await _materialise(db, lead)
    env = worker_env(url, "cronwell_bench_sleep", SLEEP_MODULE)
    argv = worker_argv(concurrency, "cronwell_bench_sleep")
    procs = [
        subprocess.Popen(argv, env=env, start_new_session=True)  # noqa: ASYNC220
        for _ in range(workers)
    ]
    try:
        if (at - await clock.now(db)).total_seconds() < 1:
            print("warning: materialisation left under 1 s before T", file=sys.stderr)
        # Bounded: the slowest case drains n * duration / concurrency seconds after T.
        deadline = time.monotonic() + lead + 60 + n * duration / concurrency * 1.5
        while time.monotonic() < deadline:
            if not await unfinished(db):
                break
            await asyncio.sleep(0.5)
    finally:
        stop_all(procs, timeout=60)
    async with db.connection() as conn:
        lags, done_after = await succeeded_lags(conn)
        cur = await conn.execute(
            "SELECT state, count(*) AS n FROM cronwell_occurrences GROUP BY state"
        )
        states = {r["state"]: int(r["n"]) for r in await cur.fetchall()}
    out: dict[str, Any] = {"workers": workers, "succeeded": len(lags)}
    if len(lags) < n:  # lag figures of a partial run understate it: say so
        print(f"warning: only {len(lags)} of {n} succeeded: {states}", file=sys.stderr)
        out["states_at_deadline"] = states
    out |= lag_stats(lags)
    if done_after is not None:
        out["all_succeeded_after_s"] = round(done_after, 3)
    return out


async def prescale(
    db: Database,
    url: str,
    n: int,
    concurrency: int,
    duration: float,
    max_workers: int,
    lead: float,
    slo: float = 5.0,
) -> dict[str, Any]:
    spec = WorkerPoolSpec.model_validate(
        {
            "scaleTargetRef": {"name": "bench"},
            "minReplicas": 1,
            "maxReplicas": max_workers,
            "concurrencyPerReplica": concurrency,
            "startSLOSeconds": slo,
            "defaultDurationSeconds": duration,
            "leadTimeSeconds": int(lead),
        }
    )
    await _seed_burst(db, n, lead, duration)
    figs: dict[str, Any] = {"occurrences": n, "concurrency_per_worker": concurrency}
    figs["handler_seconds"] = duration
    figs |= await plan(db, spec, lead + 60)
    workers = max(1, min(max_workers, int(figs["planned_replicas"])))
    figs["at_minimum"] = await run_burst(db, url, n, 1, concurrency, duration, lead)
    figs["prescaled"] = await run_burst(db, url, n, workers, concurrency, duration, lead)
    return figs


def report(figs: dict[str, Any]) -> None:
    lo, hi = figs["at_minimum"], figs["prescaled"]
    print(
        f"\nburst of {figs['occurrences']} at one instant, handler {figs['handler_seconds']} s,"
        f" --concurrency {figs['concurrency_per_worker']}; forecast: "
        f"{figs['forecast_burst_size']} due, concurrency {figs['forecast_concurrency']},"
        f" {figs['replicas_for_slo']} replicas for the SLO, {figs['planned_replicas']} planned"
        " (maxReplicas)"
    )
    print(f"{'start lag':<26}{'at minimum':>12}{'pre-scaled':>12}{'min/pre':>10}")
    print(f"{'worker processes':<26}{lo['workers']:>12}{hi['workers']:>12}")
    print(f"{'succeeded':<26}{lo['succeeded']:>12}{hi['succeeded']:>12}")
    for k in ("start_lag_p50_s", "start_lag_p95_s", "start_lag_p99_s", "start_lag_max_s",
              "all_succeeded_after_s"):  # fmt: skip
        a, b = lo.get(k, "-"), hi.get(k, "-")
        ratio = f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "-"
        print(f"{k:<26}{a!s:>12}{b!s:>12}{ratio:>10}")
    print("(one shared machine: figures are noisy; the worker processes share its cores)")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000, help="occurrences in the burst")
    ap.add_argument("--concurrency", type=int, default=64, help="worker --concurrency")
    ap.add_argument("--duration", type=float, default=0.2, help="handler seconds")
    ap.add_argument("--max-workers", type=int, default=4, help="cap on pre-scaled workers")
    ap.add_argument("--lead", type=float, default=40.0, help="burst T = now + lead seconds")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    try:
        check(args.max_workers)
    except BenchError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")  # one line, no usage block
    server = bench_server()
    url = server.start()
    try:
        async with Database(url, max_size=4, deadline_seconds=SETUP_DEADLINE_SECONDS) as db:
            await migrate(db)
            figs = await prescale(
                db, url, args.n, args.concurrency, args.duration,
                args.max_workers, args.lead,
            )  # fmt: skip
    finally:
        discard(server)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prescale.json").write_text(json.dumps(figs, indent=2))
    print(json.dumps(figs))
    report(figs)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BenchError as e:
        sys.exit(f"error: {e}")
