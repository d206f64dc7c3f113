"""Anatomy: what each part of cronwell's schema costs PostgreSQL per occurrence.

One backend drives occurrences through their life in batches of 250 (about the sustained
run's claim and completion size): the job's cursor advanced (as the scheduler does when it
materialises), the occurrence inserted pending, claimed (a `SKIP LOCKED` range of the claim
index, then cronwell's own claim statement, OccurrenceClaimBatch) and completed (cronwell's
OccurrenceSucceedBatch), on a fresh store of 10,000 jobs: once as migrated, then once per
variant with one part of the schema taken away, and once in the alternative design an
earlier note named as the lever (pending and running rows in a narrow queue table, the
history row inserted once, at the end; its statements find rows as cronwell's do, with
the running state hidden from the planner; it leaves out what the design would also need:
a key's uniqueness checked across both tables, and the reaper's and overlap checks' paths).
One backend, nothing else running: the work of
the statements themselves, without the waits and the contention of a run with workers
(the sustained run's PostgreSQL CPU per occurrence is about twice this).

Figures per variant: the backend's CPU milliseconds per occurrence for each step and in
all, and the server's (the backend's plus autovacuum's, the WAL writer's, the
checkpointer's). The backend's CPU is read from /proc, in clock ticks (10 ms): a step's
figure is a sum over hundreds of batches, good to about 0.002 ms.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from bench.common import bench_server, discard, postgres_cpu_seconds, postmaster_pid, seed
from cronwell.store import Database, migrate
from cronwell.store._queries import queries_by_file

BATCH = 250
JOBS = 10_000
WARM_ROUNDS = 20
"""Batches run before measuring: the indexes past their first pages."""

_Q = queries_by_file()
CLAIM = _Q["claims"]["OccurrenceClaimBatch"]
SUCCEED = _Q["attempts"]["OccurrenceSucceedBatch"]
ATTEMPT_ROW = """att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                                   worker_id, outcome, started_at, finished_at)
    SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'succeeded', started_at,
           finished_at
    FROM done),"""
if ATTEMPT_ROW not in SUCCEED:
    raise RuntimeError("bench.anatomy: OccurrenceSucceedBatch no longer writes its attempt row so")

CURSOR = """UPDATE cronwell_jobs SET next_run_at = next_run_at + interval '1 second',
  updated_at = now() WHERE id = ANY(%(jobs)s::uuid[])"""
INSERT = """INSERT INTO {table} (idempotency_key, job_id, pool, scheduled_for, run_at, state,
  overlap, delivery, max_attempts, timeout_seconds)
SELECT j::text || ':' || %(k)s, j, 'default', %(t)s, %(t)s, 'pending', 'Skip', 'AtLeastOnce', 3, 60
FROM unnest(%(jobs)s::uuid[]) j"""
CANDIDATES = """SELECT array_agg(id) AS ids FROM (SELECT id FROM {table}
  WHERE pool = 'default' AND state = 'pending' AND run_at <= %(t)s ORDER BY run_at, id
  LIMIT %(b)s FOR UPDATE SKIP LOCKED) c"""

NARROW = """
CREATE TABLE bench_queue (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, idempotency_key text NOT NULL UNIQUE,
  job_id uuid NOT NULL, pool text NOT NULL, scheduled_for timestamptz NOT NULL,
  run_at timestamptz NOT NULL, state text NOT NULL, overlap text NOT NULL,
  delivery text NOT NULL, max_attempts int NOT NULL, timeout_seconds int NOT NULL,
  attempt int NOT NULL DEFAULT 0, fence bigint, worker_id text, lease_expires_at timestamptz,
  started_at timestamptz, claimed_at timestamptz);
CREATE INDEX bench_queue_claim ON bench_queue (pool, run_at) WHERE state = 'pending';
CREATE INDEX bench_queue_lease ON bench_queue (lease_expires_at) WHERE state = 'running';
CREATE INDEX bench_queue_active ON bench_queue (job_id) WHERE state = 'running';
"""
NARROW_CLAIM = """
UPDATE bench_queue q SET state = 'running', attempt = q.attempt + 1,
  fence = nextval('cronwell_fence'), worker_id = %(worker_id)s, claimed_at = now(),
  started_at = now(), lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM cronwell_jobs j WHERE q.id = ANY(%(ids)s::bigint[]) AND j.id = q.job_id
