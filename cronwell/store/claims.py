"""The claim path (cronwell/dispatch.py): due candidates, overlap decisions under the job's
lock, the claim itself, specs by hash, waiting promotion and the due notification."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from cronwell.store.attempts import ALL_TIME, Within
from cronwell.store.db import Conn, Database, row_class


@row_class
class Candidate:
    """A pending occurrence due now or within the claim-ahead window, locked for this
    claim."""

    id: int
    job_id: uuid.UUID
    overlap: str
    attempt: int
    scheduled_for: datetime
    run_at: datetime
    due: bool
    """Its instant has come (False: it is claimable only ahead of its instant)."""
    pending_before: int | None = None
    """Serialised jobs: the job's previous occurrence (nominal order) when it is still
    pending in this pool and never attempted; None otherwise."""


@row_class
class Candidates:
    """A claim's candidates in claim order, as arrays (OccurrenceClaimCandidates): each
    one's id and whether it is due; the columns of an overlap decision only for those of
    serialised jobs (None for the others, which need no decision)."""

    ids: list[int]
    due: list[bool]
    job_ids: list[Any]
    overlaps: list[Any]
    """The job's overlap policy if it serialises its occurrences, else None."""
    attempts: list[Any]
    scheduled_for: list[Any]
    run_at: list[Any]
    pending_before: list[Any]
    lo: datetime | None
    """The earliest instant of all candidates (None: there are none)."""
    hi: datetime | None
    """The latest."""

    def candidate(self, k: int) -> Candidate:
        """The `k`th candidate as an object (one of a serialised job's)."""
        return Candidate(
            self.ids[k],
            self.job_ids[k],
            self.overlaps[k],
            self.attempts[k],
            self.scheduled_for[k],
            self.run_at[k],
            self.due[k],
            self.pending_before[k],
        )


@row_class
class Active:
    """An occurrence of a serialised job that is running, retrying or waiting."""

    id: int
    job_id: uuid.UUID
    state: str  # running | pending (retry backoff) | waiting
    idempotency_key: str
    scheduled_for: datetime
    prev: int | None = None
    """Claimed conditionally, its instant not come (it has not run: dispatch.gate): the
    occurrence just before it, which a claim may decide as if this one were not there.
    None for every other."""


@row_class
class Started:
    """An occurrence the claim took: its new fence and lease, and its job's spec hash."""

    id: int
    idempotency_key: str
    job_id: uuid.UUID
    scheduled_for: datetime
    run_at: datetime
    started_at: datetime | None
    """None: claimed ahead of its instant (run_at), not started yet."""
    attempt: int
    fence: int
    delivery: str
    max_attempts: int
    timeout_seconds: int
    origin: str
    claimed_at: datetime
    """The claim's transaction start: its lease runs from here (`lease_expires_at`)."""
    conditional: bool
    """Claimed ahead while an earlier occurrence of its Skip job ran: it may start only
    once its gate (dispatch.gate) says so at its instant."""
    db_now: datetime
    """The database clock when the claim statement ran (the worker's timer aligns to it)."""
    namespace: str
    name: str
    spec_hash: str


S = TypeVar("S", bound=Started)


@row_class
class JobSpec:
    """A job's current spec document and its content hash."""

    id: uuid.UUID
    spec_hash: str
    spec: dict[str, Any]


@row_class
class Due:
    """An occurrence that became claimable: its pool and when."""

    pool: str
    run_at: datetime


@row_class
class StrandedJob:
    job_id: uuid.UUID


@row_class
class Coming:
    """An instant at which `n` pending occurrences of a pool become due (None: nothing
    pending), and the database's clock to measure the wait against."""

    run_at: datetime | None
    n: int | None
    db_now: datetime


EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
"""Before any instant: `coming`'s lower bound when it reads from the first (a constant,
not NULL: a generic plan cannot use `x IS NULL OR run_at > x` as its index bound, and read
a burst again for each farther window of a look)."""
LATEST = datetime(9999, 12, 31, tzinfo=UTC)
"""After any instant: the `until` of a claim or a look with no bound (a constant, not NULL,
for the same reason: a generic plan leaves out no partition with `x IS NULL OR ...`)."""


CLAIM_TURN_CLASS = 7370
"""The class (first key) of the pools' claim turns (ClaimTurn; the second key is the hash of
the pool's name)."""


