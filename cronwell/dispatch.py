"""Claiming, heartbeating and completing occurrences: the fenced state machine that workers
drive and the reaper repairs. Overlap policies are decided here, at claim time, under the
job's lock (claims.lock_jobs: one job's claims, promotions and backfills are serialised,
never its neighbours').

Claim ahead: a claim may take occurrences due within the next few seconds; the worker
starts each at its instant (`Claimed.due_monotonic`, its local timer aligned to the
database clock at the claim) and records the start (AtLeastOnce: with its ending, see the
worker runtime's docstring). Overlap must be decided at the instant,
so an occurrence of a serialised job is claimed ahead only when nothing of its job is active
or due before it: claimed, it is itself the job's active occurrence, so nothing of the job
can start before it. Otherwise it stays pending and is decided when it is due, except one
of a Skip job whose active occurrences are all running (and earlier): it is claimed ahead
*conditionally* and decided at its instant by its worker (`gate`): skipped if an earlier
occurrence of its job is still active then, given back if the one just before it is
pending and never attempted, started otherwise. Without it a Skip job's next
occurrence could be claimed only once the previous run's completion was recorded: at
fleet scale a run started late made the next late too (bench/README.md, "Serialised
per-second jobs: the late phase"). Until its instant it has not run, so a claim of the
occurrence just before it (given back by a stopping worker, or a retry of it) decides as
if it were not there, and the later one, at its gate, sees that one and steps aside.

The claims of a pool take turns (`ClaimTurn`): each takes the oldest due rows, none
stepped over because another claimer holds them. The turn is a preference only: a claim
that waited `TURN_WAIT_SECONDS` for it (its holder paused or cut off mid-claim) goes ahead
beside the holder, as every claim did before, and so does the next of its worker's until a
claim finds the turn free again.

Claimers skip each other's locked candidates (SKIP LOCKED), so one may see a serialised
job's later occurrence while another holds the earlier one; deciding the later one then
would run (or claim ahead) occurrences out of order and skip the earlier one as
"overlapping" what came after it. Such a candidate is held back (`hold_back`): left
pending, untouched, until the earlier one is decided.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Container, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from cronwell.models import ConcurrencyPolicy
from cronwell.store import attempts, claims, dead
from cronwell.store.claims import Active, Candidate, Candidates, Started
from cronwell.store.db import Conn, Database, row_class

SERIAL = {p.value for p in ConcurrencyPolicy} - {ConcurrencyPolicy.ALLOW.value}
SERIAL_ORDER = sorted(SERIAL)  # as a query parameter
BUFFERED = {ConcurrencyPolicy.BUFFER_ONE.value, ConcurrencyPolicy.BUFFER_ALL.value}
BUFFERED_ORDER = sorted(BUFFERED)  # as a query parameter


TURN_WAIT_SECONDS = 0.2
"""The longest a claim waits for its pool's turn: a few claims' time (a claim of 500 takes
10-30 ms); beyond it the holder is taken to be stuck (bench/README.md, "Claims take turns")."""


class ClaimTurn:
    """A worker's wait for its pool's turn to claim: `TURN_WAIT_SECONDS`, or none after a
    claim that waited that long without it (a stuck holder would cost every claim the whole
    wait), until a claim finds the turn free."""

    def __init__(self) -> None:
        self.wait_seconds = TURN_WAIT_SECONDS

    def after(self, taken: bool) -> None:
        """Record whether the last claim got the turn."""
        self.wait_seconds = TURN_WAIT_SECONDS if taken else 0.0


@row_class
class Claimed(Started):
    """An occurrence this worker now runs, under `fence`, until `lease` runs out: the row
    the claim started (`spec_hash`: equal hashes are equal specs, so workers cache parsed
    specs by hash alone) and the spec document to run."""

    spec: dict[str, Any] | None = None
    """The spec document to run, fetched when the claimer did not know `spec_hash`; None
    when it did (it runs the spec it parsed under that hash)."""

    due_monotonic: float = 0.0
    """`run_at` on this process's monotonic clock: the local instant the claim returned
    plus (run_at - the database clock at the claim statement). Never early (the database
    read its clock before the claim returned); late by at most the claim's last round trip."""

    lease_from_monotonic: float = 0.0
    """`claimed_at` (the lease's start) on this process's monotonic clock, found the same
    way: late by at most the claim's last round trip, which the self-fencing margin covers.
    Not the instant the claim was sent: a claim that first waited seconds for a connection
    (the database just back) would otherwise hold leases that look lapsed on arrival."""

    @property
    def key(self) -> str:
        return self.idempotency_key


