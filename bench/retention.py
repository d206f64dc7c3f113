"""Retention: days of history, compressed, before and after partitioned history (issue 31).

Two stores in one run, each its own database on the bench's server, with the same retained
history (`retention_days` days of runs):

- before: history unpartitioned (migrate's partition_history=False); every recurring
  job's history limits keep `retention_days` days of its runs, so each day past the
  retention the pruner of cronwell/maintenance.py DELETEs a day of rows in batches.
- after: history partitioned by instant, one partition a day; the limits keep one day
  more (never reached: the pruner checks them before the retention, and a pass never sees
  more than retention + 1 days), so the retention removes the oldest day by dropping its
  partition.

`--retention-jobs` recurring jobs share `--retention-per-day` occurrences a day (98%
succeeded, 2% dead, one attempt each, the attempt carrying its occurrence's instant),
inserted directly with generate_series at their simulated instants (status triggers off
while seeding: the bench measures the store, not the operator's change log); the simulated
days are UTC days ending with today, so they fall in the day partitions. Each day also
creates and deletes `per_day / 100` one-shot jobs with one run each. Each day past the
retention, a retention pass at that day's clock (its end), timed, with the claim measured
beside it (`while_pruning`), then the same pass again with nothing to remove (`idle_pass_s`:
its fixed cost). Then, timed through the store's functions (cronwell/store/) in
rolled-back transactions (median of `reps`):

- due_scan:     materialise.claim_due, one partition, LIMIT 500 (the scheduler's scan)
- claim:        claims.candidates + lock_jobs + active + start of 500 pending
                occurrences (dispatch.claim)
- complete:     attempts.succeed of those 500 running occurrences (OccurrenceSucceedBatch,
                the worker's completion)
- status_batch: status_changes.job_status of 500 jobs (the operator's status writer)

plus the rows and on-disk size (tables + indexes, every partition) of occurrences +
attempts. The last day's pass runs at the instant of a `burst`-occurrence no-op burst
(bench/burst.py, `workers` worker processes); the same burst just before it, without the
pass, is the reference for its p99 start lag at the handler.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from bench.common import (
    SETUP_DEADLINE_SECONDS,
    BenchError,
    db_url,
    timed,
    timed_claim,
    timed_due_scan,
)
from cronwell import dispatch, jobs
from cronwell.errors import DatabaseError
from cronwell.maintenance import Pruner
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, attempts, history_partitions, migrate, status_changes

HOLDER = "bench-retention"
DAY = 86400
MIN_JOBS = 500
"""The claim times 500 pending occurrences, one per recurring job."""
MAX_LIMIT = 100_000
"""The highest history limit a job spec accepts (cronwell/models.py)."""
SHAPES = ("before", "after")


def _runs(per_day: int, n_jobs: int) -> tuple[int, int]:
    """(succeeded, dead) runs per recurring job per simulated day (k % 50 == 0: dead)."""
    per_job = max(1, per_day // n_jobs)
    return per_job - per_job // 50, per_job // 50


def _limits(shape: str, per_day: int, n_jobs: int, retention_days: int) -> tuple[int, int]:
    """(successful, failed) history limits: `retention_days` days of runs before, a day
    more after (the partition drop must find the day whole)."""
    ok, dead = _runs(per_day, n_jobs)
    days = retention_days + (shape == "after")
    return days * ok, days * dead


def check(n_jobs: int, per_day: int = 100_000, days: int = 10, retention_days: int = 7) -> None:
    """Sizes the section can measure (raises BenchError before anything is seeded)."""
    if n_jobs < MIN_JOBS:
        raise BenchError(
            f"retention needs at least {MIN_JOBS} recurring jobs (the claim times"
            f" {MIN_JOBS} pending occurrences, one per job), got {n_jobs}: raise"
            " --retention-jobs"
        )
    if days <= retention_days:
        raise BenchError(
            f"retention: --retention-days ({days}) must exceed the {retention_days}-day"
            " retention, or nothing is ever removed"
        )
    if max(_limits("after", per_day, n_jobs, retention_days)) > MAX_LIMIT:
        raise BenchError(
            f"retention: {per_day} occurrences a day over {n_jobs} jobs needs history limits"
            f" above {MAX_LIMIT}: raise --retention-jobs"
        )


def _spec(doc: dict[str, Any]) -> dict[str, Any]:
    return jobs.spec_document(ScheduledJobSpec.model_validate(doc))


async def _migrate(db: Database, shape: str) -> None:
    """Migrate a new store into `shape` (before: history unpartitioned)."""
    await migrate(db, partition_history=shape == "after")
    if (shape == "after") != await _partitioned(db):
        raise BenchError(f"retention: the '{shape}' store has the wrong history shape")


async def _partitioned(db: Database) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT relkind = 'p' AS p FROM pg_class WHERE oid = 'cronwell_occurrences'::regclass"
        )
        return bool((await cur.fetchone() or {"p": False})["p"])


async def _day_partitions(db: Database, first: datetime, end: datetime) -> None:
    """A partitioned store's partitions for the simulated days [first, end). A new store's
    legacy partition (from MINVALUE to its cutover, days ahead) would hold every simulated
    day and expire only once all had: dropped while empty, then the days made by issue 31's
    ensure_partitions, as a store partitioned for weeks has them."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT c.oid::regclass::text AS name FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'cronwell_occurrences'::regclass"
            " AND pg_get_expr(c.relpartbound, c.oid) LIKE '%%MINVALUE%%'"
        )
        for r in await cur.fetchall():
            n = await conn.execute(f"SELECT EXISTS (SELECT FROM {r['name']}) AS e")
            if (await n.fetchone() or {"e": True})["e"]:
                raise BenchError(f"retention: the legacy partition {r['name']} is not empty")
            await conn.execute(f"DROP TABLE {r['name']}")
    await history_partitions.ensure_partitions(db, first, end)