RETURNING q.id, q.fence, j.spec_hash"""
NARROW_COMPLETE = """
WITH done AS (
  DELETE FROM bench_queue q USING unnest(%(ids)s::bigint[], %(fences)s::bigint[]) t(id, fence)
  WHERE q.id = ANY(%(ids)s::bigint[]) AND q.id = t.id AND q.fence = t.fence
    AND coalesce(q.state = 'running', false)
  RETURNING q.*),
history AS (
  INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    overlap, delivery, max_attempts, timeout_seconds, attempt, fence, worker_id, started_at,
    finished_at, claimed_at)
  SELECT idempotency_key, job_id, pool, scheduled_for, run_at, 'succeeded', overlap, delivery,
    max_attempts, timeout_seconds, attempt, fence, worker_id, started_at, now(), claimed_at
  FROM done
  RETURNING id, idempotency_key, scheduled_for, attempt, fence, worker_id, started_at,
    finished_at, job_id),
att AS (
  INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
    worker_id, outcome, started_at, finished_at)
  SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'succeeded', started_at,
    finished_at FROM history),
counted AS (
  INSERT INTO cronwell_job_counters AS c (job_id, succeeded_total, dead_total, skipped_total,
    last_successful_at)
  SELECT job_id, count(*), 0, 0, max(finished_at) FROM history GROUP BY job_id ORDER BY job_id
  ON CONFLICT (job_id) DO UPDATE
  SET succeeded_total = c.succeeded_total + excluded.succeeded_total,
      last_successful_at = greatest(c.last_successful_at, excluded.last_successful_at))
