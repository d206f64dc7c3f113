"""The fenced batch statements (heartbeats, starts, completions, releases) keep their plan
whatever the table's statistics say: their rows by the ids the worker holds, never a lookup
per key. In a burst the statistics are taken while every row is pending, or before the
burst was materialised at all: a join with unnest() planned from the first scanned the
running rows and matched each one against the whole key list (189 ms for one batch of 341
starts); a lookup per key planned from the second read the whole burst for each key (a
heartbeat: 11.5 s). Plan-shape and rows-read checks, not timing ones: the generic plan
(psycopg prepares a statement after five executions) and the custom plan (its first five)
under stale statistics. On a partitioned history, bounded by the batch's instant, each
touches the one partition of that instant among several days'."""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import AsyncCursor

from cronwell import dispatch
from cronwell.store import claims, history_partitions
from cronwell.store._queries import q
from cronwell.store.claims import EARLIEST, LATEST
from cronwell.store.db import Conn, Database

BATCH = [
    "OccurrenceHeartbeat",
    "OccurrenceStartBatch",
    "OccurrenceSucceedBatch",
    "OccurrenceRelease",
]


def prepared(sql: str) -> tuple[str, list[str]]:
    """The named query with $n placeholders, and its parameter names in order."""
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sb]", sub, sql), names


async def explained(cur: AsyncCursor[Any]) -> str:
    """An EXPLAIN's output, a line per row."""
    return "\n".join(str(next(iter(r.values()))) for r in await cur.fetchall())


async def generic_plan(
    conn: Conn, name: str, literals: dict[str, str], explain: str = "EXPLAIN"
) -> str:
    """`explain` (EXPLAIN and its options) of the named query's generic plan (as psycopg's
    prepared statement runs it after five executions), executed with these SQL literals
    (by parameter name): its parameters' types are inferred from the query, as the server
    infers them."""
    body, params = prepared(q(name))
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE generic AS {body}")
    cur = await conn.execute(f"{explain} EXECUTE generic({', '.join(literals[p] for p in params)})")
    plan = await explained(cur)
    await conn.execute("DEALLOCATE generic")
    await conn.execute("RESET plan_cache_mode")
    return plan


DAY = timedelta(days=1)
AT = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) + 4 * DAY
"""The batch's instant: in a day partition of its own, days from the others."""
PARTITION = history_partitions.partition_name(
    "cronwell_occurrences", AT - timedelta(hours=12), AT + timedelta(hours=12)
)


JOBS = (
    "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition)"
    " SELECT gen_random_uuid(), 'plans', 'j' || i, '{}'::jsonb, 'h', 'default', 0"
    " FROM generate_series(1, 5000) i"
)
OCCURRENCES = (
    "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
    " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
    " SELECT id::text || %s, id, 'default', %s, now(), %s, 'Skip', 'AtLeastOnce',"
    " 1, 60 FROM cronwell_jobs WHERE namespace = 'plans'"
)
"""One occurrence of each job: (key suffix, instant, state)."""


async def plan_under_stale_statistics(db: Database, name: str) -> str:
    """The generic plan of the named query over 5,000 occurrences analysed while all were
    pending, 1,000 of them running since, their instant AT (the bounds the batch sends),
    with the partitions of the days around it."""
    await history_partitions.ensure_partitions(db, AT - 3 * DAY, AT + 3 * DAY)
    async with db.connection() as conn:
        await conn.execute(JOBS)
        await conn.execute(OCCURRENCES, ("", AT, "pending"))
        await conn.execute("ANALYZE cronwell_occurrences")  # every row pending
        await conn.execute(
            "UPDATE cronwell_occurrences SET state = 'running', attempt = 1,"
            " fence = nextval('cronwell_fence'), worker_id = 'w', claimed_at = now(),"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE id IN (SELECT id FROM cronwell_occurrences ORDER BY id LIMIT 1000)"
        )
        # The bounds: the rows' instant, as the worker sends them for a batch of one
        # instant; the rest NULL (the plan is generic).
        at = f"'{AT.isoformat()}'::timestamptz"
        plan = await generic_plan(conn, name, defaultdict(lambda: "NULL", lo=at, hi=at))
    return plan


