"""Housekeeping, run by the schedulers (River's job_rescuer and job_cleaner are the model).

- The **process registry**: every scheduler and worker heartbeats its `this_process` entry;
  schedulers balance partitions on the live count and forget long-silent processes.

- The **reaper** (every scheduler, every tick): expired leases back to pending or dead,
  and waiting occurrences left with nothing ahead of them promoted.
- The **pruner** (the owner of partition 0 only, every `prune_interval_seconds`): each
  job's history limits (`successfulJobsHistoryLimit` for succeeded occurrences,
  `failedJobsHistoryLimit` for each other final state), and the store-wide retention
  (finished occurrences of deleted and one-shot jobs, tombstoned jobs, drained outbox
  messages, status change rows and the pre-scaler's history older than
  `retention_seconds`). On a partitioned history (store/history_partitions.py) it also
  keeps the partitions of the next two days created and drops whole partitions whose
  instants are all older than the retention, never one still holding an unfinished row.

Every row delete is a bounded batch (`DELETE … WHERE id IN (SELECT … LIMIT n)`) in its own
short transaction, touching only finished rows, which neither the claim path nor the
materialiser ever lock: pruning holds no long lock and never waits on the hot path.
Counters in status are totals kept per job in cronwell_job_counters (migration 0003), so
pruning history never makes them go down.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn

from cronwell import dispatch
from cronwell.errors import DatabaseError
from cronwell.liveness import Liveness
from cronwell.metrics import Metrics
from cronwell.store import attempts, claims, clock, fences, history, history_partitions, prescales
from cronwell.store.attempts import Reaped
from cronwell.store.db import Database
from cronwell.store.processes import ProcessEntry
from cronwell.supervise import repeat

log = logging.getLogger(__name__)

_ZERO = uuid.UUID(int=0)


def process_id(role: str) -> str:
    """A registry id unique across restarts: role, host, pid and a random suffix."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def announce_durability(db: Database) -> None:
    """One startup line saying whether commits wait for a synchronous standby, so an
    operator knows what a failover can lose (docs/deploy.md, "Failover")."""
    try:
        d = await fences.durability(db)
        e = await fences.epoch(db)
    except DatabaseError as err:
        log.warning(f"cannot read the database's replication settings: {err}")
        return
    log.info(
        f"database commits are {d.describe()}",
        extra={
            "action": "db_durability",
            "synchronous": d.synchronous,
            "standbys": d.standbys,
            "fence_generation": e.generation if e else None,
            "timeline": e.timeline if e else None,
        },
    )


async def announce_lock_table(db: Database, claim_batch_size: int) -> None:
    """A startup warning when one claim can take more advisory locks (one per serialised
    job among its candidates) than this process's connections bring to PostgreSQL's shared
    lock table: the fleet could fill it, and a claim that finds it full fails with "out of
    shared memory" (retried, but a burst's claims with it). docs/architecture.md, "The
    job's lock"."""
    try:
        per_connection = await claims.lock_slots_per_connection(db)
    except DatabaseError as err:
        log.warning(f"cannot read the database's lock table size: {err}")
        return
    connections = db.pool.max_size
    if claim_batch_size <= per_connection * connections:
        return
    log.warning(
        f"a claim of up to {claim_batch_size} occurrences (CRONWELL_CLAIM_BATCH_SIZE) can "
        f"hold that many job locks, more than the {per_connection * connections} slots this "
        f"worker's {connections} connections bring to PostgreSQL's lock table "
        f"(max_locks_per_transaction = {per_connection}): raise max_locks_per_transaction "
        f"to at least {-(-claim_batch_size // connections)} on the server, or lower "
        "CRONWELL_CLAIM_BATCH_SIZE; else a claim that finds the table full fails with "
        "'out of shared memory' and is retried",
        extra={
            "action": "lock_table_small",
            "claim_batch_size": claim_batch_size,
            "max_locks_per_transaction": per_connection,
            "connections": connections,
        },
    )


def this_process(
    id: str, role: str, *, pool: str | None, concurrency: int | None, running: int
) -> ProcessEntry:
    """This process's registry entry, with its host, pid and cronwell version."""
    from cronwell import __version__

    return ProcessEntry(
        id=id,
        role=role,
        pool=pool,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        concurrency=concurrency,
        running=running,
    )


async def reap(db: Database, *, limit: int) -> list[Reaped]:
    """Expired leases back to pending (AtLeastOnce) or dead (AtMostOnce / exhausted; a
    death counts toward suspendAfterFailures like any other); and waiting occurrences left
    with nothing active ahead of them start."""
    async with db.transaction() as conn:
        rows = await attempts.reap_leases(db, limit=limit, conn=conn)
        stranded = await claims.stranded(db, limit=limit, conn=conn)
        await dispatch.promote_waiting(
            db,
            conn,
            [r.job_id for r in rows if r.state == "dead" and r.overlap in dispatch.BUFFERED]
            + stranded,
        )
        await dispatch.notify_due(
            db, conn, [(r.pool, r.run_at) for r in rows if r.state == "pending"]
        )
    return rows


