"""Helpers shared by the benchmark sections (benchmark-only code): the seeding of due jobs,
the worker environment, process stopping, start-lag figures and the timed claim."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from cronwell import dispatch, jobs
from cronwell.embedded import EmbeddedPostgres
from cronwell.models import ConcurrencyPolicy, ScheduledJobSpec
from cronwell.store import Database, claims, clock, materialise
from cronwell.store.db import Conn

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SETUP_DEADLINE_SECONDS = 3600.0
"""The bench's own connection seeds and inspects millions of rows in one call: a deadline
of its own, not the 10 s a cronwell process gives one call (those it runs keep theirs)."""

NOOP_MODULE = """
import asyncio, atexit, os, time
import cronwell

# With CRONWELL_BENCH_STARTS set, each handler writes its own start (wall clock) and its
# nominal instant: the lag measured where it happens, not by cronwell's columns. Kept in
# memory and written at exit (a write per call would be the bench's own overhead).
_DIR = os.environ.get("CRONWELL_BENCH_STARTS")
_starts = []

@atexit.register
def _write():
    if _DIR and _starts:
        with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "a") as f:
            f.write("".join(_starts))

def _mark(ctx):
    if _DIR:
        _starts.append(f"{time.time()!r} {ctx.scheduled_for.timestamp()!r}\\n")

@cronwell.handler("bench.noop")
async def noop(ctx):
    _mark(ctx)

@cronwell.handler("bench.cpu1ms")
async def cpu1ms(ctx):
    # 1 ms of CPU on the event loop, as a handler doing real work in Python would.
    _mark(ctx)
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass

@cronwell.handler("bench.io50ms")
async def io50ms(ctx):
    # 50 ms of waiting (simulated I/O): holds a slot, costs no CPU.
    _mark(ctx)
    await asyncio.sleep(0.05)
"""

HANDLERS = {"noop": "bench.noop", "cpu1ms": "bench.cpu1ms", "io50ms": "bench.io50ms"}
"""The burst's handler variants (`--handler`): name -> handler of NOOP_MODULE."""


def worker_argv(concurrency: int, module: str | None = None) -> list[str]:
    """`python -m cronwell worker` with `concurrency`, importing handler `module` if given."""
    argv = [sys.executable, "-m", "cronwell", "worker", "--concurrency", str(concurrency)]
    return argv + (["--import", module] if module else [])


def bench_server(statements: bool = False) -> EmbeddedPostgres:
    """The benchmarks' own PostgreSQL (a temporary directory, room for many workers);
    `statements`: with pg_stat_statements loaded (time per statement, for `profile`)."""
    settings = {"max_connections": "300", "shared_buffers": "512MB"}
    if statements:
        settings["shared_preload_libraries"] = "pg_stat_statements"
    return EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="cronwell-bench-")), settings=settings)


def discard(server: EmbeddedPostgres) -> None:
    """Stop a bench's own PostgreSQL and delete its directory: a run's data is up to
    gigabytes (a 1M-job forecast, 50k bursts), and /tmp filled up after a few runs."""
    server.stop("fast")
    shutil.rmtree(server.data_dir, ignore_errors=True)