async def take_turn(db: Database, *, pool: str, wait_seconds: float, conn: Conn) -> bool:
    """Take `pool`'s turn to claim for the rest of the transaction `conn`, waiting at most
    `wait_seconds` for the claim holding it (0: only if free); whether it was taken. The
    transaction plans no sort from here (as InIndexOrder: `candidates(..., turn_taken=True)`
    need not say it again)."""
    params = {"lock_class": CLAIM_TURN_CLASS, "pool": pool, "wait_ms": round(wait_seconds * 1000)}
    return bool(await db.scalar("ClaimTurn", params, conn))


async def candidates(
    db: Database,
    *,
    pool: str,
    limit: int,
    serial: Sequence[str],
    ahead_seconds: float = 0.0,
    until: datetime | None = None,
    conn: Conn | None = None,
    turn_taken: bool = False,
) -> Candidates:
    """Pending occurrences of `pool` due within `ahead_seconds`, oldest first, locked
    against other claimers, as arrays; `serial`: the overlap policies that serialise a
    job's occurrences (only their candidates carry `Candidate`'s columns); `until`: only
    instants before it (see the query: it keeps the partitions created ahead out of the
    plan). `conn`: the claim's transaction (the rest of it plans no sort: InIndexOrder);
    without one, a transaction of its own. `turn_taken`: `take_turn` ran in `conn` (it
    said InIndexOrder's setting already)."""
    params = {
        "pool": pool,
        "limit": limit,
        "ahead": ahead_seconds,
        "serial": list(serial),
        "until": LATEST if until is None else until,
    }
    async with _in_index_order(db, conn, said=turn_taken) as c:
        (found,) = await db.rows(Candidates, "OccurrenceClaimCandidates", params, c)
    return found  # an aggregate: always one row


@contextlib.asynccontextmanager
async def _in_index_order(
    db: Database, conn: Conn | None, *, said: bool = False
) -> AsyncIterator[Conn]:
    """`conn` (a transaction), or a transaction of its own, planning no sort from here on
    (InIndexOrder; `said`: a statement of `conn` set it already, ClaimTurn)."""
    async with db.within(conn) as c:
        if conn is None or not said:
            await db.execute("InIndexOrder", None, c)
        yield c


JOB_LOCK_CLASS = 7369
"""The class (first key) of the jobs' advisory locks (JobLockBatch); OccurrenceTriggerLock
uses 7368, ClaimTurn 7370."""


async def lock_jobs(
    db: Database, job_ids: Sequence[uuid.UUID], *, conn: Conn | None = None
) -> None:
    """Lock these jobs (JobLockBatch: an advisory lock each, not their rows) until the
    transaction ends: their claims, promotions and backfills serialise here."""
    await db.scalar("JobLockBatch", {"ids": job_ids, "lock_class": JOB_LOCK_CLASS}, conn)


async def lock_slots_per_connection(db: Database) -> int:
    """PostgreSQL's `max_locks_per_transaction` (LockSlotsPerConnection)."""
    return int(await db.scalar("LockSlotsPerConnection", {}))


async def active(
    db: Database, job_ids: Sequence[uuid.UUID], *, pool: str, conn: Conn | None = None
) -> list[Active]:
    """Running, retrying and waiting occurrences of these jobs (after `lock_jobs`), for a
    claim of `pool` (only a conditional claim of its own pool may be passed over: the
    gate, which must see the earlier one, reads its own pool's)."""
    return await db.rows(Active, "JobActiveOccurrences", {"ids": job_ids, "pool": pool}, conn)


async def settle(
    db: Database,
    decisions: Sequence[tuple[int, str, str]],
    *,
    within: Within,
    conn: Conn | None = None,
) -> None:
    """Apply overlap decisions, (occurrence id, new state, reason) each, to rows whose
    instants are `within` these bounds."""
    await db.execute(
        "OccurrenceSettleBatch",
        {
            "ids": [d[0] for d in decisions],
            "states": [d[1] for d in decisions],
            "reasons": [d[2] for d in decisions],
            "lo": within[0],
            "hi": within[1],
        },
        conn,
    )


@row_class
class Earlier:
    """What stands before a conditional claim at its instant (ConditionalEarlier)."""

    id: int
    overlapped: bool
    """An earlier occurrence of its job is active: the claim is skipped."""
    behind: bool
    """The one just before it is pending in its pool, never attempted: it steps aside."""


