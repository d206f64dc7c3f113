"""Ceiling: cronwell's claim/complete SQL pattern driven with no cronwell code.

The same N pending occurrences as the `burst` section (materialised by the scheduler), then
W plain processes, each a minimal synchronous psycopg loop:

    UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT B) RETURNING ...
    + one fenced batch completion (UPDATE ... FROM unnest + INSERT attempts, as
      OccurrenceSucceedBatch does)

starting at T. What cronwell itself adds on top (overlap locking, asyncio tasks per attempt,
spec validation, heartbeats, metrics) is the difference to the `burst` figure.

Floor: PostgreSQL's own cost of an occurrence's three writes on this machine. The same N
rows inserted into a bare table (`bench_floor`: a primary key and the claim's partial
index, no attempt rows, no idempotency key, no triggers, no other index), then claimed and
completed from T by the same loop with the same SQL shapes. Its PostgreSQL CPU per
occurrence, beside the ceiling's (cronwell's schema, minimal SQL) and the burst's
(cronwell), splits PostgreSQL's cost into the writes themselves, what the schema adds
(indexes, the attempt row that arbitrates a success, counters) and what cronwell's
statements add (overlap locks, fences, claim ahead).

Tasks: the worker's floor in Python. The ceiling's SQL from the smallest asyncio worker of
cronwell's design, on uvloop as cronwell's: rows claimed ahead of T (`TASKS_AHEAD_S`), one
task per row created at its claim that waits for its instant (one timer per instant), runs
a no-op handler (which notes its start as the bench's no-op handler does) and queues its
completion; a second task writes the queued completions in batches, start instants with
them. No leases renewed, no fences checked by the worker, no policies, deadlines, metrics
or logs. Its drivers' CPU per occurrence, beside the ceiling's synchronous loop (no task
per row) and the burst's workers, splits a worker's CPU into what any asyncio worker that
runs handlers concurrently pays and what cronwell adds.

    python -m bench.ceiling --loop URL BATCH [floor|tasks]    # one driver process (internal)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import postgres_cpu_seconds, postmaster_pid

CLAIM = """
UPDATE cronwell_occurrences o
SET state = 'running', attempt = o.attempt + 1, fence = nextval('cronwell_fence'),
    worker_id = %(w)s, started_at = now(), lease_expires_at = now() + interval '60 seconds'
WHERE o.id IN (SELECT id FROM cronwell_occurrences
               WHERE pool = 'default' AND state = 'pending' AND run_at <= now()
               ORDER BY run_at LIMIT %(b)s FOR UPDATE SKIP LOCKED)
RETURNING o.idempotency_key, o.fence
"""

COMPLETE = """
WITH done AS (
    UPDATE cronwell_occurrences o
    SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
    FROM unnest(%(k)s::text[], %(f)s::bigint[]) AS t(k, f)
    WHERE o.idempotency_key = t.k AND o.fence = t.f AND o.state = 'running'
    RETURNING o.id, o.idempotency_key, o.scheduled_for, o.attempt, o.fence, o.worker_id,
              o.started_at, o.finished_at)
INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                               worker_id, outcome, started_at, finished_at)
SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'succeeded', started_at,
       finished_at
FROM done
"""


FLOOR_TABLE = """
DROP TABLE IF EXISTS bench_floor;
DROP SEQUENCE IF EXISTS bench_floor_fence;
CREATE SEQUENCE bench_floor_fence AS bigint;
CREATE TABLE bench_floor (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_at           timestamptz NOT NULL,
    state            text        NOT NULL,
    fence            bigint,
    worker_id        text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz
);
CREATE INDEX bench_floor_claim ON bench_floor (run_at) WHERE state = 'pending';
"""

FLOOR_INSERT = """
INSERT INTO bench_floor (run_at, state)
SELECT t, 'pending' FROM unnest(%(at)s::timestamptz[]) AS t
"""

FLOOR_CLAIM = """
UPDATE bench_floor o
SET state = 'running', fence = nextval('bench_floor_fence'), worker_id = %(w)s,
    started_at = now(), lease_expires_at = now() + interval '60 seconds'
WHERE o.id IN (SELECT id FROM bench_floor WHERE state = 'pending' AND run_at <= now()
               ORDER BY run_at LIMIT %(b)s FOR UPDATE SKIP LOCKED)
RETURNING o.id, o.fence
"""

FLOOR_COMPLETE = """
UPDATE bench_floor o
SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
FROM unnest(%(k)s::bigint[], %(f)s::bigint[]) AS t(k, f)
WHERE o.id = t.k AND o.fence = t.f AND o.state = 'running'
"""

FLOOR_LEAD_S = 3.0
"""The floor's T after its insert (50,000 rows take well under a second here)."""

