"""materialise and burst: cronwell's own figures for N jobs due at one instant.

- materialise: N jobs due in the same second; one scheduler owning all partitions turns
  them into occurrences. Time, occurrences/s, database round trips and CPU per occurrence.
- burst: the same N occurrences due at one instant T, executed by worker *processes*
  with a no-op handler. Start lag (actual start - nominal T) p50/p95/p99/max twice: from
  cronwell's own columns (started_at, the database's clock) and from the start each
  handler wrote itself (`handler_start_lag_*`, aligned to the database clock), and the
  time until all succeeded.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    HANDLERS,
    cpu_seconds,
    handler_lags,
    lag_stats,
    postgres_cpu_seconds,
    postmaster_pid,
    seed,
    succeeded_lags,
    unfinished,
    wall_clock_offset,
    worker_argv,
    worker_env,
)
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings
from cronwell.store import Database, claims, partitions

PY_SPY = Path(sys.executable).parent / "py-spy"
"""The sampler of the `profile` section (the `bench` extra installs it)."""


async def _keep_leases(s: Scheduler) -> None:
    while True:
        await asyncio.sleep(s.settings.partition_lease_seconds / 3)
        await s.balance()


async def materialise(db: Database, n: int) -> dict[str, Any]:
    await seed(
        db, n, "date_trunc('second', now()) + interval '10 seconds'", {"log": {"message": "x"}}
    )
    s = Scheduler(db, SchedulerSettings(partitions=16, horizon_seconds=30))
    await partitions.ensure_leases(db, partitions=16)
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


async def prepare_burst(
    db: Database, n: int, lead: float, handler: str = "noop", *, truncate: bool = True
) -> None:
    """n occurrences due at T = now + lead, materialised by one scheduler (not measured);
    `handler`: a key of HANDLERS; `truncate`: False keeps the store's history."""
    await seed(
        db,
        n,
        f"date_trunc('second', now()) + interval '{int(lead)} seconds'",
        {"handler": {"name": HANDLERS[handler]}},
        truncate=truncate,
    )
    # A job is visited when its instant is within half the horizon: T is, by 5 s.
    s = Scheduler(db, SchedulerSettings(partitions=16, horizon_seconds=2 * (lead + 5)))
    await partitions.ensure_leases(db, partitions=16)
    await s.balance()
    keep = asyncio.create_task(_keep_leases(s))
    await s.materialise_until_idle()
    keep.cancel()
    await s.resign()


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB (0 once it is gone): the claimed-ahead burst's
    memory shows here."""
    try:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    except psutil.Error:
        return 0.0


async def _at(t_mono: float, run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """`run` started at the monotonic instant `t_mono` (the burst's T)."""
    await asyncio.sleep(max(0.0, t_mono - time.monotonic()))
    return await run()


async def registered(db: Database, pids: list[int], deadline: float) -> None:
    """Wait until every worker process in `pids` is in the registry (or the deadline)."""
    while time.monotonic() < deadline:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM cronwell_processes WHERE pid = ANY(%s)", (pids,)
            )
            if (await cur.fetchone() or {"n": 0})["n"] >= len(pids):
                return
        await asyncio.sleep(0.05)