_set = object.__setattr__


def arrived(
    c: Claimed, received: float | None = None, spec: dict[str, Any] | None = None
) -> Claimed:
    """`c` as it arrived (`received`: the monotonic instant the claim statement returned;
    default now), with its instant and its lease's start on this process's clock, and its
    spec. Set on the row the claim built, before anyone else sees it (a row class is frozen
    to the type checker; a copy of each claimed row was measurable in a burst)."""
    at = time.monotonic() if received is None else received
    _set(c, "due_monotonic", at + (c.run_at - c.db_now).total_seconds())
    _set(c, "lease_from_monotonic", at + (c.claimed_at - c.db_now).total_seconds())
    if spec is not None:
        _set(c, "spec", spec)
    return c


def hold_back(cands: list[Candidate], locked: Container[int] | None = None) -> list[Candidate]:
    """The candidates this claim may decide: without those of a serialised job at or after
    one whose previous occurrence is still pending but not among the ids this claim locked
    (`locked`; default: those of `cands`): another claimer holds it."""
    ids = {c.id for c in cands} if locked is None else locked
    first_held: dict[uuid.UUID, datetime] = {}
    for c in cands:
        if c.pending_before is not None and c.pending_before not in ids:
            first_held[c.job_id] = min(first_held.get(c.job_id, c.scheduled_for), c.scheduled_for)
    if not first_held:
        return cands
    return [
        c for c in cands if c.job_id not in first_held or c.scheduled_for < first_held[c.job_id]
    ]


def plan_ahead(
    ahead: list[Candidate],
    due: list[Candidate],
    active: list[Active],
    conditional: set[int] | None = None,
) -> list[int]:
    """Which candidates not yet due to claim ahead: every one of a job that allows overlap;
    of a serialised job, only its earliest, and only when nothing of the job is active or
    due (the others stay pending: their overlap is decided at their instant). A retry
    (attempt > 0) counts as earliest whatever its run_at, as at `decide_overlap`: a newer
    occurrence due before the retry's backoff ends was claimed ahead of it, ran, and left
    the retry waiting behind it (Skip: for as long as the newer one ran).

    Of a Skip job whose active occurrences are all running and earlier, nothing of it due:
    its earliest fresh one too, added to `conditional` (see the module's docstring)."""
    cand_ids = {c.id for c in ahead} | {c.id for c in due}
    others = [a for a in active if a.id not in cand_ids]
    busy = {a.job_id for a in others}
    due_jobs = {c.job_id for c in due if c.overlap in SERIAL}
    busy |= due_jobs
    # Per job, the latest instant of its running occurrences (None: one is not running).
    running: dict[uuid.UUID, datetime | None] = {}
    for a in others:
        last = running.get(a.job_id, a.scheduled_for)
        running[a.job_id] = (
            None if a.state != "running" or last is None else max(last, a.scheduled_for)
        )
    run: list[int] = []
    for c in sorted(ahead, key=lambda c: (c.attempt == 0, c.run_at, c.id)):
        if c.overlap not in SERIAL:
            run.append(c.id)
        elif c.job_id not in busy:
            run.append(c.id)
            busy.add(c.job_id)
        elif conditional is not None and _conditional(c, running.get(c.job_id), due_jobs):
            run.append(c.id)
            conditional.add(c.id)
            running[c.job_id] = None  # one a job per claim
    return run


def _conditional(c: Candidate, running_until: datetime | None, due_jobs: set[uuid.UUID]) -> bool:
    """Whether a busy job's candidate may be claimed conditionally: a fresh occurrence of a
    Skip job, nothing of it due, its active ones all running and before it."""
    return (
        c.overlap == ConcurrencyPolicy.SKIP.value
        and c.attempt == 0
        and c.job_id not in due_jobs
        and running_until is not None
        and running_until < c.scheduled_for
    )