class Reaper:
    """Reaps expired leases and promotes stranded waiting occurrences, every tick (every
    scheduler runs one: the statements skip rows another reaper holds)."""

    def __init__(self, db: Database, *, batch_size: int, interval_seconds: float, metrics: Metrics):
        self.db = db
        self.batch_size = batch_size
        self.interval_seconds = interval_seconds
        self.metrics = metrics

    async def reap_once(self) -> int:
        """One batch; a death counts in the outcome metric like a worker's dead letter.
        Returns the leases reaped."""
        rows = await reap(self.db, limit=self.batch_size)
        for r in rows:
            self.metrics.leases_reaped.labels(r.state).inc()
            if r.state == "dead":
                self.metrics.outcomes.labels(r.pool, "dead").inc()
        return len(rows)

    async def run(self, live: Liveness | None = None) -> NoReturn:
        """Reap every `interval_seconds` until cancelled."""

        async def step() -> None:
            await self.reap_once()

        await repeat("reap pass", step, interval_seconds=self.interval_seconds, live=live)


@dataclass
class PruneResult:
    """Rows one prune pass deleted."""

    history: int = 0
    """Occurrences beyond their job's history limits."""
    retention: int = 0
    """Occurrences older than the retention: whole partitions dropped (their estimated
    rows), or on an unpartitioned store those of deleted and one-shot jobs, row by row."""
    jobs: int = 0
    """Tombstoned jobs forgotten."""
    other: int = 0
    """Status change rows, published outbox messages and pre-scales older than the
    retention."""


class Pruner:
    """History limits and retention, in small batches."""

    def __init__(
        self,
        db: Database,
        *,
        retention_seconds: float,
        batch_rows: int = 1000,
        batch_jobs: int = 200,
        metrics: Metrics | None = None,
        partition_seconds: int = history_partitions.DAY,
    ):
        self.db = db
        self.partition_seconds = partition_seconds
        self.retention_seconds = retention_seconds
        self.batch_rows = batch_rows
        self.batch_jobs = batch_jobs
        self.metrics = metrics

    async def prune_once(self) -> PruneResult:
        """One full pass: every job's history limits, then the store-wide retention."""
        res = PruneResult()
        after = _ZERO
        # The pass ranks the instants up to now: a row finished ahead of its instant is
        # ranked by a later pass (and the partitions created ahead stay out of its plans).
        until = await clock.now(self.db)
        while True:
            row = await history.limit_prune(
                self.db, after=after, jobs=self.batch_jobs, limit=self.batch_rows, until=until
            )
            if row.last_job is None:
                break
            res.history += row.deleted
            if row.deleted < self.batch_rows:
                after = row.last_job  # this range is within its limits: next range
        res.retention = await self._history_retention()
        res.jobs = await self._drain(history.tombstones_purge)
        res.other = await self._drain(history.status_changes_prune)
        res.other += await self._drain(history.outbox_published_prune)
        res.other += await self._drain(prescales.prune)
        if self.metrics is not None:
            self.metrics.pruned.labels("history").inc(res.history)
            self.metrics.pruned.labels("retention").inc(res.retention)
        if res.history or res.retention or res.jobs or res.other:
            log.info(
                "history pruned",
                extra={
                    "action": "prune",
                    "history": res.history,
                    "retention": res.retention,
                    "jobs": res.jobs,
                    "other": res.other,
                },
            )
        return res

    async def _history_retention(self) -> int:
        """The old runs of deleted and one-shot jobs row by row (by finish time: a deleted
        job's tombstone goes as soon as its history does), then on a partitioned store the
        coming partitions and the drop of the whole partitions past the retention."""
        rows = await self._drain(history.retention_prune)
        if not (await history_partitions.shape(self.db)).partitioned:
            return rows
        created = await history_partitions.ensure_ahead(
            self.db, partition_seconds=self.partition_seconds
        )
        dropped = await history_partitions.drop_expired(
            self.db, retention_seconds=self.retention_seconds
        )
        if self.metrics is not None:
            self.metrics.history_partitions.labels("created").inc(created)
            self.metrics.history_partitions.labels("dropped").inc(dropped.partitions)
            self.metrics.history_partitions.labels("postponed").inc(dropped.postponed)
        return rows + dropped.rows

    async def _drain(self, prune: Callable[..., Awaitable[int]]) -> int:
        """Run one of the retention prunes (`history`'s, `prescales.prune`) until a batch
        comes back short."""
        total = 0
        while True:
            n = await prune(
                self.db, retention_seconds=self.retention_seconds, limit=self.batch_rows
            )
            total += n
            if n < self.batch_rows:
                return total