TASKS_CLAIM = """
UPDATE cronwell_occurrences o
SET state = 'running', attempt = o.attempt + 1, fence = nextval('cronwell_fence'),
    worker_id = %(w)s, lease_expires_at = now() + interval '60 seconds'
WHERE o.id IN (SELECT id FROM cronwell_occurrences
               WHERE pool = 'default' AND state = 'pending'
                 AND run_at <= now() + make_interval(secs => %(ahead)s)
               ORDER BY run_at LIMIT %(b)s FOR UPDATE SKIP LOCKED)
RETURNING o.idempotency_key, o.fence, extract(epoch FROM o.run_at - now())::float8
"""

TASKS_COMPLETE = COMPLETE.replace(
    "lease_expires_at = NULL", "lease_expires_at = NULL, started_at = t.s"
).replace("%(f)s::bigint[]) AS t(k, f)", "%(f)s::bigint[], %(s)s::timestamptz[]) AS t(k, f, s)")

TASKS_AHEAD_S = 2.0
"""How far ahead of its instant the tasks driver claims (cronwell's default window is
adaptive; at 50,000 it claims about this early)."""

SHAPES = {
    "ceiling": ("cronwell_occurrences", CLAIM, COMPLETE),
    "floor": ("bench_floor", FLOOR_CLAIM, FLOOR_COMPLETE),
}


def loop(url: str, batch: int, shape: str = "ceiling") -> None:
    """One driver; prints the CPU seconds it used from its first claim to its last write."""
    import psycopg

    if shape == "tasks":
        import uvloop

        print(uvloop.run(_tasks(url, batch)), flush=True)
        return
    table, claim, complete = SHAPES[shape]
    with psycopg.connect(url, autocommit=True) as conn:
        # Wait for T on the database's clock, as a worker does.
        row = conn.execute(
            f"SELECT extract(epoch FROM min(run_at) - now()) FROM {table} WHERE state = 'pending'"
        ).fetchone()
        if row and row[0] and row[0] > 0:
            time.sleep(float(row[0]))
        w = f"{shape}-{os.getpid()}"
        idle = 0
        cpu0 = time.process_time()
        cpu = 0.0
        while idle < 3:
            rows = conn.execute(claim, {"w": w, "b": batch}).fetchall()
            if not rows:
                idle += 1
                time.sleep(0.05)
                continue
            idle = 0
            conn.execute(complete, {"k": [r[0] for r in rows], "f": [r[1] for r in rows]})
            cpu = time.process_time() - cpu0
        print(cpu, flush=True)


async def _tasks(url: str, batch: int) -> float:
    """The tasks driver (module docstring); returns its CPU seconds from its first claim to
    its last write."""
    import psycopg

    loop = asyncio.get_running_loop()
    done: list[tuple[str, int, datetime]] = []
    instants: dict[float, asyncio.Future[None]] = {}
    marks: list[str] = []

    async def handler(instant: float) -> None:
        marks.append(f"{time.time()!r} {instant!r}\n")

    async def attempt(key: str, fence: int, due: float) -> None:
        if due > loop.time():
            at = instants.get(due)
            if at is None:
                at = instants[due] = loop.create_future()
                loop.call_at(due, at.set_result, None)
            await at
        started = datetime.now(UTC)
        await handler(due)
        done.append((key, fence, started))

    async def write(conn: psycopg.AsyncConnection[Any]) -> None:
        batch = done[:]
        del done[:]
        await conn.execute(
            TASKS_COMPLETE,
            {"k": [d[0] for d in batch], "f": [d[1] for d in batch], "s": [d[2] for d in batch]},
        )

    claimed_all = asyncio.Event()

    async def writer(conn: psycopg.AsyncConnection[Any]) -> None:
        while done or not claimed_all.is_set():
            if done:
                await write(conn)
            else:
                await asyncio.sleep(0.01)

    claimer = await psycopg.AsyncConnection.connect(url, autocommit=True)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    row = await (
        await claimer.execute(
            "SELECT extract(epoch FROM min(run_at) - now())::float8 FROM cronwell_occurrences"
            " WHERE state = 'pending'"
        )
    ).fetchone()
    if row and row[0] and row[0] > TASKS_AHEAD_S:
        await asyncio.sleep(row[0] - TASKS_AHEAD_S)
    w = f"tasks-{os.getpid()}"
    cpu0 = time.process_time()
    writing = asyncio.create_task(writer(conn))
    tasks: list[asyncio.Task[None]] = []
    idle = 0
    while idle < 3:
        cur = await claimer.execute(TASKS_CLAIM, {"w": w, "b": batch, "ahead": TASKS_AHEAD_S})
        rows = await cur.fetchall()
        if not rows:
            idle += 1
            await asyncio.sleep(0.05)
            continue
        idle = 0
        now = loop.time()
        tasks += [asyncio.create_task(attempt(k, f, now + due_in)) for k, f, due_in in rows]
    await asyncio.gather(*tasks)
    claimed_all.set()
    await writing
    cpu = time.process_time() - cpu0
    await claimer.close()
    await conn.close()
    return cpu