async def run_after_a_burst_unseen(db: Database, name: str) -> tuple[str, int]:
    """The named query run (EXPLAIN ANALYZE, its custom plan: planned with the values sent,
    as for a statement's first five executions) for 500 running attempts of a burst of
    5,000 at AT, the partition's statistics taken before the burst was materialised (when
    it held an earlier burst, an hour before): AT looks like one row, and the instant's
    index as selective as any (a failure: the first attempt's). Returns the plan and the
    attempts the statement names."""
    await history_partitions.ensure_partitions(db, AT - 3 * DAY, AT + 3 * DAY)
    async with db.connection() as conn:
        await conn.execute(JOBS)
        await conn.execute(OCCURRENCES, ("-earlier", AT - timedelta(hours=1), "succeeded"))
        await conn.execute("ANALYZE cronwell_occurrences")  # before the burst
        await conn.execute(OCCURRENCES, ("", AT, "pending"))
        cur = await conn.execute(
            "UPDATE cronwell_occurrences SET state = 'running', attempt = 1,"
            " fence = nextval('cronwell_fence'), worker_id = 'w', claimed_at = now(),"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE id IN (SELECT id FROM cronwell_occurrences WHERE scheduled_for = %s"
            " ORDER BY id LIMIT 500) RETURNING id, fence",
            (AT,),
        )
        held = await cur.fetchall()
        values = {
            "ids": [r["id"] for r in held],
            "fences": [r["fence"] for r in held],
            "starts": [None] * len(held),
            "lo": AT,
            "hi": AT,
            "lease": 60.0,
            "worker_id": "w",
            # A failure: the first attempt's.
            "id": held[0]["id"],
            "fence": held[0]["fence"],
            "next_state": "pending",
            "reason": "Failed",
            "error": "boom",
            "delay": 1.0,
            "outcome": "failed",
            "started": None,
            "buffered": dispatch.BUFFERED_ORDER,
        }
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + q(name), values)
        plan = await explained(cur)
    return plan, 1 if name == "OccurrenceFail" else len(held)


SCAN = re.compile(r"Scan(?: Backward)?(?: using \S+)? on (cronwell_occurrences_\w+)")
"""A plan line reading an occurrence partition (the parent's Update line aside)."""


@pytest.mark.parametrize("name", [*BATCH, "OccurrenceFail"])
async def test_a_fenced_write_reads_no_more_than_its_rows_when_statistics_missed_the_burst(
    db: Database, name: str
) -> None:
    """Each of its rows found once: its occurrence scans run once (not once per attempt),
    filter out no row they read, and read a few index and heap pages per attempt (a per-key
    lookup by the instant's index, the key a filter, read the whole burst per key: 1.39M
    pages for 500 heartbeats; a failure read every running row's lease entry and filtered
    all but its own out)."""
    plan, n = await run_after_a_burst_unseen(db, name)
    lines = plan.splitlines()
    scans = [(i, m) for i, line in enumerate(lines) if (m := SCAN.search(line))]
    assert scans and {m.group(1) for _, m in scans} == {PARTITION}, plan
    assert all(re.search(r"loops=1\)", lines[i]) for i, _ in scans), plan
    for i, _ in scans:
        # The scan's own lines, up to its Buffers line: no row read and filtered out.
        end = next(j for j in range(i + 1, len(lines)) if "Buffers:" in lines[j])
        own = lines[i + 1 : end + 1]
        assert not any("Rows Removed by Filter" in line for line in own), plan
        pages = sum(int(x) for x in re.findall(r"(?:hit|read)=(\d+)", own[-1]))
        assert pages <= 5 * n + 10, (pages, plan)


@pytest.mark.parametrize("name", BATCH)
async def test_a_batch_statement_reads_its_rows_by_id_under_stale_statistics(
    db: Database, name: str
) -> None:
    """No key lookup: the worker holds the ids; each row by primary key, nothing scanned."""
    plan = await plan_under_stale_statistics(db, name)
    assert f"Index Scan using {PARTITION}_pkey on {PARTITION} o" in plan, plan
    assert "_key_scheduled_for_key" not in plan and "_legacy_key" not in plan, plan
    assert "Seq Scan on cronwell_occurrences" not in plan, plan
    assert touched(plan) == {PARTITION}, plan


def touched(plan: str) -> set[str]:
    """The occurrence partitions the plan reads."""
    return set(SCAN.findall(plan))


COMING = {"pool": "default", "horizon": 2.0, "rows": 500, "due_rows": 500, "instants": 1000,
          "after": EARLIEST}  # fmt: skip
CANDIDATES = {"pool": "default", "ahead": 2.0, "limit": 500, "serial": ["Skip"]}
LIMITS = {"after": uuid.UUID(int=0), "jobs": 200, "limit": 1000}


