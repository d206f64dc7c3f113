"""Peer: Procrastinate given the same burst as cronwell's `burst` section.

N no-op tasks deferred with scheduled_at = the same second T, executed by `procrastinate
worker` *processes* against a separate database on the same PostgreSQL server. Start lag =
procrastinate_events 'started'.at - procrastinate_jobs.scheduled_at (both the database's
clock); total = last 'succeeded'.at - T.

Procrastinate is a benchmark-only dependency (the `bench` extra); without it this section
reports {"skipped": ...}.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import db_url, lag_stats, stop_all

PEER_DB = "procrastinate_bench"
APP_MODULE = """
import os
import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ["PEER_DATABASE_URL"],
        min_size=1,
        max_size=int(os.environ.get("PEER_POOL_SIZE", "10")),
    )
)

@app.task(name="bench.noop", queue="default")
async def noop():
    return None
"""


async def _psql(url: str, *stmts: str, autocommit: bool = True) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=autocommit) as conn:
        for s in stmts:
            await conn.execute(s)


async def peer_burst(
    server_url: str, n: int, workers: int, concurrency: int, lead: float, poll: float
) -> dict[str, Any]:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return {"skipped": "procrastinate not installed (pip install '.[bench]')"}
    from importlib.metadata import version

    await _psql(server_url, f"DROP DATABASE IF EXISTS {PEER_DB}", f"CREATE DATABASE {PEER_DB}")
    url = db_url(server_url, PEER_DB)
    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / "cronwell_bench_peer.py").write_text(APP_MODULE)
    env = os.environ | {
        "PYTHONPATH": str(mod_dir),
        "PEER_DATABASE_URL": url,
        "PEER_POOL_SIZE": os.environ.get("PEER_POOL_SIZE", "50"),
    }
    subprocess.run(  # noqa: ASYNC221 - schema set-up, before timing
        [
            sys.executable,
            "-m",
            "procrastinate",
            "--app",
            "cronwell_bench_peer.app",
            "schema",
            "--apply",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # Seeding is not measured: one bulk INSERT (the deferral triggers still record the
        # 'deferred' and 'scheduled' events of every job, as defer() would).
        cur = await conn.execute(
            "SELECT date_trunc('second', now()) + make_interval(secs => %s) AS t", (int(lead),)
        )
        t = (await cur.fetchone())[0]  # type: ignore[index]
        await conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, scheduled_at)"
            " SELECT 'default', 'bench.noop', '{}'::jsonb, %s FROM generate_series(1, %s)",
            (t, n),
        )
        await conn.execute("ANALYZE")
        cur = await conn.execute("SELECT extract(epoch FROM %s - now())", (t,))
        due_in = float((await cur.fetchone())[0])  # type: ignore[index]
    if due_in < 1:
        print(f"warning: peer seeding left only {due_in:.2f}s before T", file=sys.stderr)
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before T
            [
                sys.executable,
                "-m",
                "procrastinate",
                "--app",
                "cronwell_bench_peer.app",
                "--log-level",
                "warning",
                "worker",
                "--concurrency",
                str(concurrency),
                "--fetch-job-polling-interval",
                str(poll),
                "--name",
                f"peer-{i}",
            ],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        for i in range(workers)
    ]
    try:
        deadline = time.monotonic() + due_in + 600
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                cur = await conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                )
                if (await cur.fetchone())[0] >= n:  # type: ignore[index]
                    break
                await asyncio.sleep(0.25)
    finally:
        stop_all(procs)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM e.at - j.scheduled_at) FROM procrastinate_jobs j"
            " JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'started'"
            " WHERE j.status = 'succeeded'"
        )
        lags = [float(r[0]) for r in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT extract(epoch FROM max(e.at) - %s) FROM procrastinate_events e"
            " WHERE e.type = 'succeeded'",
            (t,),
        )
        done_after = (await cur.fetchone())[0]  # type: ignore[index]
    out: dict[str, Any] = {
        "system": f"procrastinate {version('procrastinate')}",
        "occurrences": n,
        "succeeded": len(lags),
        "workers": workers,
        "concurrency_per_worker": concurrency,
        "fetch_job_polling_interval_s": poll,
        "pool_max_size_per_worker": int(env["PEER_POOL_SIZE"]),
    }
    out |= lag_stats(lags)
    if done_after is not None:
        out["all_succeeded_after_s"] = round(float(done_after), 3)
        out["per_second"] = round(len(lags) / max(float(done_after), 1e-3))
    out["_lags"] = lags
    await _psql(server_url, f"DROP DATABASE IF EXISTS {PEER_DB}")
    return out