async def _drive(
    url: str, workers: int, batch: int, shape: str, postmaster: int
) -> tuple[float, float]:
    """W driver processes until the rows are done; the CPU seconds of the server under
    `postmaster` meanwhile (the wait for T included: an idle server's few milliseconds)
    and the drivers' own (each from its first claim to its last write)."""
    cpu0 = postgres_cpu_seconds(postmaster)
    procs = [
        subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "bench.ceiling", "--loop", url, str(batch), shape],
            start_new_session=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    t0 = time.monotonic()
    while any(p.poll() is None for p in procs):
        await asyncio.sleep(0.1)
        if time.monotonic() - t0 > 600:
            for p in procs:
                p.kill()
    drivers = sum(float(p.communicate()[0].split()[-1]) for p in procs)
    return postgres_cpu_seconds(postmaster) - cpu0, drivers


async def _figures(
    db: Any, table: str, instant: str, n: int, workers: int, batch: int, cpu: tuple[float, float]
) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            f"SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min({instant}))"
            " AS total, percentile_disc(0.99) WITHIN GROUP"
            f" (ORDER BY extract(epoch FROM started_at - {instant})) AS p99,"
            " percentile_disc(0.5) WITHIN GROUP"
            f" (ORDER BY extract(epoch FROM started_at - {instant})) AS p50"
            f" FROM {table} WHERE state = 'succeeded'"
        )
        r = await cur.fetchone()
    total = float(r["total"])
    return {
        "occurrences": n,
        "succeeded": r["n"],
        "workers": workers,
        "batch": batch,
        "start_lag_p50_s": round(float(r["p50"]), 3),
        "start_lag_p99_s": round(float(r["p99"]), 3),
        "all_succeeded_after_s": round(total, 3),
        "per_second": round(r["n"] / max(total, 1e-3)),
        "postgres_cpu_ms_per_occurrence": round(1000 * cpu[0] / max(r["n"], 1), 3),
        "worker_cpu_ms_per_occurrence": round(1000 * cpu[1] / max(r["n"], 1), 3),
    }


async def ceiling(db: Any, url: str, n: int, workers: int, batch: int) -> dict[str, Any]:
    """Run after the burst's seeding + materialisation (occurrences pending, due at T)."""
    cpu = await _drive(url, workers, batch, "ceiling", await postmaster_pid(db))
    return await _figures(db, "cronwell_occurrences", "scheduled_for", n, workers, batch, cpu)


async def tasks(db: Any, url: str, n: int, workers: int, batch: int) -> dict[str, Any]:
    """The tasks driver (module docstring) on a burst prepared as for the ceiling; `batch`
    is its claim batch."""
    cpu = await _drive(url, workers, batch, "tasks", await postmaster_pid(db))
    figs = await _figures(db, "cronwell_occurrences", "scheduled_for", n, workers, batch, cpu)
    return figs | {"claim_ahead_s": TASKS_AHEAD_S}


async def _floor_once(db: Any, url: str, n: int, workers: int, batch: int) -> dict[str, Any]:
    async with db.connection() as conn:
        await conn.execute(FLOOR_TABLE)
        cur = await conn.execute(
            "SELECT date_trunc('second', now()) + make_interval(secs => %s) AS t",
            (FLOOR_LEAD_S,),
        )
        at = (await cur.fetchone())["t"]
        postmaster = await postmaster_pid(db)
        cpu0 = postgres_cpu_seconds(postmaster)
        for i in range(0, n, 2_500):
            await conn.execute(FLOOR_INSERT, {"at": [at] * min(2_500, n - i)})
        insert_cpu = postgres_cpu_seconds(postmaster) - cpu0
        await conn.execute("ANALYZE bench_floor")
    cpu = await _drive(url, workers, batch, "floor", postmaster)
    figs = await _figures(db, "bench_floor", "run_at", n, workers, batch, cpu)
    async with db.connection() as conn:
        await conn.execute("DROP TABLE bench_floor; DROP SEQUENCE bench_floor_fence")
    return figs | {"insert_postgres_cpu_ms_per_occurrence": round(1000 * insert_cpu / n, 3)}


async def floor(db: Any, url: str, n: int, workers: int, batch: int) -> dict[str, Any]:
    """The floor (module docstring): n rows due at T = now + FLOOR_LEAD_S inserted into a
    bare table in batches of 2,500 (the scheduler's), claimed and completed from T by
    `workers` drivers; then the same with one driver (`one_claimer_*`: with no other
    claimer, no SKIP LOCKED skips and every committed claim's index entries soon dead to
    all, the cost of the writes alone). PostgreSQL CPU per occurrence of each."""
    figs = await _floor_once(db, url, n, workers, batch)
    one = await _floor_once(db, url, n, 1, batch)
    return figs | {
        "one_claimer_postgres_cpu_ms_per_occurrence": one["postgres_cpu_ms_per_occurrence"],
        "one_claimer_per_second": one["per_second"],
    }


if __name__ == "__main__" and len(sys.argv) in (4, 5) and sys.argv[1] == "--loop":
    loop(sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
