"""Retention: days of history, compressed, with the pruner run after each simulated day.

`--retention-jobs` recurring jobs share `--retention-per-day` occurrences a day (98%
succeeded, 2% dead, one attempt each), inserted directly with generate_series at their
simulated instants (status triggers off while seeding: the bench measures the store, not
the operator's change log). Each day also creates and deletes `per_day / 100` one-shot
jobs with one run each (what the store-wide retention removes). After each day the pruner
of cronwell/maintenance.py runs with the jobs' history limits (100 succeeded, the default;
10 of each other final state, so that the dead runs reach their limit within the simulated
days) and a 7-day retention whose clock is the simulated day's. Then, timed through the
store's functions (cronwell/store/) in rolled-back transactions (median of `reps`):

- due_scan:     materialise.claim_due, one partition, LIMIT 500 (the scheduler's scan)
- claim:        claims.candidates + lock_jobs + active + start of 500 pending
                occurrences (dispatch.claim)
- status_batch: status_changes.job_status of 500 jobs (the operator's status writer)

plus the rows and on-disk size of occurrences + attempts and the prune pass's time, and
the same figures measured while that prune pass runs (`while_pruning`). Flat figures
across days = bounded history.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from bench.common import BenchError, timed, timed_claim, timed_due_scan
from cronwell.maintenance import Pruner
from cronwell.store import Database, status_changes

HOLDER = "bench-retention"
DAY = 86400
MIN_JOBS = 500
"""The claim times 500 pending occurrences, one per recurring job."""


async def _seed_jobs(db: Database, spec: dict[str, Any], n_jobs: int) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_status_changes,"
            " cronwell_job_counters, cronwell_jobs CASCADE"
        )
        await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            " next_run_at) SELECT gen_random_uuid(), 'bench', 'r' || i, %s::jsonb, 'h',"
            " 'default', i %% 16, now() - interval '1 second' FROM generate_series(1, %s) i",
            (json.dumps(spec), n_jobs),
        )
        # 500 occurrences due now (never finished, never pruned): what the claim measures.
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
            " SELECT j.id || ':now', j.id, 'default', now(), now(), 'pending', 'Skip',"
            " 'AtLeastOnce', 3, 3600 FROM (SELECT id FROM cronwell_jobs LIMIT 500) j"
        )
        await conn.execute(
            "UPDATE cronwell_partitions SET holder = %s, epoch = 1,"
            " expires_at = now() + interval '1 day'",
            (HOLDER,),
        )


async def _seed_day(
    db: Database, oneshot_spec: dict[str, Any], day: int, days: int, per_day: int, n_jobs: int
) -> float:
    """One simulated day of history, `days - day` days before now; returns seconds."""
    per_job = max(1, per_day // n_jobs)
    oneshots = max(1, per_day // 100)
    t0 = time.perf_counter()
    async with db.connection() as conn, conn.transaction():
        # No triggers while seeding; SET LOCAL: the pooled connection must not keep it
        # (replica mode also skips foreign-key cascades, which the pruner relies on).
        await conn.execute("SET LOCAL session_replication_role = replica")
        # day start = now - (days - day) days; instants spread over the day
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, reason, overlap, delivery, max_attempts, timeout_seconds, attempt,"
            " fence, worker_id, started_at, finished_at)"
            " SELECT j.id || ':' || %(day)s || ':' || k, j.id, 'default', ts, ts,"
            " CASE WHEN k %% 50 = 0 THEN 'dead' ELSE 'succeeded' END,"
            " CASE WHEN k %% 50 = 0 THEN 'AttemptsExhausted' END, 'Skip', 'AtLeastOnce', 1,"
            " 3600, 1, nextval('cronwell_fence'), 'w', ts, ts + interval '1 second'"
            " FROM cronwell_jobs j, generate_series(1, %(per_job)s) k,"
            " LATERAL (SELECT now() - make_interval(days => %(ago)s)"
            "          + make_interval(secs => k * 86400.0 / %(per_job)s) AS ts) t"
            " WHERE j.namespace = 'bench' AND j.deleted_at IS NULL",
            {"day": day, "per_job": per_job, "ago": days - day},
        )
        # one-shot jobs of the day, run once and deleted the same day
        await conn.execute(
            "WITH made AS ("
            " INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            "  next_run_at, deleted_at)"
            " SELECT gen_random_uuid(), 'once', 'd' || %(day)s || '-' || i, %(spec)s::jsonb,"
            "  'o', 'default', i %% 16, NULL,"
            "  now() - make_interval(days => %(ago)s) + interval '12 hours'"
            " FROM generate_series(1, %(n)s) i RETURNING id, deleted_at)"
            " INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt, fence,"
            " worker_id, started_at, finished_at)"
            " SELECT m.id || ':once', m.id, 'default', m.deleted_at - interval '1 hour',"
            " m.deleted_at - interval '1 hour', 'succeeded', 'Skip', 'AtLeastOnce', 1, 3600, 1,"
            " nextval('cronwell_fence'), 'w', m.deleted_at - interval '1 hour',"
            " m.deleted_at - interval '1 hour' FROM made m",
            {"day": day, "ago": days - day, "n": oneshots, "spec": json.dumps(oneshot_spec)},
        )
        await conn.execute(
            "INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for,"
            " attempt, fence, worker_id, outcome, error, started_at, finished_at)"
            " SELECT id, idempotency_key, scheduled_for, 1, fence, 'w',"
            " CASE WHEN state = 'dead' THEN 'failed' ELSE 'succeeded' END,"
            " CASE WHEN state = 'dead' THEN 'boom' END, started_at, finished_at"
            " FROM cronwell_occurrences o WHERE o.idempotency_key LIKE %s"
            " OR (o.idempotency_key LIKE '%%:once' AND NOT EXISTS"
            "     (SELECT 1 FROM cronwell_attempts a WHERE a.occurrence_id = o.id))",
            (f"%:{day}:%",),
        )
    return time.perf_counter() - t0


async def _sizes(db: Database) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM cronwell_occurrences) AS occurrences,"
            " (SELECT count(*) FROM cronwell_attempts) AS attempts,"
            " (SELECT count(*) FROM cronwell_jobs) AS jobs,"
            " pg_total_relation_size('cronwell_occurrences')"
            " + pg_total_relation_size('cronwell_attempts') AS bytes"
        )
        r = await cur.fetchone()
    assert r is not None  # an aggregate: always one row
    return {
        "occurrences": r["occurrences"],
        "attempts": r["attempts"],
        "jobs": r["jobs"],
        "size_mb": round(r["bytes"] / 2**20, 1),
    }


async def _measure(db: Database, job_ids: list[uuid.UUID], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"due_scan": [], "claim": [], "status_batch": []}
    for _ in range(reps):
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            ms, _rows = await timed_due_scan(db, conn, HOLDER)
            times["due_scan"].append(ms)
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            steps, claimed = await timed_claim(db, conn)
            assert len(claimed) == 500, len(claimed)
            times["claim"].append(steps["claim"])
        ms, rows = await timed(status_changes.job_status(db, job_ids))
        assert len(rows) == len(job_ids)
        times["status_batch"].append(ms)
    return {f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()}


def check(n_jobs: int) -> None:
    """Sizes the section can measure (raises BenchError before anything is seeded)."""
    if n_jobs < MIN_JOBS:
        raise BenchError(
            f"retention needs at least {MIN_JOBS} recurring jobs (the claim times"
            f" {MIN_JOBS} pending occurrences, one per job), got {n_jobs}: raise"
            " --retention-jobs"
        )


async def retention(
    db: Database,
    spec: dict[str, Any],
    oneshot_spec: dict[str, Any],
    *,
    days: int,
    per_day: int,
    n_jobs: int,
    retention_days: float = 7.0,
    reps: int = 5,
) -> dict[str, Any]:
    check(n_jobs)
    await _seed_jobs(db, spec, n_jobs)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM cronwell_jobs WHERE namespace = 'bench' ORDER BY id LIMIT 500"
        )
        job_ids = [r["id"] for r in await cur.fetchall()]
    out: dict[str, Any] = {
        "days": days,
        "occurrences_per_day": per_day,
        "jobs": n_jobs,
        "retention_days": retention_days,
        "history_limits": "100 succeeded / 10 of each other final state per job",
        "per_day": [],
    }
    print(
        f"{'day':>4} {'occ rows':>10} {'att rows':>10} {'jobs':>7} {'MB':>8} {'seed s':>7} "
        f"{'prune s':>8} {'pruned':>9} {'due ms':>7} {'claim ms':>9} {'status ms':>10} "
        f"{'claim ms while pruning':>23}",
        flush=True,
    )
    for day in range(1, days + 1):
        seeded = await _seed_day(db, oneshot_spec, day, days, per_day, n_jobs)
        # The simulated day's clock: its retention line is (days - day) days further back.
        pruner = Pruner(db, retention_seconds=(retention_days + days - day) * DAY)
        t0 = time.perf_counter()
        prune = asyncio.create_task(pruner.prune_once())
        # The hot path while the pruner deletes the day's excess: claims and due scans
        # measured meanwhile (the pruner runs beside them, as in production).
        during = await _measure(db, job_ids, reps)
        res = await prune
        prune_s = time.perf_counter() - t0
        async with db.connection() as conn:
            await conn.execute("VACUUM ANALYZE cronwell_occurrences")
            await conn.execute("VACUUM ANALYZE cronwell_attempts")
            await conn.execute("VACUUM ANALYZE cronwell_jobs")
        sizes = await _sizes(db)
        m = await _measure(db, job_ids, reps)
        row = {
            "day": day,
            **sizes,
            "seed_s": round(seeded, 1),
            "prune_s": round(prune_s, 1),
            "pruned": res.history + res.retention,
            **m,
            "while_pruning": during,
        }
        out["per_day"].append(row)
        print(
            f"{day:>4} {sizes['occurrences']:>10} {sizes['attempts']:>10} {sizes['jobs']:>7} "
            f"{sizes['size_mb']:>8} {row['seed_s']:>7} {row['prune_s']:>8} {row['pruned']:>9} "
            f"{m['due_scan_ms']:>7} {m['claim_ms']:>9} {m['status_batch_ms']:>10} "
            f"{during['claim_ms']:>23}",
            flush=True,
        )
    async with db.connection() as conn:  # leave the store empty for later sections
        await conn.execute("UPDATE cronwell_partitions SET holder = NULL, expires_at = NULL")
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_status_changes,"
            " cronwell_job_counters, cronwell_jobs CASCADE"
        )
    return out
