"""Second peer: pgqueuer given the same burst as cronwell's `burst` section (section
`pgqueuer`).

N no-op jobs enqueued through pgqueuer's own API with execute_after = the same second T,
in a separate database on the same PostgreSQL server, run by worker *processes* doing what
`pgq run` does (`PgQueuer.run`, max_concurrent_tasks = the burst's concurrency,
batch_size = `--pgqueuer-batch`; the `pgq run` command itself fails in 1.6.0).
Start lag is measured where it happens, as for cronwell: each handler writes its start
(wall clock, aligned to the database clock) against T; total = the last `successful` row
of pgqueuer's log - T (its log writes are buffered: an upper bound, like the peer's).

pgqueuer is a benchmark-only dependency (the `bench` extra); without it this section
reports {"skipped": ...}.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.common import BenchError, db_url, handler_lags, lag_stats, stop_all

PEER_DB = "pgqueuer_bench"
APP_MODULE = """
import asyncio, atexit, os, signal, sys, time
import psycopg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

# Each handler's start (wall clock) and T, written at exit (pgq stops on SIGTERM).
_DIR, _T = os.environ["CRONWELL_BENCH_STARTS"], os.environ["PGQ_BENCH_T"]
_starts = []

@atexit.register
def _write():
    if _starts:
        with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "a") as f:
            f.write("".join(_starts))

async def main(concurrency: int, batch: int) -> None:
    conn = await psycopg.AsyncConnection.connect(
        os.environ["PEER_DATABASE_URL"], autocommit=True
    )
    pgq = PgQueuer.from_psycopg_connection(conn)

    @pgq.entrypoint("bench.noop")
    async def noop(job: Job) -> None:
        _starts.append(f"{time.time()!r} {_T}\\n")

    # What `pgq run` does (its CLI fails in 1.6.0: --log-level is parsed to a str where
    # an enum is expected, even by default): SIGTERM/SIGINT shut the manager down.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pgq.shutdown.set)
    await pgq.run(batch_size=batch, max_concurrent_tasks=concurrency)

if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


async def _psql(url: str, *stmts: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for s in stmts:
            await conn.execute(s)


async def pgqueuer_burst(
    server_url: str, n: int, workers: int, concurrency: int, lead: float, batch: int
) -> dict[str, Any]:
    try:
        from pgqueuer.queries import Queries
    except ImportError:
        return {"skipped": "pgqueuer not installed (pip install '.[bench]')"}
    from importlib.metadata import version

    await _psql(server_url, f"DROP DATABASE IF EXISTS {PEER_DB}", f"CREATE DATABASE {PEER_DB}")
    url = db_url(server_url, PEER_DB)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        q = Queries.from_psycopg_connection(conn)
        await q.install()
        # Seeding is not measured: one enqueue call (one statement), then every job's
        # execute_after set to the same T.
        cur = await conn.execute(
            "SELECT date_trunc('second', now()) + make_interval(secs => %s)", (int(lead),)
        )
        t = (await cur.fetchone())[0]  # type: ignore[index]
        await q.enqueue(
            ["bench.noop"] * n, [None] * n, [0] * n, execute_after=[timedelta(seconds=lead)] * n
        )
        await conn.execute("UPDATE pgqueuer SET execute_after = %s", (t,))
        await conn.execute("ANALYZE")
        cur = await conn.execute("SELECT extract(epoch FROM %s - now())::float8", (t,))
        due_in = float((await cur.fetchone())[0])  # type: ignore[index]
        t0 = time.time()
        cur = await conn.execute("SELECT now()")
        db_now = (await cur.fetchone())[0]  # type: ignore[index]
        offset = db_now.timestamp() - (t0 + time.time()) / 2
    if due_in < 1:
        print(f"warning: pgqueuer seeding left only {due_in:.2f}s before T", file=sys.stderr)
    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / "cronwell_bench_pgq.py").write_text(APP_MODULE)
    starts_dir = Path(tempfile.mkdtemp(prefix="cronwell-bench-pgq-"))
    env = os.environ | {
        "PYTHONPATH": str(mod_dir),
        "PEER_DATABASE_URL": url,
        "CRONWELL_BENCH_STARTS": str(starts_dir),
        "PGQ_BENCH_T": repr(t.timestamp()),
    }
    # pgqueuer logs at WARNING by default, no line per job: its log is kept aside.
    log = (starts_dir / "pgq.log").open("w")
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before T
            [sys.executable, str(mod_dir / "cronwell_bench_pgq.py"), str(concurrency), str(batch)],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        for _ in range(workers)
    ]
    try:
        deadline = time.monotonic() + due_in + 600
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                cur = await conn.execute("SELECT count(*) FROM pgqueuer")
                if (await cur.fetchone())[0] == 0:  # type: ignore[index]
                    break
                if all(p.poll() is not None for p in procs):
                    tail = (starts_dir / "pgq.log").read_text()[-300:]
                    raise BenchError(f"every pgq worker exited: {tail!r}")
                await asyncio.sleep(0.25)
    finally:
        stop_all(procs)
        log.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*), extract(epoch FROM max(created) - %s)::float8 FROM pgqueuer_log"
            " WHERE status = 'successful'",
            (t,),
        )
        succeeded, done_after = await cur.fetchone()  # type: ignore[misc]
    lags = handler_lags(starts_dir, offset)
    out: dict[str, Any] = {
        "system": f"pgqueuer {version('pgqueuer')}",
        "occurrences": n,
        "succeeded": succeeded,
        "workers": workers,
        "max_concurrent_tasks_per_worker": concurrency,
        "batch_size": batch,
        "handler_starts": len(lags),
        **lag_stats(lags, "handler_start_lag"),
    }
    if done_after is not None:
        out["all_succeeded_after_s"] = round(float(done_after), 3)
        out["per_second"] = round(succeeded / max(float(done_after), 1e-3))
    out["_handler_lags"] = lags
    await _psql(server_url, f"DROP DATABASE IF EXISTS {PEER_DB}")
    return out