SELECT count(*) AS n FROM history"""

_TRIGGERS = [
    f"DROP TRIGGER {t} ON cronwell_occurrences"
    for t in (
        "cronwell_job_counters_occurrence",
        "cronwell_status_occurrence_update",
        "cronwell_status_occurrence_insert",
    )
]
_RUN_LISTS = ["DROP INDEX cronwell_occurrences_job", "DROP INDEX cronwell_occurrences_pool"]
_STATES = [
    f"DROP INDEX cronwell_occurrences_{i}" for i in ("active", "lease", "finished", "dead", "rare")
]
NO_ATTEMPT_ROW = "no attempt row"
VARIANTS: dict[str, list[str]] = {
    "as migrated": [],
    "without the occurrence triggers (job counters, status changes)": _TRIGGERS,
    "without the success's attempt row": [NO_ATTEMPT_ROW],
    "without the run-list indexes (per job, per pool)": _RUN_LISTS,
    "without the state indexes (reaper, overlap, finished, dead, rare)": _STATES,
    "jobs: next_run_at in no index (the cursor's update HOT)": [
        f"DROP INDEX cronwell_jobs_{i}" for i in ("due", "forecast", "live_next")
    ],
    "bare occurrences: primary key, key, claim index; no triggers, no attempt row": (
        _TRIGGERS + _RUN_LISTS + _STATES + [NO_ATTEMPT_ROW]
    ),
}
NARROW_NAME = "alternative: narrow queue table, history row inserted once at the end"
STEPS = ("cursor", "insert", "claim", "complete")


def _backend_cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def lifecycle(
    db: Database, rounds: int, prepare: list[str], narrow: bool = False, warm: int = WARM_ROUNDS
) -> dict[str, float]:
    """Drive `warm` + `rounds` batches through their life after `prepare` (the jobs seeded);
    the CPU ms per occurrence of the last `rounds`."""
    table = "bench_queue" if narrow else "cronwell_occurrences"
    claim = NARROW_CLAIM if narrow else CLAIM
    if narrow:
        complete = NARROW_COMPLETE
    elif NO_ATTEMPT_ROW in prepare:
        complete = SUCCEED.replace(ATTEMPT_ROW, "")
    else:
        complete = SUCCEED
    lo, hi = datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
    spent = dict.fromkeys(STEPS, 0.0)
    postmaster = await postmaster_pid(db)
    async with db.connection() as conn:
        for ddl in [NARROW] if narrow else [p for p in prepare if p != NO_ATTEMPT_ROW]:
            await conn.execute(ddl)
        cur = await conn.execute("SELECT array_agg(id) AS ids FROM cronwell_jobs")
        jobs = (await cur.fetchone() or {})["ids"]
        cur = await conn.execute("SELECT pg_backend_pid() AS pid, now() AS now")
        row = await cur.fetchone() or {}
        pid, start = row["pid"], row["now"] - timedelta(seconds=10)
        server0 = 0.0
        for k in range(warm + rounds):
            if k == warm:
                server0 = postgres_cpu_seconds(postmaster)
            t = start + timedelta(milliseconds=k)
            batch = [jobs[(k * BATCH + i) % len(jobs)] for i in range(BATCH)]
            marks = [_backend_cpu(pid)]
            await conn.execute(CURSOR, {"jobs": batch})
            marks.append(_backend_cpu(pid))
            await conn.execute(INSERT.format(table=table), {"k": str(k), "t": t, "jobs": batch})
            marks.append(_backend_cpu(pid))
            cur = await conn.execute(CANDIDATES.format(table=table), {"t": t, "b": BATCH})
            ids = (await cur.fetchone() or {})["ids"]
            params = {"ids": ids, "lo": lo, "hi": hi, "worker_id": "w", "lease": 60}
            cur = await conn.execute(claim, params | {"conditional": []})
            claimed = await cur.fetchall()
            marks.append(_backend_cpu(pid))
            await conn.execute(
                complete,
                {
                    "ids": [r["id"] for r in claimed],
                    "fences": [r["fence"] for r in claimed],
                    "starts": [None] * len(claimed),
                    "lo": lo,
                    "hi": hi,
                    "buffered": [],
                },
            )
            marks.append(_backend_cpu(pid))
            if len(claimed) != BATCH:
                raise RuntimeError(f"bench.anatomy: claimed {len(claimed)} of {BATCH}")
            if k >= warm:
                for step, a, b in zip(STEPS, marks, marks[1:], strict=False):
                    spent[step] += b - a
        server = postgres_cpu_seconds(postmaster) - server0
    n = rounds * BATCH
    out = {f"{s}_ms": round(1000 * v / n, 4) for s, v in spent.items()}
    out["backend_ms"] = round(1000 * sum(spent.values()) / n, 4)
    out["server_ms"] = round(1000 * server / n, 4)
    return out


async def _variant(rounds: int, prepare: list[str], narrow: bool = False) -> dict[str, float]:
    """One variant on a server of its own (a fresh store: the variants drop parts of it)."""
    server = bench_server()
    url = server.start()
    try:
        async with Database(url, max_size=2, deadline_seconds=600) as db:
            await migrate(db)
            await seed(db, JOBS, "now()", {"handler": {"name": "bench.noop"}})
            return await lifecycle(db, rounds, prepare, narrow)
    finally:
        discard(server)


async def anatomy(rounds: int) -> dict[str, Any]:
    """Every variant, as migrated first; the difference each makes to the backend's CPU."""
    t0 = time.perf_counter()
    figs: dict[str, Any] = {"batch": BATCH, "jobs": JOBS, "occurrences_per_variant": rounds * BATCH}
    for name, prepare in VARIANTS.items():
        figs[name] = await _variant(rounds, prepare)
    figs[NARROW_NAME] = await _variant(rounds, [], narrow=True)
    base = figs["as migrated"]["backend_ms"]
    figs["backend_ms_saved_by_variant"] = {
        name: round(base - figs[name]["backend_ms"], 4) for name in [*VARIANTS, NARROW_NAME][1:]
    }
    figs["variants_seconds"] = round(time.perf_counter() - t0, 1)
    return figs
