"""Growth: per-operation cost of the hot queries as cronwell_jobs grows.

For each size S: S jobs (bulk INSERT via generate_series, 16 partitions, 1,000 due per
partition, the rest due in the future) and an occurrence history of H succeeded
occurrences per job (plus their attempts), and 1,000 pending occurrences due now. Then,
timed through the store's own functions (cronwell/store/), each inside a transaction
that is rolled back so every repetition sees the same data, median of R runs:

- due_scan: materialise.claim_due, one partition, LIMIT 500 (the scheduler's scan)
- claim:    claims.candidates LIMIT 500 + lock_jobs + active + start (what
            dispatch.claim sends for Skip jobs), each step also on its own (claim.<step>)
- complete: attempts.succeed of those 500 (fenced, with attempts INSERT)
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from bench.common import BenchError, timed, timed_claim, timed_due_scan
from cronwell import dispatch
from cronwell.store import Database, attempts, partitions

HOLDER = "bench-growth"
MIN_JOBS = 8_000
"""Fewer jobs leave partition 0 under the 500 due jobs the due scan times (16 partitions)."""


async def grow(db: Database, spec: dict[str, Any], size: int, history: int) -> float:
    """Seed one size; returns seconds spent seeding."""
    t0 = time.perf_counter()
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_jobs CASCADE"
        )
        await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            " next_run_at) SELECT gen_random_uuid(), 'bench', 'j' || i, %s::jsonb, 'h',"
            " 'default', i %% 16, CASE WHEN i <= 16000 THEN now() - interval '1 second'"
            " ELSE now() + make_interval(secs => 3600 + i %% 86400) END"
            " FROM generate_series(1, %s) i",
            (json.dumps(spec), size),
        )
        # History: `history` succeeded occurrences per job, one per minute in the past.
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt, fence,"
            " worker_id, started_at, finished_at)"
            " SELECT j.id || ':' || h, j.id, 'default', ts, ts, 'succeeded', 'Skip',"
            " 'AtLeastOnce', 3, 3600, 1, nextval('cronwell_fence'), 'w', ts, ts"
            " FROM cronwell_jobs j, generate_series(1, %s) h,"
            " LATERAL (SELECT now() - make_interval(mins => h) AS ts) t",
            (history,),
        )
        await conn.execute(
            "INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for,"
            " attempt, fence, worker_id, outcome, started_at, finished_at)"
            " SELECT id, idempotency_key, scheduled_for, 1, fence, 'w', 'succeeded',"
            " started_at, finished_at FROM cronwell_occurrences"
        )
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
            " SELECT j.id || ':now', j.id, 'default', now(), now(), 'pending', 'Skip',"
            " 'AtLeastOnce', 3, 3600 FROM (SELECT id FROM cronwell_jobs LIMIT 1000) j"
        )
        await conn.execute(
            "UPDATE cronwell_partitions SET holder = %s, epoch = 1,"
            " expires_at = now() + interval '1 hour'",
            (HOLDER,),
        )
        await conn.execute("VACUUM ANALYZE cronwell_jobs")
        await conn.execute("VACUUM ANALYZE cronwell_occurrences")
        await conn.execute("VACUUM ANALYZE cronwell_attempts")
    return time.perf_counter() - t0


async def measure(db: Database, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"due_scan": [], "claim": [], "complete": []}
    for _ in range(reps):
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            ms, due = await timed_due_scan(db, conn, HOLDER)
            assert len(due) == 500, len(due)
            times["due_scan"].append(ms)
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            steps, claimed = await timed_claim(db, conn)
            for step, ms in steps.items():
                times.setdefault(step, []).append(ms)
            assert len(claimed) == 500, len(claimed)
            ms, done = await timed(
                attempts.succeed(
                    db,
                    [(s.id, s.fence) for s in claimed],
                    buffered=dispatch.BUFFERED_ORDER,
                    conn=conn,
                )
            )
            assert len(done.keys) == 500, len(done.keys)
            times["complete"].append(ms)
    return {f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()}


def check(sizes: list[int]) -> None:
    """Sizes the section can measure (raises BenchError before anything is seeded)."""
    small = [s for s in sizes if s < MIN_JOBS]
    if small:
        raise BenchError(
            f"growth needs at least {MIN_JOBS:,} jobs per size (500 due in one of 16"
            f" partitions), got {small}: raise --growth-sizes"
        )


async def growth(
    db: Database, spec: dict[str, Any], sizes: list[int], history: int, reps: int
) -> dict[str, Any]:
    check(sizes)
    await partitions.ensure_leases(db, partitions=16)
    out: dict[str, Any] = {"batch": 500, "history_per_job": history, "repetitions": reps}
    for size in sizes:
        seeded = await grow(db, spec, size, history)
        m = await measure(db, reps)
        out[f"jobs_{size}"] = m | {"seed_s": round(seeded, 1)}
        print(f"growth {size}: {m} (seeded in {seeded:.1f}s)", flush=True)
    async with db.connection() as conn:  # leave the partitions free for later sections
        await conn.execute("UPDATE cronwell_partitions SET holder = NULL, expires_at = NULL")
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_jobs CASCADE"
        )
    return out