def decide_overlap(
    candidates: list[Candidate], active: list[Active]
) -> tuple[list[int], list[tuple[int, str, str]]]:
    """Apply each job's overlap policy. Returns (ids to run, [(id, new state, reason)]).

    Skip: nothing starts while an occurrence is active; BufferOne: one waits, the rest are
    skipped; BufferAll: all wait; Replace: the active one is cancelled and the newest runs.
    """
    run: list[int] = []
    settle: list[tuple[int, str, str]] = []
    cand_ids = {c.id for c in candidates}
    by_job: dict[uuid.UUID, list[Candidate]] = defaultdict(list)
    for c in sorted(candidates, key=lambda c: (c.scheduled_for, c.id)):
        if c.overlap in SERIAL:
            by_job[c.job_id].append(c)
        else:
            run.append(c.id)
    act: dict[uuid.UUID, list[Active]] = defaultdict(list)
    for a in active:
        if a.id not in cand_ids:
            act[a.job_id].append(a)
    for job_id, cands in by_job.items():
        # The next occurrence, claimed conditionally, its instant not come, has not run:
        # its gate (`gate`) reads the one just before it, this one, and steps aside.
        others = [a for a in act[job_id] if a.prev != cands[0].id]
        if not others and len(cands) == 1:
            run.append(cands[0].id)  # nothing active, one candidate: every policy runs it
            continue
        policy = cands[0].overlap
        busy_key = next((a.idempotency_key for a in others if a.state != "waiting"), None)
        waiting = sum(1 for a in others if a.state == "waiting")
        # A retry of the active occurrence resumes before anything newer.
        retry = [c for c in cands if c.attempt > 0]
        fresh = [c for c in cands if c.attempt == 0]
        if policy == ConcurrencyPolicy.REPLACE:
            for a in others:
                if a.state != "waiting":
                    settle.append((a.id, "cancelled", "Replaced by a newer occurrence"))
            newest, older = cands[-1], cands[:-1]
            run.append(newest.id)
            settle += [(c.id, "skipped", "Replaced by a newer occurrence") for c in older]
            continue
        busy = busy_key is not None
        for c in retry:
            if busy:
                settle.append((c.id, "waiting", "Waiting for the active occurrence"))
            else:
                run.append(c.id)
                busy = True
        slots = {
            ConcurrencyPolicy.BUFFER_ONE: 1 - waiting,
            ConcurrencyPolicy.BUFFER_ALL: len(fresh),
        }.get(ConcurrencyPolicy(policy), 0)
        for c in fresh:
            if not busy:
                run.append(c.id)
                busy = True
            elif slots > 0:
                settle.append((c.id, "waiting", "Buffered behind the active occurrence"))
                slots -= 1
            else:
                settle.append((c.id, "skipped", "Overlap: an earlier occurrence is still active"))
    return run, settle


async def claim(
    db: Database,
    *,
    pool: str,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    known_specs: Container[str] = frozenset(),
    ahead_seconds: float = 0.0,
    due_limit: int | None = None,
    until: datetime | None = None,
    turn: ClaimTurn | None = None,
) -> list[Claimed]:
    """Claim up to `limit` occurrences of `pool` due now or within `ahead_seconds` (see the
    module's docstring): one transaction, a few round trips. Overlap is decided for the due
    ones; one not due is claimed or left as `plan_ahead` says. At most `due_limit` due
    ones (None: no limit): a worker takes no more due work than it has free handler slots,
    while it may claim ahead beyond them (the rest stay pending, for whoever is free).

    Specs are fetched only for hashes not in `known_specs` (one job per hash): in a burst of
    jobs sharing a spec, one spec is read and parsed, not one per occurrence. `until`:
    candidates' instants before it only (claims.candidates; None: no bound). `turn`: the
    caller's wait for the pool's turn (None: `TURN_WAIT_SECONDS`)."""
    async with db.transaction() as conn:
        wait = TURN_WAIT_SECONDS if turn is None else turn.wait_seconds
        taken = await claims.take_turn(db, pool=pool, wait_seconds=wait, conn=conn)
        if turn is not None:
            turn.after(taken)
        found = await claims.candidates(
            db,
            pool=pool,
            limit=limit,
            serial=SERIAL_ORDER,
            ahead_seconds=ahead_seconds,
            until=until,
            conn=conn,
            turn_taken=True,
        )
        if not found.ids:
            return []
        jobs = list({j for j in found.job_ids if j is not None})  # serialised jobs
        active: list[Active] = []
        if jobs:
            await claims.lock_jobs(db, jobs, conn=conn)
            active = await claims.active(db, jobs, pool=pool, conn=conn)
        conditional: set[int] = set()
        run, settle = decide(found, active, due_limit, conditional)
        # The bounds of the candidates' instants (and of the active rows a Replace may
        # cancel): the writes by id prune a partitioned history to their partitions.
        assert found.lo is not None and found.hi is not None  # there are candidates
        within = (found.lo, found.hi)
        if settle:
            if active:
                within = bounds([*within, *(a.scheduled_for for a in active)])
            await claims.settle(db, settle, within=within, conn=conn)
        if not run:
            return []
        started = await claims.start(
            db,
            run,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            within=within,
            row=Claimed,
            conditional=sorted(conditional),
            conn=conn,
        )
        received = time.monotonic()
        return await attach_specs(db, conn, started, known_specs, received)