async def _retention_pass(db: Database, shape: str, now: datetime) -> dict[str, Any]:
    """One store-wide retention pass (history limits, then the retention) at the simulated
    clock `now`: the pruner reads the database's clock, so its retention is lengthened by
    how far `now` is behind it. Before: batched DELETEs; after: issue 31's Pruner drops
    the partitions past the retention (its `retention` count: their estimated rows)."""
    if shape == "after" and not await _partitioned(db):
        raise BenchError("retention: the 'after' store's history is not partitioned")
    async with db.connection() as conn:
        cur = await conn.execute("SELECT now() AS now")
        db_now: datetime = (await cur.fetchone() or {"now": now})["now"]
    behind = (db_now - now).total_seconds()
    pruner = Pruner(db, retention_seconds=RETENTION_DAYS * DAY + behind)
    t0 = time.perf_counter()
    res = await pruner.prune_once()
    return {
        "pass_s": round(time.perf_counter() - t0, 2),
        "removed": res.history + res.retention,
        "removed_by_limits": res.history,
    }


RETENTION_DAYS = 7
"""The store-wide retention of both shapes, days (the default retention_seconds)."""


async def _seed_jobs(db: Database, spec: dict[str, Any], n_jobs: int) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            " next_run_at) SELECT gen_random_uuid(), 'bench', 'r' || i, %s::jsonb, 'h',"
            " 'default', i %% 16, now() - interval '1 second' FROM generate_series(1, %s) i",
            (json.dumps(spec), n_jobs),
        )
        await _pending(conn)
        await _hold(conn)


async def _pending(conn: Any) -> None:
    """500 occurrences due now (never finished, never pruned): what the claim measures."""
    await conn.execute(
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
        " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
        " SELECT j.id || ':now', j.id, 'default', now(), now(), 'pending', 'Skip',"
        " 'AtLeastOnce', 3, 3600 FROM (SELECT id FROM cronwell_jobs WHERE namespace = 'bench'"
        " AND deleted_at IS NULL ORDER BY id LIMIT 500) j"
    )


async def _hold(conn: Any) -> None:
    """The partition leases, for the due scan (the bursts' scheduler needs them free)."""
    await conn.execute(
        "UPDATE cronwell_partitions SET holder = %s, epoch = 1,"
        " expires_at = now() + interval '1 day'",
        (HOLDER,),
    )


