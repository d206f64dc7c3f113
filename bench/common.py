"""Helpers shared by the benchmark sections (benchmark-only code): the seeding of due jobs,
the worker environment, process stopping, start-lag figures and the timed claim."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cronwell import jobs
from cronwell.embedded import EmbeddedPostgres
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, claims, materialise
from cronwell.store.db import Conn

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

NOOP_MODULE = """
import cronwell

@cronwell.handler("bench.noop")
async def noop(ctx):
    return None
"""


def worker_argv(concurrency: int, module: str | None = None) -> list[str]:
    """`python -m cronwell worker` with `concurrency`, importing handler `module` if given."""
    argv = [sys.executable, "-m", "cronwell", "worker", "--concurrency", str(concurrency)]
    return argv + (["--import", module] if module else [])


def bench_server() -> EmbeddedPostgres:
    """The benchmarks' own PostgreSQL (a temporary directory, room for many workers)."""
    return EmbeddedPostgres(
        Path(tempfile.mkdtemp(prefix="cronwell-bench-")),
        settings={"max_connections": "300", "shared_buffers": "512MB"},
    )


async def timed_due_scan(db: Database, conn: Conn, holder: str) -> tuple[float, list[Any]]:
    """The scheduler's due scan of partition 0 (up to 500 jobs, 30 s ahead), in ms."""
    return await timed(
        materialise.claim_due(
            db, holder=holder, partition=0, epoch=1, horizon_seconds=30, limit=500, conn=conn
        )
    )


class BenchError(Exception):
    """A size or setting the section cannot measure: one line for the user, no traceback."""


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


def worker_env(
    url: str, module: str = "cronwell_bench_noop", source: str = NOOP_MODULE
) -> dict[str, str]:
    """The environment of `cronwell worker` processes: `source` importable as `module`."""
    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / f"{module}.py").write_text(source)
    return os.environ | {
        "PYTHONPATH": str(mod_dir),
        "CRONWELL_DATABASE_URL": url,
        "CRONWELL_LOG_LEVEL": "WARNING",
        "CRONWELL_CLAIM_BATCH_SIZE": "500",
    }


def lag_stats(lags: list[float], prefix: str = "start_lag") -> dict[str, Any]:
    """p50/p95/p99/max/mean of a list of seconds (sorted in place)."""
    lags.sort()
    if not lags:
        return {}

    def pct(p: float) -> float:
        return round(lags[min(len(lags) - 1, int(p * len(lags)))], 3)

    return {
        f"{prefix}_p50_s": pct(0.50),
        f"{prefix}_p95_s": pct(0.95),
        f"{prefix}_p99_s": pct(0.99),
        f"{prefix}_max_s": round(lags[-1], 3),
        f"{prefix}_mean_s": round(statistics.fmean(lags), 3),
    }


def db_url(server_url: str, dbname: str) -> str:
    """The same server's URL pointed at another database."""
    return server_url.rsplit("/", 1)[0] + "/" + dbname


def stop_all(procs: Sequence[subprocess.Popen[Any]], timeout: float = 30) -> None:
    """SIGTERM every process at once, then wait for each (SIGKILL after `timeout`)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


async def succeeded_lags(conn: Any) -> tuple[list[float], float | None]:
    """Start lags (seconds, database clock) of the succeeded occurrences, and when the
    last of them finished relative to its instant (None: none succeeded)."""
    cur = await conn.execute(
        "SELECT extract(epoch FROM started_at - scheduled_for)::float8 AS lag,"
        " extract(epoch FROM finished_at - scheduled_for)::float8 AS done_after"
        " FROM cronwell_occurrences WHERE state = 'succeeded'"
    )
    rows = await cur.fetchall()
    done = max((float(r["done_after"]) for r in rows), default=None)
    return [float(r["lag"]) for r in rows], done


async def timed(aw: Awaitable[T]) -> tuple[float, T]:
    """Milliseconds `aw` took, and its result."""
    t0 = time.perf_counter()
    out = await aw
    return 1000 * (time.perf_counter() - t0), out


async def timed_claim(
    db: Database, conn: Conn, limit: int = 500
) -> tuple[dict[str, float], list[claims.Started]]:
    """What dispatch.claim sends for Skip jobs, through the store's functions, on `conn`:
    candidates, job row locks, active occurrences, the claim. Milliseconds of each step
    (`claim.<step>`) and of all four (`claim`), and the started occurrences."""
    t0 = time.perf_counter()
    cands = await claims.candidates(db, pool="default", limit=limit, conn=conn)
    t1 = time.perf_counter()
    ids = sorted({c.job_id for c in cands})
    await claims.lock_jobs(db, ids, conn=conn)
    t2 = time.perf_counter()
    await claims.active(db, ids, conn=conn)
    t3 = time.perf_counter()
    started = await claims.start(
        db, [c.id for c in cands], worker_id="w", lease_seconds=60, conn=conn
    )
    t4 = time.perf_counter()
    steps = {
        "claim": t4 - t0,
        "claim.candidates": t1 - t0,
        "claim.job_lock": t2 - t1,
        "claim.active": t3 - t2,
        "claim.claim_batch": t4 - t3,
    }
    return {k: 1000 * v for k, v in steps.items()}, started