def decide(
    found: Candidates,
    active: list[Active],
    due_limit: int | None,
    conditional: set[int] | None = None,
) -> tuple[list[int], list[tuple[int, str, str]]]:
    """A claim's decisions over its candidates (after lock_jobs and active): the ids to
    claim and the overlap decisions to settle, at most `due_limit` due ones (None: no
    limit); those to claim conditionally are added to `conditional` (plan_ahead). One of
    a job that allows overlap, or the only candidate of a serialised job with nothing
    active and no earlier occurrence pending, is claimed from the arrays alone:
    every policy runs it (decide_overlap, plan_ahead) and hold_back keeps it. The others
    become objects for hold_back, decide_overlap and plan_ahead."""
    locked = set(found.ids)
    per_job = Counter(j for j in found.job_ids if j is not None)
    busy = {a.job_id for a in active if a.id not in locked}
    involved = [
        k
        for k, j in enumerate(found.job_ids)
        if j is not None and (per_job[j] > 1 or j in busy or found.pending_before[k] is not None)
    ]
    serial = hold_back([found.candidate(k) for k in involved], locked)
    kept = {c.id: c for c in serial}
    left_out = {found.ids[k] for k in involved} - kept.keys()  # held back
    run: list[int] = []
    due: list[Candidate] = []
    ahead: list[Candidate] = []
    room = len(found.ids) if due_limit is None else due_limit
    for cid, is_due in zip(found.ids, found.due, strict=True):
        if cid in left_out:
            continue
        if is_due:
            if room <= 0:
                continue
            room -= 1
        c = kept.get(cid)
        if c is None:
            run.append(cid)
        elif is_due:
            due.append(c)
        else:
            ahead.append(c)
    decided, settle = decide_overlap(due, active)
    # The serialised due ones past the limit still make their jobs busy for plan_ahead.
    ahead_run = plan_ahead(ahead, [c for c in serial if c.due], active, conditional)
    return run + decided + ahead_run, settle


def bounds(instants: Sequence[datetime]) -> attempts.Within:
    """The earliest and latest of some instants (not empty): a batch write's bounds (the
    claim's, and the worker's writes)."""
    return min(instants), max(instants)


async def attach_specs(
    db: Database,
    conn: Conn,
    rows: Sequence[Claimed],
    known: Container[str],
    received: float | None = None,
) -> list[Claimed]:
    """Claimed occurrences as they arrived (`arrived`), each with the spec document it
    runs unless its hash is known.

    A job whose spec changed between the claim and the fetch (its hash differs now) runs
    the spec whose hash was claimed if the fetch still finds it (on another job of the
    batch), else its current spec, under the current hash. Both are safe: what the attempt
    must keep (timeout, delivery, max attempts) was copied onto the occurrence when it was
    materialised, and the current spec is what the claim would have read had the change
    committed an instant earlier (a spec change never takes back an occurrence already
    due, so it cannot undo this one)."""
    at = time.monotonic() if received is None else received
    by_hash: dict[str, dict[str, Any]] = {}  # hash -> spec document
    by_job: dict[uuid.UUID, tuple[str, dict[str, Any]]] = {}  # job -> (current hash, spec)
    out: list[Claimed] = []
    for round_ in range(2):
        want: dict[str, uuid.UUID] = {}  # one job per hash to fetch
        for r in rows:
            h, job = r.spec_hash, r.job_id
            if (h and h in known) or h in by_hash or job in by_job:
                continue
            # Round 0: one job per hash. Round 1: every job not yet read (its spec changed).
            want.setdefault(h if h and round_ == 0 else str(job), job)
        if not want:
            break
        for s in await claims.specs(db, list(want.values()), conn=conn):
            by_job[s.id] = (s.spec_hash, s.spec)
            if s.spec_hash:
                by_hash[s.spec_hash] = s.spec
    for r in rows:
        h = r.spec_hash
        if h and h in known:
            out.append(arrived(r, at))
        elif h and h in by_hash:
            out.append(arrived(r, at, by_hash[h]))
        else:
            now_hash, doc = by_job[r.job_id]
            out.append(arrived(replace(r, spec_hash=now_hash), at, doc))
    return out