async def _seed_day(
    db: Database, oneshot_spec: dict[str, Any], day: int, start: datetime, per_day: int, n_jobs: int
) -> float:
    """One simulated day of history from `start` (a UTC midnight); returns seconds."""
    per_job = max(1, per_day // n_jobs)
    oneshots = max(1, per_day // 100)
    t0 = time.perf_counter()
    args = {"day": day, "per_job": per_job, "start": start, "n": oneshots}
    async with db.connection() as conn, conn.transaction():
        # No triggers while seeding; SET LOCAL: the pooled connection must not keep it
        # (replica mode also skips foreign-key cascades, which the pruner relies on).
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, reason, overlap, delivery, max_attempts, timeout_seconds, attempt,"
            " fence, worker_id, started_at, finished_at)"
            " SELECT j.id || ':' || %(day)s || ':' || k, j.id, 'default', ts, ts,"
            " CASE WHEN k %% 50 = 0 THEN 'dead' ELSE 'succeeded' END,"
            " CASE WHEN k %% 50 = 0 THEN 'AttemptsExhausted' END, 'Skip', 'AtLeastOnce', 1,"
            " 3600, 1, nextval('cronwell_fence'), 'w', ts, ts + interval '1 second'"
            " FROM cronwell_jobs j, generate_series(1, %(per_job)s) k,"
            " LATERAL (SELECT %(start)s::timestamptz"
            "          + make_interval(secs => (k - 1) * 86400.0 / %(per_job)s) AS ts) t"
            " WHERE j.namespace = 'bench' AND j.deleted_at IS NULL",
            args,
        )
        # one-shot jobs of the day, run once and deleted the same day
        await conn.execute(
            "WITH made AS ("
            " INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            "  next_run_at, deleted_at)"
            " SELECT gen_random_uuid(), 'once', 'd' || %(day)s || '-' || i, %(spec)s::jsonb,"
            "  'o', 'default', i %% 16, NULL, %(start)s::timestamptz + interval '12 hours'"
            " FROM generate_series(1, %(n)s) i RETURNING id, deleted_at)"
            " INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt, fence,"
            " worker_id, started_at, finished_at)"
            " SELECT m.id || ':once', m.id, 'default', m.deleted_at - interval '1 hour',"
            " m.deleted_at - interval '1 hour', 'succeeded', 'Skip', 'AtLeastOnce', 1, 3600, 1,"
            " nextval('cronwell_fence'), 'w', m.deleted_at - interval '1 hour',"
            " m.deleted_at - interval '1 hour' FROM made m",
            args | {"spec": json.dumps(oneshot_spec)},
        )
        # The day's finished runs (the pending ones due now are never finished).
        await conn.execute(
            "INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence,"
            " worker_id, outcome, error, started_at, finished_at, scheduled_for)"
            " SELECT id, idempotency_key, 1, fence, 'w',"
            " CASE WHEN state = 'dead' THEN 'failed' ELSE 'succeeded' END,"
            " CASE WHEN state = 'dead' THEN 'boom' END, started_at, finished_at, scheduled_for"
            " FROM cronwell_occurrences WHERE scheduled_for >= %(start)s::timestamptz"
            " AND scheduled_for < %(start)s::timestamptz + interval '1 day'"
            " AND state IN ('succeeded', 'dead')",
            args,
        )
    return time.perf_counter() - t0


