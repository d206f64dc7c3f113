"""Scheduler replicas: partition leases, materialisation ahead of time; housekeeping
(cronwell.maintenance) runs here too.

Each of P partitions has one owner at a time (a lease row with an epoch). The owner claims
its due jobs with FOR UPDATE SKIP LOCKED, inserts their occurrences ON CONFLICT DO NOTHING
and advances `next_run_at`, all in one transaction per batch, with one NOTIFY per batch.
Ownership is for efficiency; the unique key and the row locks are what make a duplicate
materialisation impossible even when two replicas briefly both think they own a partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import pydantic

from cronwell import cronexpr, dispatch, liveness, maintenance, partitions, schedule
from cronwell.errors import DatabaseError, SpecError
from cronwell.liveness import Liveness
from cronwell.maintenance import announce_durability, process_id, this_process
from cronwell.metrics import Metrics
from cronwell.models import MisfirePolicy, ScheduledJobSpec
from cronwell.plan import near_reach, plan_job, visit_reach
from cronwell.settings import SchedulerSettings
from cronwell.store import claims, gauges, history_partitions, leases, materialise, processes
from cronwell.store.db import Database
from cronwell.store.migrate import check_schema
from cronwell.supervise import Supervisor, repeat, wait_event

log = logging.getLogger(__name__)

MATERIALISATION = "materialisation pass"
"""The materialisation loop's name in liveness (a stalled one stops renewing partitions)."""


class SpecCache:
    """Parsed specs by spec hash, schedules by (spec hash, uid if the cron uses H): a burst
    of 50,000 jobs sharing a few specs parses each spec once, not once per job, and reads
    it once (`unread`, then claims.specs)."""

    def __init__(self, size: int = 200_000):
        self._size = size
        self._specs: OrderedDict[str, ScheduledJobSpec] = OrderedDict()
        self._schedules: OrderedDict[tuple[str, uuid.UUID | None], schedule.JobSchedule] = (
            OrderedDict()
        )

    def unread(self, jobs: Iterable[materialise.DueJob]) -> list[uuid.UUID]:
        """One job for each spec hash not parsed yet (whose document the batch must read);
        the parsed ones are marked recent, so the batch's own parses do not evict them."""
        out: dict[str, uuid.UUID] = {}
        for job in jobs:
            if job.spec_hash in self._specs:
                self._specs.move_to_end(job.spec_hash)
            else:
                out.setdefault(job.spec_hash, job.id)
        return list(out.values())

    def get(
        self, job_id: uuid.UUID, spec_hash: str, documents: Mapping[str, dict[str, Any]]
    ) -> tuple[ScheduledJobSpec, schedule.JobSchedule] | None:
        """The job's parsed spec and schedule; `documents`: the specs read for this batch,
        by hash. None for a hash neither parsed nor read (evicted since `unread`: a batch
        with more new specs than the cache holds): the job waits for the next batch."""
        parsed = self._specs.get(spec_hash)
        if parsed is None:
            document = documents.get(spec_hash)
            if document is None:
                return None
            parsed = _lru(
                self._specs,
                spec_hash,
                self._size,
                lambda: ScheduledJobSpec.model_validate(document),
            )
        hashed = parsed.schedule is not None and cronexpr.uses_hash(parsed.schedule)
        key = (spec_hash, job_id if hashed else None)
        sched = _lru(
            self._schedules, key, self._size, lambda: schedule.JobSchedule.from_spec(job_id, parsed)
        )
        return parsed, sched


def _lru(cache: OrderedDict[Any, Any], key: Any, size: int, make: Any) -> Any:
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
        return hit
    value = cache[key] = make()
    if len(cache) > size:
        cache.popitem(last=False)
    return value


