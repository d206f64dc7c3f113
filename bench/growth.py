"""Growth: per-operation cost of the hot queries as cronwell_jobs grows.

For each size S: S jobs (bulk INSERT via generate_series, 16 partitions, 1,000 due per
partition, the rest due in the future) and an occurrence history of H succeeded
occurrences per job (plus their attempts), and 1,000 pending occurrences due now. Then,
timed through cronwell's own named queries (store/queries.sql), each inside a transaction
that is rolled back so every repetition sees the same data, median of R runs:

- due_scan: JobDueClaim, one partition, LIMIT 500 (the scheduler's scan)
- claim:    OccurrenceClaimCandidates LIMIT 500 + JobLockBatch + JobActiveOccurrences +
            OccurrenceClaimBatch (what dispatch.claim sends for Skip jobs)
- complete: OccurrenceSucceedBatch of those 500 (fenced, with attempts INSERT)
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

HOLDER = "bench-growth"


async def _timed(db: Any, conn: Any, name: str, params: dict[str, Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    rows = await db.fetch(name, params, conn=conn)
    return 1000 * (time.perf_counter() - t0), rows


async def grow(db: Any, spec: dict[str, Any], size: int, history: int) -> float:
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
            "INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence,"
            " worker_id, outcome, started_at, finished_at) SELECT id, idempotency_key, 1,"
            " fence, 'w', 'succeeded', started_at, finished_at FROM cronwell_occurrences"
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


async def measure(db: Any, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"due_scan": [], "claim": [], "complete": []}
    for _ in range(reps):
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            ms, rows = await _timed(
                db,
                conn,
                "JobDueClaim",
                {"partition": 0, "holder": HOLDER, "epoch": 1, "horizon": 30, "limit": 500},
            )
            assert len(rows) == 500, len(rows)
            times["due_scan"].append(ms)
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            cands = await db.fetch(
                "OccurrenceClaimCandidates", {"pool": "default", "limit": 500}, conn=conn
            )
            t1 = time.perf_counter()
            ids = sorted({r["job_id"] for r in cands})
            await db.fetch("JobLockBatch", {"ids": ids}, conn=conn)
            t2 = time.perf_counter()
            await db.fetch("JobActiveOccurrences", {"ids": ids}, conn=conn)
            t3 = time.perf_counter()
            claimed = await db.fetch(
                "OccurrenceClaimBatch",
                {"ids": [r["id"] for r in cands], "worker_id": "w", "lease": 60},
                conn=conn,
            )
            t4 = time.perf_counter()
            times["claim"].append(1000 * (t4 - t0))
            for step, a, b in (
                ("claim.candidates", t0, t1),
                ("claim.job_lock", t1, t2),
                ("claim.active", t2, t3),
                ("claim.claim_batch", t3, t4),
            ):
                times.setdefault(step, []).append(1000 * (b - a))
            assert len(claimed) == 500, len(claimed)
            ms, done = await _timed(
                db,
                conn,
                "OccurrenceSucceedBatch",
                {
                    "keys": [r["idempotency_key"] for r in claimed],
                    "fences": [r["fence"] for r in claimed],
                },
            )
            assert len(done) == 500, len(done)
            times["complete"].append(ms)
    return {f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()}


async def growth(
    db: Any, spec: dict[str, Any], sizes: list[int], history: int, reps: int
) -> dict[str, Any]:
    await db.execute("PartitionEnsure", {"partitions": 16})
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