async def earlier(
    db: Database,
    held: Sequence[tuple[int, uuid.UUID, datetime]],
    *,
    pool: str,
    until: datetime,
    over: Sequence[int] = (),
    conn: Conn | None = None,
) -> list[Earlier]:
    """For conditional claims of `pool`, (id, job, instant) each, at their instant: what
    stands before each (`until`: past every instant; `over`: occurrences known to have
    succeeded, their completion not written yet: not active)."""
    return await db.rows(
        Earlier,
        "ConditionalEarlier",
        {
            "ids": [h[0] for h in held],
            "jobs": [h[1] for h in held],
            "instants": [h[2] for h in held],
            "pool": pool,
            "until": until,
            "over": list(over),
        },
        conn,
    )


async def decide_conditional(
    db: Database,
    verdicts: Sequence[tuple[int, int, str]],
    *,
    within: Within,
    conn: Conn | None = None,
) -> set[int]:
    """Apply the gate's verdicts on conditional claims not to start, (id, fence, skip |
    back) each, to claims not started whose instants are `within` these bounds; the ids
    decided (one missing lost its lease)."""
    rows = await db.fetch(
        "ConditionalDecide",
        {
            "ids": [v[0] for v in verdicts],
            "fences": [v[1] for v in verdicts],
            "verdicts": [v[2] for v in verdicts],
            "lo": within[0],
            "hi": within[1],
        },
        conn,
    )
    return {r["id"] for r in rows}


async def start(
    db: Database,
    ids: Sequence[int],
    *,
    worker_id: str,
    lease_seconds: float,
    row: type[S],
    within: Within = ALL_TIME,
    conditional: Sequence[int] = (),
    conn: Conn | None = None,
) -> list[S]:
    """Claim these occurrences (their instants `within` these bounds) for `worker_id`: a new
    fence each, attempt + 1, a lease; those already due start now, the others when the
    worker records their start. Each as a `row`: Started, or a subclass whose further
    fields have defaults (the claimer's own, built from the row without a copy). Those of
    `conditional` are claimed conditionally (decided at their instant: dispatch.gate)."""
    return await db.rows(
        row,
        "OccurrenceClaimBatch",
        {
            "ids": ids,
            "conditional": list(conditional),
            "worker_id": worker_id,
            "lease": lease_seconds,
            "lo": within[0],
            "hi": within[1],
        },
        conn,
    )


async def specs(
    db: Database, job_ids: Sequence[uuid.UUID], *, conn: Conn | None = None
) -> list[JobSpec]:
    """The current specs of these jobs (for hashes the claimer has not parsed)."""
    return await db.rows(JobSpec, "JobSpecBatch", {"ids": job_ids}, conn)


async def promote_waiting(
    db: Database, job_ids: Sequence[uuid.UUID], *, conn: Conn | None = None
) -> list[Due]:
    """Make each job's oldest waiting occurrence pending (after `lock_jobs`)."""
    return await db.rows(Due, "WaitingPromote", {"ids": job_ids}, conn)


async def stranded(db: Database, *, limit: int, conn: Conn | None = None) -> list[uuid.UUID]:
    """Jobs whose waiting occurrences have nothing active ahead of them to promote them."""
    rows = await db.rows(StrandedJob, "WaitingStranded", {"limit": limit}, conn)
    return [r.job_id for r in rows]


async def coming(
    db: Database,
    *,
    pool: str,
    horizon_seconds: float,
    rows: int,
    due_rows: int | None = None,
    instants: int = 1000,
    until: datetime | None = None,
    after: datetime | None = None,
) -> list[Coming]:
    """The next instants of `pool`'s pending occurrences within `horizon_seconds` (and
    after `after`, if given) and how many are due at each (over the earliest `due_rows`
    of those due already, `rows` when not given, and the earliest `rows` of the others, at
    most `instants` instants), earliest first; one row with run_at None when none is
    pending. `until`: as in `candidates`. In a transaction of its own, planned as the
    candidates are (InIndexOrder)."""
    async with _in_index_order(db, None) as conn:
        return await db.rows(
            Coming,
            "OccurrenceComingInstants",
            {
                "pool": pool,
                "horizon": horizon_seconds,
                "rows": rows,
                "due_rows": rows if due_rows is None else due_rows,
                "instants": instants,
                "until": LATEST if until is None else until,
                "after": EARLIEST if after is None else after,
            },
            conn,
        )


async def notify_due(db: Database, payload: str, *, conn: Conn | None = None) -> None:
    """One NOTIFY on cronwell_due with `payload` ({pool: earliest run_at}, as JSON)."""
    await db.scalar("DueNotify", {"payload": payload}, conn)