class Scheduler:
    """One scheduler replica."""

    def __init__(
        self,
        db: Database,
        settings: SchedulerSettings,
        *,
        holder: str | None = None,
        metrics: Metrics | None = None,
    ):
        self.db = db
        self.metrics = metrics or Metrics()
        self.settings = settings
        self.holder = holder or process_id("scheduler")
        self.live = Liveness(
            liveness.stall_seconds(settings.partition_lease_seconds, db.deadline_seconds)
        )
        """Its loops' progress: stalled, it renews no partition and /healthz fails."""
        self.owned: dict[int, int] = {}  # partition -> epoch
        self.partitions = 0  # the store's P, read at every balance
        self.pruner = maintenance.Pruner(
            db,
            retention_seconds=settings.retention_seconds,
            batch_rows=settings.prune_batch_rows,
            metrics=self.metrics,
            partition_seconds=settings.history_partition_seconds,
        )
        self.reaper = maintenance.Reaper(
            db,
            batch_size=settings.reap_batch_size,
            interval_seconds=settings.tick_seconds,
            metrics=self.metrics,
        )
        self.specs = SpecCache()
        self.materialised_total = 0
        self.missed_total = 0
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    # -- partition leases -------------------------------------------------------------

    async def _heartbeat(self) -> None:
        await processes.heartbeat(
            self.db,
            this_process(
                self.holder, "scheduler", pool=None, concurrency=None, running=len(self.owned)
            ),
        )

    async def balance(self) -> None:
        """Renew what we own, then acquire or release to hold ceil(P / live schedulers)
        (P read from the store each time: a re-partition is picked up within a lease)."""
        s = self.settings
        self.partitions = await partitions.read(self.db)
        if self.owned:
            rows = await leases.renew(
                self.db, holder=self.holder, owned=self.owned, ttl_seconds=s.partition_lease_seconds
            )
            kept = {r.partition: r.epoch for r in rows}
            lost = set(self.owned) - set(kept)
            if lost:
                self.metrics.partitions_lost.inc(len(lost))
                log.warning(
                    "partition leases lost",
                    extra={"action": "partition_lost", "partitions": sorted(lost)},
                )
            self.owned = kept
        await self._heartbeat()
        await processes.prune(self.db, ttl_seconds=s.partition_lease_seconds)
        live = await processes.live_count(
            self.db, role="scheduler", ttl_seconds=s.partition_lease_seconds
        )
        target = math.ceil(self.partitions / max(1, live))
        if len(self.owned) > target:
            extra = sorted(self.owned)[target:]
            await leases.release(self.db, holder=self.holder, partitions=extra)
            for p in extra:
                del self.owned[p]
        elif len(self.owned) < target:
            rows = await leases.acquire(
                self.db,
                holder=self.holder,
                want=target - len(self.owned),
                ttl_seconds=s.partition_lease_seconds,
            )
            for r in rows:
                self.owned[r.partition] = r.epoch
            self.metrics.partition_takeovers.inc(len(rows))
            if rows:
                log.info(
                    "partitions acquired",
                    extra={
                        "action": "partition_acquired",
                        "partitions": sorted(r.partition for r in rows),
                    },
                )
                self._wake.set()

    async def report_gauges(self) -> None:
        """Global gauges (queue depth, jobs behind, DLQ), reported by the owner of
        partition 0 only, so replicas do not report the same figure twice."""
        m = self.metrics
        m.partitions_owned.set(len(self.owned))
        if 0 not in self.owned:
            return
        for r in await gauges.queue_depth(self.db):
            m.queue_depth.labels(r.pool).set(r.n)
        m.behind.set(await gauges.jobs_behind(self.db))
        m.dlq_size.set(await gauges.dead_count(self.db))

    async def resign(self) -> None:
        """Release every partition so the other replicas take over at once."""
        if self.owned:
            with contextlib.suppress(DatabaseError):  # best effort: leases expire anyway
                await leases.release(self.db, holder=self.holder, partitions=sorted(self.owned))
        with contextlib.suppress(DatabaseError):
            await processes.delete(self.db, self.holder)
        self.owned = {}

    # -- materialisation --------------------------------------------------------------

    async def materialise_once(self, partition: int) -> int:
        """One batch of one owned partition in one transaction; returns jobs processed."""
        epoch = self.owned.get(partition)
        if epoch is None:
            return 0
        s = self.settings
        horizon = timedelta(seconds=s.horizon_seconds)
        visit = timedelta(seconds=visit_seconds(s.horizon_seconds, s.tick_seconds))
        started = time.perf_counter()
        async with self.db.transaction() as conn:
            jobs = await materialise.claim_due(
                self.db,
                holder=self.holder,
                partition=partition,
                epoch=epoch,
                horizon_seconds=visit.total_seconds(),
                limit=s.batch_size,
                conn=conn,
            )
            if not jobs:
                return 0
            now = jobs[0].db_now
            unread = self.specs.unread(jobs)
            documents = (
                {d.spec_hash: d.spec for d in await claims.specs(self.db, unread, conn=conn)}
                if unread
                else {}
            )
            occ = materialise.NewOccurrences()
            adv = materialise.Advances()
            due: list[tuple[str, datetime]] = []
            for job in jobs:
                try:
                    found = self.specs.get(job.id, job.spec_hash, documents)
                except (pydantic.ValidationError, SpecError) as e:
                    # A stored spec this version refuses (written by an older version, or
                    # straight into the database): park the job until its spec changes
                    # rather than fail every batch of its partition.
                    reason = (
                        e.errors()[0]["msg"] if isinstance(e, pydantic.ValidationError) else str(e)
                    )
                    log.error(
                        f"job {job.id}: stored spec is invalid; parked until it changes: {reason}",
                        extra={"action": "spec_invalid", "job": str(job.id)},
                    )
                    adv.ids.append(job.id)
                    adv.next_run_at.append(None)
                    adv.missed.append(0)
                    continue
                if found is None:
                    continue
                spec, sched = found
                deadline = timedelta(
                    seconds=spec.starting_deadline_seconds or s.misfire_threshold_seconds
                )
                end = near_reach(now, job.next_run_at, visit=visit)
                if end is None:
                    end = visit_reach(now, job.id, horizon=horizon, visit=visit)
                plan = plan_job(
                    sched,
                    job.next_run_at,
                    now=now,
                    horizon=end - now,
                    deadline=deadline,
                    policy=MisfirePolicy(spec.misfire_policy),
                    max_catchup=spec.max_catchup,
                    resumed_at=job.resumed_at,
                )
                jitter = schedule.jitter_offset(job.id, spec.jitter_seconds)
                for t in plan.run:
                    catchup = t in plan.catchup
                    run_at = now if catchup else t + jitter
                    _add(
                        occ,
                        job,
                        spec,
                        t,
                        run_at,
                        "pending",
                        None,
                        "catchup" if catchup else "schedule",
                    )
                    due.append((job.pool, run_at))
                for t in plan.missed:
                    suspended = job.resumed_at is not None and t < job.resumed_at
                    _add(
                        occ,
                        job,
                        spec,
                        t,
                        t,
                        "missed",
                        "Suspended"
                        if suspended
                        else f"Misfire: not dispatched within {int(deadline.total_seconds())}s "
                        f"(policy {spec.misfire_policy})",
                        "schedule",
                    )
                adv.ids.append(job.id)
                adv.next_run_at.append(plan.next_run_at)
                adv.missed.append(len(plan.missed))
                if plan.missed:
                    log.warning(
                        "missed instants recorded",
                        extra={
                            "action": "misfire",
                            "job": str(job.id),
                            "missed": len(plan.missed),
                            "policy": spec.misfire_policy,
                        },
                    )
            if occ.keys:
                await materialise.insert_occurrences(self.db, occ, conn=conn)
            await materialise.advance(self.db, adv, conn=conn)
            await dispatch.notify_due(self.db, conn, due)
        self.materialised_total += len(due)
        self.missed_total += sum(adv.missed)
        m = self.metrics
        m.batch_size.observe(len(jobs))
        m.batch_seconds.observe(time.perf_counter() - started)
        m.missed.inc(sum(adv.missed))
        for origin in set(occ.origins):
            n = sum(
                1
                for o, st in zip(occ.origins, occ.states, strict=True)
                if o == origin and st == "pending"
            )
            m.materialised.labels(origin).inc(n)
        return len(jobs)

    async def materialise_until_idle(self) -> int:
        """Batches, round-robin over owned partitions, until none has due jobs left. Each
        committed batch is progress (liveness): a catch-up of many batches on a busy
        machine is not a stall, only a batch that hangs is."""
        total = 0
        busy = sorted(self.owned)
        while busy:
            still = []
            for p in busy:
                n = await self.materialise_once(p)
                self.live.progressed(MATERIALISATION)
                self.live.waiting(MATERIALISATION)
                total += n
                if n >= self.settings.batch_size:
                    still.append(p)
            busy = still
        return total

    # -- loops ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stop(): leases every TTL/3, materialisation and reaping every tick,
        pruning (owner of partition 0) every prune interval; a loop that fails with an
        unexpected error stops the scheduler with that error."""
        await check_schema(self.db)
        self.partitions = await partitions.check(self.db, self.settings.partitions)
        log.info(
            "scheduler started",
            extra={
                "action": "scheduler_start",
                "holder": self.holder,
                "partitions": self.partitions,
            },
        )
        await announce_durability(self.db)
        await self._history_partitions_ahead()
        tasks = Supervisor(f"scheduler {self.holder}")
        tasks.spawn(self._lease_loop(), "leases")
        tasks.spawn(self._work_loop(), "materialise")
        tasks.spawn(self.reaper.run(self.live), "reap")
        tasks.spawn(self._prune_loop(), "prune")
        try:
            await tasks.wait(self._stop.wait())
        finally:
            await tasks.stop()
            await self.resign()
            log.info("scheduler stopped", extra={"action": "scheduler_stop", "holder": self.holder})

    def stop(self) -> None:
        self._stop.set()

    async def _history_partitions_ahead(self) -> None:
        """Create the coming days' history partitions once at start (the pruner keeps them
        ahead afterwards), so a day never lacks its partition; a failure is only a warning."""
        try:
            n = await history_partitions.ensure_ahead(
                self.db, partition_seconds=self.settings.history_partition_seconds
            )
        except DatabaseError as e:
            log.warning(f"could not create the coming history partitions: {e}")
            return
        self.metrics.history_partitions.labels("created").inc(n)

    async def _lease_loop(self) -> None:
        interval = self.settings.partition_lease_seconds / 3

        async def step() -> None:
            stalled = self.live.stalled(among=(MATERIALISATION,))
            if stalled:
                # Liveness means progress: a replica whose materialisation is stuck gives
                # its partitions up (by not renewing them), so another one materialises.
                if self.owned:
                    log.error(
                        "loops stalled; no longer renewing partition leases",
                        extra={"action": "partition_stalled", "loops": stalled},
                    )
                self.owned = {}
                return
            try:
                await self.balance()
                await self.report_gauges()
            except Exception:
                # The database may be down: own nothing until it is back (another
                # replica may take our partitions over meanwhile).
                if self.owned:
                    log.warning(
                        "lease renewal failed; dropping partitions",
                        extra={"action": "partition_renew_failed"},
                    )
                self.owned = {}
                raise

        await repeat("partition leases", step, interval_seconds=interval, live=self.live)

    async def _work_loop(self) -> None:
        async def step() -> float:
            await self.materialise_until_idle()
            self._wake.clear()
            await wait_event(self._wake, self.settings.tick_seconds)
            return 0.0

        tick = self.settings.tick_seconds
        await repeat(MATERIALISATION, step, interval_seconds=tick, live=self.live)

    async def _prune_loop(self) -> None:
        async def step() -> None:
            if 0 in self.owned:  # one pruner at a time: the owner of partition 0
                await self.pruner.prune_once()

        await repeat(
            "prune pass",
            step,
            interval_seconds=self.settings.prune_interval_seconds,
            live=self.live,
        )


def visit_seconds(horizon: float, tick: float) -> float:
    """How near its next instant brings a job into a materialisation batch, which then
    materialises it to between this and the horizon (plan.visit_reach): half the horizon,
    so a job with an instant every second is locked, read and updated once per half
    horizon, not every second (its row's update is never HOT: next_run_at is indexed; and
    the workers' overlap locks on it wait for the batch that holds it). At least two ticks
    (a pass runs once a tick), so every instant is still materialised a tick ahead; never
    beyond the horizon, so a pause still leaves at most a horizon of occurrences to run."""
    return max(horizon / 2, min(horizon, 2 * tick))


def _add(
    occ: materialise.NewOccurrences,
    job: materialise.DueJob,
    spec: ScheduledJobSpec,
    t: datetime,
    run_at: datetime,
    state: str,
    reason: str | None,
    origin: str,
) -> None:
    occ.keys.append(schedule.occurrence_key(job.id, t))
    occ.job_ids.append(job.id)
    occ.pools.append(job.pool)
    occ.scheduled_for.append(t)
    occ.run_at.append(run_at)
    occ.states.append(state)
    occ.reasons.append(reason)
    occ.origins.append(origin)
    occ.overlaps.append(spec.concurrency_policy)
    occ.deliveries.append(spec.delivery)
    occ.max_attempts.append(spec.retry.max_attempts)
    occ.timeouts.append(spec.timeout_seconds)