async def promote_waiting(db: Database, conn: Conn, job_ids: list[uuid.UUID]) -> None:
    """After active occurrences of buffered jobs ended: start their oldest waiting one."""
    if not job_ids:
        return
    ids = sorted(set(job_ids))
    await claims.lock_jobs(db, ids, conn=conn)
    promoted = await claims.promote_waiting(db, ids, conn=conn)
    await notify_due(db, conn, [(r.pool, r.run_at) for r in promoted])


async def notify_due(db: Database, conn: Conn, due: list[tuple[str, datetime]]) -> None:
    """One NOTIFY for a whole batch: {pool: earliest run_at (epoch seconds)}."""
    if not due:
        return
    earliest: dict[str, float] = {}
    for pool, run_at in due:
        ts = run_at.timestamp()
        earliest[pool] = min(ts, earliest.get(pool, ts))
    await claims.notify_due(db, json.dumps(earliest), conn=conn)


async def replay_dead(
    db: Database,
    *,
    key: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    include_ambiguous: bool = False,
    expect: int | None = None,
) -> list[dead.Replayed]:
    """Dead occurrences back to pending under the same key (`dead.replay`), waking the
    pools' workers in the same transaction: `cronwell dlq replay` and the dashboard share it.
    With `expect`, a different count is rolled back as dead.CountChanged (confirmed against
    a set that has changed since)."""
    async with db.transaction() as conn:
        rows = await dead.replay(
            db,
            key=key,
            name=name,
            namespace=namespace,
            include_ambiguous=include_ambiguous,
            conn=conn,
        )
        if expect is not None and len(rows) != expect:
            raise dead.CountChanged(expect, len(rows))
        await notify_due(db, conn, [(r.pool, r.run_at) for r in rows])
    return rows


async def succeed(
    db: Database,
    done: list[tuple[int, int]],
    starts: Sequence[datetime | None] | None = None,
    *,
    within: attempts.Within = attempts.ALL_TIME,
) -> set[str]:
    """Fenced completion of a batch of (occurrence id, fence); returns the keys that
    completed. A key missing from the result had a stale fence: it completes nothing
    (invariant 3). `starts`: each attempt's start instant (database clock) when its start
    was not written yet (None: written). `within`: the bounds of their instants."""
    if not done:
        return set()
    async with db.transaction() as conn:
        return await succeed_in(db, conn, done, starts, within=within)


async def succeed_in(
    db: Database,
    conn: Conn,
    done: list[tuple[int, int]],
    starts: Sequence[datetime | None] | None = None,
    *,
    within: attempts.Within = attempts.ALL_TIME,
) -> set[str]:
    """Fenced completion inside the caller's transaction (the worker's batch, or a
    handler's `ctx.transaction()`), promoting the next waiting occurrence of each buffered
    job in the same transaction: every completion path goes through here."""
    ended = await attempts.succeed(
        db, done, starts, buffered=BUFFERED_ORDER, within=within, conn=conn
    )
    await promote_waiting(db, conn, ended.buffered_jobs)
    return set(ended.keys)


async def fail(
    db: Database,
    *,
    occurrence_id: int,
    fence: int,
    next_state: str,
    reason: str,
    error: str,
    delay_seconds: float,
    outcome: str = "failed",
    started: datetime | None = None,
    within: attempts.Within = attempts.ALL_TIME,
) -> str | None:
    """Fenced failure of the attempt holding (`occurrence_id`, `fence`): `next_state`
    pending (retry after the delay) or dead. Returns the new state, or None if the fence
    was stale. `started`: the start instant if not written;
    `within`: bounds of its instant (the occurrence's scheduled_for, twice)."""
    async with db.transaction() as conn:
        row = await attempts.fail(
            db,
            occurrence_id=occurrence_id,
            fence=fence,
            next_state=next_state,
            reason=reason,
            error=error[:4000],
            delay_seconds=delay_seconds,
            outcome=outcome,
            started=started,
            within=within,
            conn=conn,
        )
        if row is None:
            return None
        if row.state == "dead" and row.overlap in BUFFERED:
            await promote_waiting(db, conn, [row.job_id])
    return row.state