async def _sizes(db: Database) -> dict[str, Any]:
    """Rows, and tables + indexes (+ TOAST) of every partition of occurrences + attempts."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM cronwell_occurrences) AS occurrences,"
            " (SELECT count(*) FROM cronwell_attempts) AS attempts,"
            " (SELECT count(*) FROM cronwell_jobs) AS jobs,"
            " (SELECT sum(pg_total_relation_size(relid)) FROM ("
            # pg_partition_tree is empty for an unpartitioned table: the tables themselves
            # too (a partitioned parent has no storage of its own).
            "   SELECT relid FROM pg_partition_tree('cronwell_occurrences')"
            "   UNION SELECT relid FROM pg_partition_tree('cronwell_attempts')"
            "   UNION SELECT 'cronwell_occurrences'::regclass"
            "   UNION SELECT 'cronwell_attempts'::regclass) t) AS bytes"
        )
        r = await cur.fetchone()
    assert r is not None  # an aggregate: always one row
    return {
        "occurrences": r["occurrences"],
        "attempts": r["attempts"],
        "jobs": r["jobs"],
        "size_mb": round(float(r["bytes"]) / 2**20, 1),
    }


async def _measure(db: Database, job_ids: list[uuid.UUID], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {
        "due_scan": [],
        "claim": [],
        "complete": [],
        "status_batch": [],
    }
    for _ in range(reps):
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            ms, _rows = await timed_due_scan(db, conn, HOLDER)
            times["due_scan"].append(ms)
        async with db.connection() as conn, conn.transaction(force_rollback=True):
            steps, claimed = await timed_claim(db, conn)
            assert len(claimed) == 500, len(claimed)
            times["claim"].append(steps["claim"])
            # The worker's batch completion of what it just claimed (same transaction).
            ms, done = await timed(
                attempts.succeed(
                    db,
                    [(s.id, s.fence) for s in claimed],
                    [s.started_at for s in claimed],
                    buffered=dispatch.BUFFERED_ORDER,
                    conn=conn,
                )
            )
            assert len(done.keys) == 500, len(done.keys)
            times["complete"].append(ms)
        ms, rows = await timed(status_changes.job_status(db, job_ids))
        assert len(rows) == len(job_ids)
        times["status_batch"].append(ms)
    return {f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()}


async def _vacuum(db: Database) -> None:
    async with db.connection() as conn:
        for t in ("cronwell_occurrences", "cronwell_attempts", "cronwell_jobs"):
            await conn.execute(f"VACUUM ANALYZE {t}")


async def _park(db: Database, parked: bool) -> None:
    """Out of a burst's way (True) and back: the pending occurrences the claim measures
    (deleted: the burst waits until none is pending), the recurring jobs' next runs, the
    partition leases."""
    async with db.connection() as conn:
        if parked:
            await conn.execute("DELETE FROM cronwell_occurrences WHERE state = 'pending'")
            await conn.execute("UPDATE cronwell_jobs SET next_run_at = NULL")
            await conn.execute("UPDATE cronwell_partitions SET holder = NULL, expires_at = NULL")
            return
        # The burst's jobs and runs go (the bursts are not history the bench keeps).
        await conn.execute(
            "DELETE FROM cronwell_occurrences WHERE job_id IN"
            " (SELECT id FROM cronwell_jobs WHERE namespace = 'bench' AND name LIKE 'j%%')"
        )
        await conn.execute(
            "DELETE FROM cronwell_job_counters WHERE job_id IN"
            " (SELECT id FROM cronwell_jobs WHERE namespace = 'bench' AND name LIKE 'j%%')"
        )
        await conn.execute(
            "DELETE FROM cronwell_jobs WHERE namespace = 'bench' AND name LIKE 'j%%'"
        )
        await _pending(conn)
        await conn.execute(
            "UPDATE cronwell_jobs SET next_run_at = now() - interval '1 second'"
            " WHERE namespace = 'bench'"
        )
        await _hold(conn)


async def _burst(
    db: Database, url: str, shape: str, now: datetime | None, opts: dict[str, Any]
) -> dict[str, Any]:
    """The no-op burst, with the retention pass at `now` started at its instant T (None:
    none); the start lag at the handler and the pass's figures."""

    async def pass_at_t() -> dict[str, Any]:
        assert now is not None
        return await _retention_pass(db, shape, now)

    await _park(db, True)
    try:
        figs = await opts["run_burst"](
            db,
            url,
            opts["burst"],
            opts["workers"],
            opts["concurrency"],
            opts["lead"],
            history=True,
            at_t=None if now is None else pass_at_t,
        )
    finally:
        await _park(db, False)
    keep = ("succeeded", "handler_starts", "all_succeeded_after_s", "at_t")
    return {k: v for k, v in figs.items() if k in keep or k.startswith("handler_start_lag_")}