def literal(value: object) -> str:
    """A parameter as an SQL literal (for EXECUTE of a generic plan)."""
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(literal(v) for v in value) + "]::text[]"
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    return f"'{value}'" if isinstance(value, str | uuid.UUID) else str(value)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    "name, params",
    [
        ("OccurrenceClaimCandidates", CANDIDATES),
        ("OccurrenceComingInstants", COMING),
        ("HistoryLimitPrune", LIMITS),
    ],
)
async def test_claim_plans_leave_out_the_partitions_after_until(
    db: Database, name: str, params: dict[str, object], generic: bool
) -> None:
    """The partitions created ahead (here days of them) are not read by a claim, a look or
    a history limits batch given `until`: planning the 48 made ahead at hour width cost a
    claim ~7 ms, a limits batch ~30 ms. Custom plans (the parameters sent with the
    statement, its first five executions) leave them out when planning; generic ones
    (psycopg prepares a statement after five executions: the look's plan is generic from
    then on) when they start: `until IS NULL OR ...` left every one in a generic plan.
    `LATEST`, the bound a claim sends before its first look, leaves them all in."""
    now = datetime.now(UTC)
    await history_partitions.ensure_partitions(db, now - DAY, now + 5 * DAY)
    until = now + timedelta(seconds=150)
    async with db.connection() as conn:

        async def plan(bound: datetime) -> set[str]:
            values = {**params, "until": bound}
            if generic:
                return touched(
                    await generic_plan(conn, name, {k: literal(v) for k, v in values.items()})
                )
            cur = await conn.execute("EXPLAIN " + q(name), values)
            return touched(await explained(cur))

        unbounded, bounded = await plan(LATEST), await plan(until)
    parts = await history_partitions.partitions(db)
    ahead = {p.name for p in parts if p.parent == "cronwell_occurrences" and p.lo and p.lo > until}
    assert len(ahead) >= 4, ahead
    assert ahead <= unbounded, unbounded  # without a bound every one is read
    assert bounded and not bounded & ahead, bounded


async def test_a_looks_farther_window_starts_its_range_scan_after_the_nearer_one(
    db: Database,
) -> None:
    """The generic plan of the look (psycopg prepares it after five executions) starts its
    range scan of the claim index at `after`: a look's farther window does not read the
    nearer one's rows again (`after IS NULL OR run_at > after` was a filter, so a burst
    in the nearer window was read once per window)."""
    values = {"pool": "'default'", "horizon": "30", "after": "now()", "until": "now() + '1 day'",
              "rows": "1000", "due_rows": "100", "instants": "1000"}  # fmt: skip
    async with db.connection() as conn:
        plan = await generic_plan(conn, "OccurrenceComingInstants", values)
    after = f"${prepared(q('OccurrenceComingInstants'))[1].index('after') + 1}"
    # Both range scans: of what is due already and of what is due within the horizon.
    assert re.search(rf"Index Cond: .*\(run_at > {re.escape(after)}\)", plan), plan
    assert re.search(
        rf"Index Cond: .*\(run_at > GREATEST\(now\(\), {re.escape(after)}\)\)", plan
    ), plan


async def seed_a_backlog_unseen(db: Database) -> None:
    """20,000 pending occurrences due already (4 of each of 5,000 jobs in the last 4
    minutes, each at an instant of its own, so that every reader meets them in one order),
    materialised after the statistics were taken, while every partition was empty (a new
    store; a day's partition in its first minute, before autovacuum's ANALYZE)."""
    now = datetime.now(UTC)
    await history_partitions.ensure_partitions(db, now - DAY, now + 3 * DAY)
    async with db.connection() as conn:
        await conn.execute(JOBS)
        await conn.execute("ANALYZE cronwell_occurrences")  # every partition empty
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
            " SELECT id::text || '-' || m, id, 'default', t, t, 'pending', 'Skip',"
            " 'AtLeastOnce', 1, 60"
            " FROM (SELECT id, m, now() - make_interval(mins => m)"
            "        + make_interval(secs => row_number() OVER (ORDER BY id) / 1000.0) AS t"
            "       FROM cronwell_jobs, generate_series(1, 4) m) x"
        )


async def explain_in_index_order(
    conn: Conn, name: str, params: dict[str, object], generic: bool = False
) -> str:
    """EXPLAIN ANALYZE of the named query as the worker runs it: after InIndexOrder, in
    its transaction (rolled back: nothing stays locked); `generic`: its generic plan (as
    psycopg's prepared statement runs it after five executions)."""
    explain = "EXPLAIN (ANALYZE, COSTS OFF)"
    async with conn.transaction(force_rollback=True):
        await conn.execute(q("InIndexOrder"))
        if generic:
            literals = {k: literal(v) for k, v in params.items()}
            return await generic_plan(conn, name, literals, explain)
        cur = await conn.execute(f"{explain} {q(name)}", params)
        return await explained(cur)