async def heartbeat(
    db: Database,
    *,
    worker_id: str,
    running: list[tuple[int, int]],
    lease_seconds: float,
    within: attempts.Within = attempts.ALL_TIME,
) -> set[str]:
    """Extend all running leases (id, fence) in one statement (their instants `within`
    these bounds); returns the keys still held."""
    if not running:
        return set()
    return await attempts.heartbeat(
        db, running, worker_id=worker_id, lease_seconds=lease_seconds, within=within
    )


async def reassert(
    db: Database, *, worker_id: str, held: list[tuple[str, int, int, bool]], lease_seconds: float
) -> dict[str, attempts.Restored]:
    """Restore claims (key, fence, attempt, started) this worker holds that the store
    forgot in a failover; returns the keys restored with their rows (fenced writes for them
    go on by that row's id and instant: it may have been materialised again)."""
    if not held:
        return {}
    return await attempts.reassert(db, held, worker_id=worker_id, lease_seconds=lease_seconds)


async def record_starts(
    db: Database,
    started: list[tuple[int, int]],
    starts: Sequence[datetime | None] | None = None,
    *,
    within: attempts.Within = attempts.ALL_TIME,
) -> set[str]:
    """Record the actual start of attempts claimed ahead (id, fence), at `starts` (None:
    now, before the handler runs); returns the keys still held (one missing lost its lease:
    it must not start)."""
    if not started:
        return set()
    return await attempts.record_starts(db, started, starts, within=within)


async def release(
    db: Database,
    claimed: list[tuple[int, int]],
    *,
    within: attempts.Within = attempts.ALL_TIME,
) -> set[str]:
    """Give back claimed-but-unstarted occurrences (id, fence) (graceful shutdown; their
    instants `within` these bounds); returns the keys released."""
    if not claimed:
        return set()
    return await attempts.release(db, claimed, within=within)


GATE_START, GATE_SKIP, GATE_BACK = "start", "skip", "back"
"""The verdicts of `gate` (ConditionalDecide spells them the same)."""


async def gate(
    db: Database, held: Sequence[Claimed], *, pool: str, over: Sequence[int] = ()
) -> dict[int, str]:
    """Decide conditional claims of `pool` at their instant: skipped when an earlier
    occurrence of the job is still active (Skip's rule, as `decide_overlap` would decide
    it due now), given back when the one just before it is pending and never attempted (it
    is decided first, as `hold_back` would have it), started otherwise (no write: as for any
    occurrence claimed ahead, its worker's judgement of its lease decides). The verdict of
    each but those to skip or give back whose fence no longer held (they must not run
    either).

    No job lock (one per instant was too dear: p99 1.6 s at 10,000 per-second jobs): only
    a claim of the occurrence just before the conditional one, reading the job before the
    instant, decides as if the conditional one were not there (`decide_overlap`), and this
    read, at the instant, sees that occurrence pending (its claim not committed yet: given
    back) or running (skipped); a claim that reads after the instant counts the
    conditional one as active. `over`: occurrences the caller saw succeed, their completion
    not written yet: not active."""
    if not held:
        return {}
    found = await claims.earlier(
        db,
        [(c.id, c.job_id, c.scheduled_for) for c in held],
        pool=pool,
        until=max(c.scheduled_for for c in held),
        over=over,
    )
    verdict = {
        e.id: GATE_SKIP if e.overlapped else GATE_BACK if e.behind else GATE_START for e in found
    }
    stop = [c for c in held if verdict[c.id] != GATE_START]
    if stop:
        kept = await claims.decide_conditional(
            db,
            [(c.id, c.fence, verdict[c.id]) for c in stop],
            within=bounds([c.scheduled_for for c in stop]),
        )
        for c in stop:
            if c.id not in kept:
                del verdict[c.id]
    return verdict