async def unfinished(db: Database) -> bool:
    """Whether any occurrence is still pending or running: the first row of the claim's and
    the reaper's partial indexes (the ORDER BYs are theirs). The count of succeeded rows
    this replaces read the whole table (26 ms at 50k, four times a second): 7 % of the
    PostgreSQL time the burst measures."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT EXISTS (SELECT FROM cronwell_occurrences WHERE state = 'pending'"
            "               ORDER BY pool, run_at LIMIT 1)"
            " OR EXISTS (SELECT FROM cronwell_occurrences WHERE state = 'running'"
            "            ORDER BY lease_expires_at LIMIT 1) AS busy"
        )
        return bool((await cur.fetchone() or {"busy": False})["busy"])


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
    db: Database,
    n: int,
    due_sql: str,
    target: dict[str, Any],
    schedule: str = "0 0 1 1 *",
    *,
    truncate: bool = True,
    policy: str = ConcurrencyPolicy.SKIP.value,
) -> None:
    """n jobs whose next_run_at is the same instant (bulk SQL: seeding is not measured);
    `truncate`: empty the store first (False: beside its history, `retention`); `policy`:
    their concurrencyPolicy (Skip: cronwell's default)."""
    spec = jobs.spec_document(
        ScheduledJobSpec.model_validate(
            {"schedule": schedule, "target": target, "concurrencyPolicy": policy}
        )
    )
    async with db.connection() as conn:
        if truncate:
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
    # Before the caller's PYTHONPATH, not instead: a worktree's packages stay the ones run.
    path = os.pathsep.join(p for p in (str(mod_dir), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | {
        "PYTHONPATH": path,
        "CRONWELL_DATABASE_URL": url,
        "CRONWELL_LOG_LEVEL": "WARNING",
    }


async def wall_clock_offset(db: Database) -> float:
    """The database clock minus this machine's wall clock, in seconds (read between two
    local readings: error at most half a round trip)."""
    t0 = time.time()
    db_now = await clock.now(db)
    t1 = time.time()
    return db_now.timestamp() - (t0 + t1) / 2


def handler_lags(starts_dir: Path, offset: float) -> list[float]:
    """Start lags the handlers wrote themselves (bench.noop with CRONWELL_BENCH_STARTS):
    their start on the database's clock minus the nominal instant, in seconds. Read once:
    the directory is removed (a full run left a dozen of them in /tmp)."""
    lags: list[float] = []
    for f in starts_dir.glob("*.txt"):
        for line in f.read_text().splitlines():
            started, nominal = line.split()
            lags.append(float(started) + offset - float(nominal))
    shutil.rmtree(starts_dir, ignore_errors=True)
    return lags


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


async def succeeded_lags(conn: Any, where: str = "") -> tuple[list[float], float | None]:
    """Start lags (seconds, database clock) of the succeeded occurrences (`where`: more
    conditions, " AND ..."), and when the last of them finished relative to its instant
    (None: none succeeded)."""
    cur = await conn.execute(
        "SELECT extract(epoch FROM started_at - scheduled_for)::float8 AS lag,"
        " extract(epoch FROM finished_at - scheduled_for)::float8 AS done_after"
        " FROM cronwell_occurrences WHERE state = 'succeeded'" + where
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
    found = await claims.candidates(
        db, pool="default", limit=limit, serial=dispatch.SERIAL_ORDER, conn=conn
    )
    t1 = time.perf_counter()
    ids = list({j for j in found.job_ids if j is not None})
    await claims.lock_jobs(db, ids, conn=conn)
    t2 = time.perf_counter()
    await claims.active(db, ids, pool="default", conn=conn)
    t3 = time.perf_counter()
    started = await claims.start(
        db, found.ids, worker_id="w", lease_seconds=60, row=claims.Started, conn=conn
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


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def postmaster_pid(db: Database) -> int:
    """The bench server's postmaster: the parent of one of its backends."""
    async with db.connection() as conn:
        cur = await conn.execute("SELECT pg_backend_pid() AS pid")
        backend = (await cur.fetchone() or {"pid": 0})["pid"]
    parent = psutil.Process(backend).ppid()
    return int(parent)


def postgres_cpu_seconds(postmaster: int | None = None) -> float:
    """CPU seconds of the server under `postmaster`: its own, its live processes' and those
    of the processes it reaped (backends that exited, autovacuum workers), so that neither
    a server of someone else on the machine nor a backend ending mid-run moves the figure.
    None: every postgres process on the machine (the bench's server)."""
    if postmaster is not None:
        pm = psutil.Process(postmaster)
        t = pm.cpu_times()
        total = float(t.user + t.system + t.children_user + t.children_system)
        for child in pm.children():
            with contextlib.suppress(psutil.Error):
                total += cpu_seconds(child.pid)
        return total
    total = 0.0
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == "postgres":
            with contextlib.suppress(psutil.Error):
                total += cpu_seconds(p.pid)
    return total


SPEED_LOOP = 1_000_000
"""Iterations of the reference loop that `machine_speed` times."""


def machine_speed() -> float:
    """Milliseconds of this process's CPU for a fixed loop of interpreter work, best of three.
    This machine is a VM whose speed moved by a third between two days with an idle load
    average and no steal time reported (anatomy's single backend: 0.092-0.100 ms per
    occurrence one evening, 0.112 the next night): figures taken at different speeds are
    not comparable, and a run near a CPU bound (sustained 10,000/s) passes or collapses with
    it. Recorded with every section, beside the load average."""
    best = float("inf")
    for _ in range(3):
        t, x = time.process_time(), 0
        for i in range(SPEED_LOOP):
            x += i * i
        best = min(best, time.process_time() - t)
    return round(best * 1000, 1)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared: read figures with it)."""
    return [round(x, 2) for x in os.getloadavg()]


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cpu_model() -> str | None:
    import platform

    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


async def machine_facts(db: Database, argv: list[str]) -> dict[str, Any]:
    """What a figure depends on besides the code: the machine, the versions, the commit and
    the exact arguments of the run."""
    import platform

    async with db.connection() as conn:
        cur = await conn.execute("SELECT current_setting('server_version') AS v")
        pg = (await cur.fetchone() or {"v": None})["v"]
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgresql": pg,
        "versions": {
            d: _version(d)
            for d in ("cronwell", "psycopg", "procrastinate", "pgqueuer", "matplotlib", "py-spy")
        },
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "argv": argv,
    }


def merge_latest(latest: Path, results: dict[str, Any]) -> dict[str, Any]:
    """This run's figures over the previous latest.json's: a run of some sections (`--only
    ui`) keeps the others' last figures, each with the run it came from (`merged_from`:
    section -> start and commit of that run)."""
    try:
        before = json.loads(latest.read_text())
    except (OSError, ValueError):
        return results
    origin = {"started_utc": before.get("run", {}).get("started_utc"),
              "git_commit": before.get("machine", {}).get("git_commit")}  # fmt: skip
    kept = {k: v for k, v in before.items() if k not in results and k != "merged_from"}
    merged_from = {k: v for k, v in before.get("merged_from", {}).items() if k in kept}
    merged_from |= {k: origin for k in kept if k not in merged_from}
    return kept | results | ({"merged_from": merged_from} if merged_from else {})


async def statements(db: Database, top: int = 12) -> dict[str, Any]:
    """PostgreSQL's time per statement since the reset, in ms, the `top` by total:
    execution, and planning where pg_stat_statements.track_planning is on (zero
    otherwise). Read it before a section's own queries; `per_occurrence` divides it."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT calls, total_exec_time AS ms, total_plan_time AS plan_ms, rows,"
            " left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query"
            " FROM pg_stat_statements WHERE query NOT ILIKE '%%pg_stat_statements%%'"
            " ORDER BY total_exec_time + total_plan_time DESC LIMIT %s",
            (top,),
        )
        rows = await cur.fetchall()
        cur = await conn.execute(
            "SELECT coalesce(sum(total_exec_time), 0) AS ms,"
            " coalesce(sum(total_plan_time), 0) AS plan_ms FROM pg_stat_statements"
        )
        total = await cur.fetchone() or {"ms": 0, "plan_ms": 0}
    return {"total": dict(total), "top": [dict(r) for r in rows]}


def per_occurrence(st: dict[str, Any], n: int) -> dict[str, Any]:
    """`statements` per occurrence of the n a section handled."""
    total = st["total"]
    return {
        "exec_ms_per_occurrence_all_statements": round(float(total["ms"]) / n, 4),
        "plan_ms_per_occurrence_all_statements": round(float(total["plan_ms"]) / n, 4),
        "top_statements": [
            {
                "exec_ms_per_occurrence": round(float(r["ms"]) / n, 4),
                "plan_ms_per_occurrence": round(float(r["plan_ms"]) / n, 4),
                "calls": r["calls"],
                "rows": r["rows"],
                "ms_per_call": round(float(r["ms"]) / max(r["calls"], 1), 3),
                "query": r["query"],
            }
            for r in st["top"]
        ],
    }


async def enable_statements(
    db: Database, *, track_nested: bool = False, planning: bool = False
) -> None:
    """pg_stat_statements on (the server loads its library when `profile`, `statements`,
    `sustained` or `soak` runs); `track_nested`: the statements triggers and functions run
    counted too; `planning`: planning time counted too (from now on, until called again
    without)."""
    async with db.connection() as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        track = "all" if track_nested else "top"
        await conn.execute(f"ALTER SYSTEM SET pg_stat_statements.track = '{track}'")
        on = "on" if planning else "off"
        await conn.execute(f"ALTER SYSTEM SET pg_stat_statements.track_planning = {on}")
        await conn.execute("SELECT pg_reload_conf()")