async def _shape(
    server_url: str, shape: str, *, days: int, per_day: int, n_jobs: int, reps: int, **opts: Any
) -> dict[str, Any]:
    """One shape's run in its own database (dropped after)."""
    name = f"cronwell_retention_{shape}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    url = db_url(server_url, name)
    try:
        async with Database(url, max_size=4, deadline_seconds=SETUP_DEADLINE_SECONDS) as db:
            return await _history(db, url, shape, days, per_day, n_jobs, reps, opts)
    finally:
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def _history(
    db: Database,
    url: str,
    shape: str,
    days: int,
    per_day: int,
    n_jobs: int,
    reps: int,
    opts: dict[str, Any],
) -> dict[str, Any]:
    await _migrate(db, shape)
    ok, failed = _limits(shape, per_day, n_jobs, RETENTION_DAYS)
    spec = _spec(
        {
            "schedule": "* * * * *",
            "successfulJobsHistoryLimit": ok,
            "failedJobsHistoryLimit": failed,
            "target": {"log": {}},
        }
    )
    oneshot = _spec({"runAt": "2020-01-01T00:00:00Z", "target": {"log": {}}})
    async with db.connection() as conn:
        cur = await conn.execute("SELECT date_trunc('day', now(), 'UTC') AS today")
        today: datetime = (await cur.fetchone() or {})["today"]

    def start(day: int) -> datetime:  # simulated day `days` is today (UTC)
        return today - timedelta(days=days - day)

    if shape == "after":
        await _day_partitions(db, start(1), today + timedelta(days=2))
    await _seed_jobs(db, spec, n_jobs)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM cronwell_jobs WHERE namespace = 'bench' ORDER BY id LIMIT 500"
        )
        job_ids = [r["id"] for r in await cur.fetchall()]
    out: dict[str, Any] = {"history_limits": {"succeeded": ok, "failed": failed}, "per_day": []}
    print(
        f"{shape}:\n{'day':>4} {'occ rows':>10} {'att rows':>10} {'MB':>8} {'seed s':>7} "
        f"{'pass s':>7} {'removed':>9} {'due ms':>7} {'claim ms':>9} {'compl ms':>9} "
        f"{'status ms':>10} {'claim ms in pass':>17}",
        flush=True,
    )
    for day in range(1, days + 1):
        seeded = await _seed_day(db, oneshot, day, start(day), per_day, n_jobs)
        row: dict[str, Any] = {"day": day, "seed_s": round(seeded, 1)}
        # The day's clock: its end (the next day's start).
        clock = start(day) + timedelta(days=1)
        if day == days:
            # The last pass: at a burst's instant, after the same burst without it.
            await _vacuum(db)
            out["burst"] = await _burst(db, url, shape, None, opts)
            out["burst_with_pass"] = await _burst(db, url, shape, clock, opts)
            row |= out["burst_with_pass"]["at_t"]
        elif day > RETENTION_DAYS:
            prune = asyncio.create_task(_retention_pass(db, shape, clock))
            # The hot path while the pass runs (beside it, as in production).
            row["while_pruning"] = await _measure(db, job_ids, reps)
            row |= await prune
            # The same pass again, nothing left to remove: its fixed cost (the history
            # limits' sweep reads every job's runs), apart from the removal's.
            row["idle_pass_s"] = (await _retention_pass(db, shape, clock))["pass_s"]
        await _vacuum(db)
        row |= await _sizes(db)
        row |= await _measure(db, job_ids, reps)
        out["per_day"].append(row)
        print(
            f"{day:>4} {row['occurrences']:>10} {row['attempts']:>10} {row['size_mb']:>8} "
            f"{row['seed_s']:>7} {row.get('pass_s', ''):>7} {row.get('removed', ''):>9} "
            f"{row['due_scan_ms']:>7} {row['claim_ms']:>9} {row['complete_ms']:>9} "
            f"{row['status_batch_ms']:>10} "
            f"{row.get('while_pruning', {}).get('claim_ms', ''):>17}",
            flush=True,
        )
    return out