def rows_read(plan: str) -> list[int]:
    """The rows each occurrence partition scan of the plan returned (per loop)."""
    return [
        round(float(m.group(1)))
        for line in plan.splitlines()
        if SCAN.search(line) and (m := re.search(r"actual .*rows=([\d.]+)", line))
    ]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    "name, params",
    [
        ("OccurrenceClaimCandidates", {**CANDIDATES, "limit": 50}),
        ("OccurrenceComingInstants", {**COMING, "rows": 50, "due_rows": 50}),
    ],
)
async def test_a_claim_and_a_look_read_the_claim_index_in_order_whatever_the_statistics(
    db: Database, name: str, params: dict[str, object], generic: bool
) -> None:
    """A claim's candidates and a look read what they return from the claim index in its
    order and stop at their LIMIT, under statistics taken while the partitions were empty:
    without InIndexOrder the planner read all 20,000 due rows and sorted them (a claim's
    cost grew with the backlog it was draining: 24-117 ms a claim at 10,000 per-second
    jobs, and the sustained bench collapsed). Custom plans (a statement's first five
    executions) and generic ones (the rest)."""
    await seed_a_backlog_unseen(db)
    async with db.connection() as conn:
        plan = await explain_in_index_order(conn, name, {**params, "until": LATEST}, generic)
    read = rows_read(plan)
    assert read and max(read) <= 100, plan


async def test_a_candidates_previous_occurrence_is_looked_up_once_it_is_locked(
    db: Database,
) -> None:
    """`pending_before` is probed for the candidates this claim locked, not for those
    another claimer holds (SKIP LOCKED passes them over): in the locking query's select
    list it was computed for them too (150 probes for 50 candidates behind 100 held)."""
    await seed_a_backlog_unseen(db)
    async with db.transaction() as other, db.connection() as conn:
        await other.execute(
            "SELECT id FROM cronwell_occurrences WHERE state = 'pending'"
            " ORDER BY run_at LIMIT 100 FOR UPDATE"
        )
        plan = await explain_in_index_order(
            conn, "OccurrenceClaimCandidates", {**CANDIDATES, "limit": 50, "until": LATEST}
        )
    lines = plan.splitlines()
    sub = next(i for i, line in enumerate(lines) if "SubPlan" in line)
    assert "loops=50)" in lines[sub + 1], plan
    limit = next(line for line in lines if "Limit" in line)
    assert re.search(r"rows=50\.00 loops=1\)", limit), plan


async def test_the_reapers_waiting_check_reads_the_waiting_rows_only(db: Database) -> None:
    """WaitingStranded, asked every reaper pass, finds a job whose occurrence waits behind
    nothing active, and reads the waiting rows only: no running occurrence is read to be
    filtered out. Through the active occurrences' partial index it read every running row
    (and, between two autovacuums, every dead entry): 33-63 ms a pass at 10,000 per-second
    jobs with nothing waiting."""
    await history_partitions.ensure_partitions(db, AT - 3 * DAY, AT + 3 * DAY)
    async with db.connection() as conn:
        await conn.execute(JOBS)
        await conn.execute(OCCURRENCES, ("", AT, "running"))
        cur = await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition)"
            " VALUES (gen_random_uuid(), 'plans-waiting', 'j', '{}'::jsonb, 'h', 'default', 0)"
            " RETURNING id"
        )
        row = await cur.fetchone()
        assert row is not None
        job = row["id"]
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
            " VALUES (%s, %s, 'default', %s, now(), 'waiting', 'BufferAll', 'AtLeastOnce', 1, 60)",
            (f"{job}-waiting", job, AT),
        )
        await conn.execute("ANALYZE cronwell_occurrences")
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + q("WaitingStranded"), {"limit": 100}
        )
        plan = await explained(cur)
    assert await claims.stranded(db, limit=100) == [job]
    assert touched(plan) >= {PARTITION}, plan
    # The one filtered out: the waiting row itself, in the probe for its job's active ones.
    assert sum(int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)) <= 1, plan
    executed = plan.split("Planning:")[0]  # the planner's catalog reads aside
    assert all(int(n) <= 20 for n in re.findall(r"(?:hit|read)=(\d+)", executed)), plan