async def burst(
    db: Database,
    url: str,
    n: int,
    workers: int,
    concurrency: int,
    lead: float,
    profile: Path | None = None,
    *,
    handler: str = "noop",
    claim_ahead: float | None = None,
    statements: bool = False,
    history: bool = False,
    at_t: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    join_after: float = 0.0,
) -> dict[str, Any]:
    """Materialise n occurrences due at T = now + lead, then let worker processes run them
    with `handler` (a key of HANDLERS) and `claim_ahead` seconds of least claim-ahead window
    (None: the worker's default settings, a window that follows the burst; 0: claimed only
    once due, the behaviour before claim ahead).
    With `profile`, py-spy samples every worker process (raw collapsed stacks there);
    with `profile` or `statements`, pg_stat_statements counts from the same instant.
    `history`: the store keeps its (finished, never claimed) history; the figures read only
    the occurrences claimed by a worker. `at_t`: started at T beside the burst (a retention
    pass), its result under `at_t` (awaited after the burst if it lasts longer).
    `join_after`: the other workers start this many seconds after the first registered
    (workers joining a pool while one claims the burst ahead: the shares; CPU is counted
    from when all registered, so the first one's claims before that are not)."""
    await prepare_burst(db, n, lead, handler, truncate=not history)
    starts_dir = Path(tempfile.mkdtemp(prefix="cronwell-bench-starts-"))
    env = worker_env(url) | {"CRONWELL_BENCH_STARTS": str(starts_dir)}
    if claim_ahead is not None:
        env["CRONWELL_CLAIM_AHEAD_SECONDS"] = f"{claim_ahead:g}"
    if claim_ahead == 0:
        env["CRONWELL_CLAIM_AHEAD_MAX_SECONDS"] = "0"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            worker_argv(concurrency, "cronwell_bench_noop"), env=env, start_new_session=True
        )

    procs = [start() for _ in range(1 if join_after > 0 else workers)]
    spies: list[subprocess.Popen[bytes]] = []
    beside: asyncio.Task[dict[str, Any]] | None = None
    try:
        (nd, *_) = await claims.coming(db, pool="default", horizon_seconds=lead + 60, rows=1)
        assert nd.run_at is not None, "the burst's occurrences are not pending"
        due_in = (nd.run_at - nd.db_now).total_seconds()
        t_mono = time.monotonic() + due_in
        if due_in < 1:
            print(f"warning: materialisation left only {due_in:.2f}s before T", file=sys.stderr)
        if join_after > 0:
            await registered(db, [procs[0].pid], time.monotonic() + due_in)
            await asyncio.sleep(join_after)
            procs += [start() for _ in range(workers - 1)]
        # CPU is counted (and py-spy samples, and pg_stat_statements counts) from when every
        # worker registered, before its first claim: start-up (imports) is not the burst's
        # cost, the claims ahead of T (up to claim_ahead_max_seconds early) are.
        await registered(db, [p.pid for p in procs], time.monotonic() + due_in)
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)
        postmaster = await postmaster_pid(db)
        pg_cpu0 = postgres_cpu_seconds(postmaster)
        if profile is not None or statements:
            async with db.connection() as conn:
                await conn.execute("SELECT pg_stat_statements_reset()")
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
            spies = [
                subprocess.Popen(  # noqa: ASYNC220
                    [
                        str(PY_SPY),
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
        if at_t is not None:
            beside = asyncio.create_task(_at(t_mono, at_t))
        deadline = time.monotonic() + due_in + 300
        rss = 0.0
        while time.monotonic() < deadline:
            rss = max([rss] + [rss_mb(p.pid) for p in procs])
            if not await unfinished(db):
                break
            await asyncio.sleep(0.25)
        worker_cpu_all = sum(cpu_seconds(p.pid) for p in procs)
        worker_cpu = worker_cpu_all - cpu0
        pg_cpu = postgres_cpu_seconds(postmaster) - pg_cpu0
        async with db.connection() as conn:
            # When the last worker registered (start-up done), against T: a worker still
            # importing at T adds its start-up to every lag (seen at load 13: 6 s).
            cur = await conn.execute(
                "SELECT extract(epoch FROM %s - max(started_at))::float8 AS s"
                " FROM cronwell_processes WHERE role = 'worker' AND pid = ANY(%s)",
                (nd.run_at, [p.pid for p in procs]),
            )
            ready = (await cur.fetchone() or {"s": None})["s"]
        concurrent = await beside if beside is not None else None
    finally:
        if beside is not None and not beside.done():
            beside.cancel()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.terminate()
    # Seeded history is never claimed (claimed_at NULL) and has worker 'w'.
    mine = " AND claimed_at IS NOT NULL" if history else ""
    async with db.connection() as conn:
        lags, done_after = await succeeded_lags(conn, mine)
        # Success rows, and the most one worker ran of them (1 / workers when they shared
        # the burst evenly).
        cur = await conn.execute(
            "SELECT coalesce(sum(n), 0) AS n, coalesce(max(n), 0) AS largest"
            " FROM (SELECT count(*) AS n FROM cronwell_attempts WHERE outcome = 'succeeded'"
            + (" AND worker_id <> 'w'" if history else "")
            + " GROUP BY worker_id) w"
        )
        found = await cur.fetchone() or {"n": 0, "largest": 0}
        successes, largest = int(found["n"]), int(found["largest"])
        # Claimed before its instant (its last claim): how much of the burst the claim
        # ahead moved before T.
        cur = await conn.execute(
            "SELECT coalesce(avg((claimed_at < run_at)::int), 0)::float8 AS share"
            " FROM cronwell_occurrences WHERE true" + mine
        )
        ahead_share = (await cur.fetchone() or {"share": 0.0})["share"]
    if done_after is None:
        return {"occurrences": n, "handler": handler, "claim_ahead_s": claim_ahead, "succeeded": 0}
    offset = await wall_clock_offset(db)
    at_handler = handler_lags(starts_dir, offset)
    cpu_ms = 1000 * (worker_cpu + pg_cpu) / n
    cores = os.cpu_count() or 1
    return {
        "occurrences": n,
        "handler": handler,
        "claim_ahead_s": claim_ahead,
        "succeeded": len(lags),
        "success_attempt_rows": successes,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        **lag_stats(lags),  # sorts `lags` in place (the CDF below reads them sorted)
        "handler_starts": len(at_handler),
        **lag_stats(at_handler, "handler_start_lag"),
        "db_minus_wall_clock_s": round(offset, 4),
        "workers_ready_before_t_s": None if ready is None else round(ready, 2),
        "claimed_before_t_share": round(ahead_share, 4),
        "largest_worker_share": round(largest / max(successes, 1), 4),
        "all_succeeded_after_s": round(done_after, 3),
        "worker_cpu_ms_per_occurrence": round(1000 * worker_cpu / n, 3),
        "worker_rss_mb_max": round(rss, 1),
        "worker_cpu_ms_per_occurrence_with_startup": round(1000 * worker_cpu_all / n, 3),
        "postgres_cpu_ms_per_occurrence": round(1000 * pg_cpu / n, 3),
        # The physical floor of this run: its CPU (workers + PostgreSQL) spread over every
        # core with nothing else running; no start order beats it for the last occurrence.
        "cpu_floor_s": round(cpu_ms * n / 1000 / cores, 3),
        "per_second": round(len(lags) / max(done_after, 1e-3)),
        "_lags": lags,
        "_handler_lags": at_handler,
    } | ({"at_t": concurrent} if at_t is not None else {})