COMPARED = (
    ("seed s/day (mean)", "seed_s_mean"),
    ("pass s/day (mean, alone)", "pass_s_mean"),
    ("idle pass s (nothing to do)", "idle_pass_s_mean"),
    ("pass s (last, in burst)", "pass_s_last"),
    ("rows removed/pass (last)", "removed_last"),
    ("MB occ + att, 10 days", "size_mb"),
    ("claim ms", "claim_ms"),
    ("claim ms while a pass runs", "claim_ms_while_pruning"),
    ("completion ms (500)", "complete_ms"),
    ("due scan ms", "due_scan_ms"),
    ("burst p99 s (no pass)", "burst_p99_s"),
    ("burst p99 s (pass at T)", "burst_with_pass_p99_s"),
)


def _summary(figs: dict[str, Any]) -> dict[str, Any]:
    """The figures compared across shapes."""
    days = figs["per_day"]
    last = days[-1]
    alone = [d for d in days if "while_pruning" in d]
    return {
        "seed_s_mean": round(statistics.mean(d["seed_s"] for d in days), 1),
        "pass_s_mean": round(statistics.mean(d["pass_s"] for d in alone), 2) if alone else None,
        "idle_pass_s_mean": (
            round(statistics.mean(d["idle_pass_s"] for d in alone), 2) if alone else None
        ),
        "pass_s_last": last.get("pass_s"),
        "removed_last": last.get("removed"),
        "size_mb": last["size_mb"],
        "claim_ms": last["claim_ms"],
        "claim_ms_while_pruning": (
            round(statistics.median(d["while_pruning"]["claim_ms"] for d in alone), 2)
            if alone
            else None
        ),
        "complete_ms": last["complete_ms"],
        "due_scan_ms": last["due_scan_ms"],
        "burst_p99_s": figs["burst"].get("handler_start_lag_p99_s"),
        "burst_with_pass_p99_s": figs["burst_with_pass"].get("handler_start_lag_p99_s"),
    }


def _ratio(a: Any, b: Any) -> str:
    return (
        f"{b / a:.2f}x" if isinstance(a, int | float) and isinstance(b, int | float) and a else ""
    )


async def retention(
    server_url: str,
    *,
    days: int,
    per_day: int,
    n_jobs: int,
    burst: int,
    workers: int,
    concurrency: int,
    lead: float,
    run_burst: Callable[..., Awaitable[dict[str, Any]]],
    reps: int = 5,
) -> dict[str, Any]:
    """Both shapes, one after the other; a shape the code cannot build is reported, not
    measured (`error`)."""
    check(n_jobs, per_day, days, RETENTION_DAYS)
    out: dict[str, Any] = {
        "days": days,
        "occurrences_per_day": per_day,
        "jobs": n_jobs,
        "retention_days": RETENTION_DAYS,
        "burst": burst,
        "workers": workers,
    }
    opts = {
        "burst": burst,
        "workers": workers,
        "concurrency": concurrency,
        "lead": lead,
        "run_burst": run_burst,  # bench.burst.burst, passed in: sections share only common
    }
    for shape in SHAPES:
        try:
            figs = await _shape(
                server_url, shape, days=days, per_day=per_day, n_jobs=n_jobs, reps=reps, **opts
            )
        except (BenchError, DatabaseError) as e:
            # One shape failing (the code cannot build it; a pass that failed, e.g. a
            # deadlock with the claims beside it) leaves the other's figures.
            print(f"{shape}: {e}", flush=True)
            out[shape] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out[shape] = figs | {"summary": _summary(figs)}
    before, after = (out[s].get("summary", {}) for s in SHAPES)
    print(f"\n{'':<28} {'before':>10} {'after':>10} {'after/before':>13}")
    for label, key in COMPARED:
        b, a = before.get(key), after.get(key)
        print(
            f"{label:<28} {b if b is not None else '-':>10} {a if a is not None else '-':>10}"
            f" {_ratio(b, a):>13}"
        )
    out["compared"] = {
        key: {
            "before": before.get(key),
            "after": after.get(key),
            "ratio": _ratio(before.get(key), after.get(key)),
        }
        for _, key in COMPARED
    }
    return out
