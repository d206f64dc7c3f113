"""The worker: claims due occurrences of one pool, runs them under leases renewed by
heartbeats, completes them conditionally on their fence, retries with backoff, and
dead-letters after the last attempt.

A heartbeat that renews nothing means the lease was taken over: the attempt is cancelled at
once and can never be recorded as a success (its fence is stale, invariant 3). A worker
that cannot renew at all (database unreachable, process paused) fences itself: an attempt
whose lease may have run out, judged by the local monotonic clock from the moment the last
successful renewal was *sent*, is cancelled before another worker can be handed the
occurrence.

Claim ahead: a worker claims occurrences before their instant and starts each at it by a
local monotonic timer aligned to the database clock at the claim. What is due within
`claim_ahead_seconds` is always claimed ahead; a coming burst is claimed from early enough
that this worker's share of it (the burst / the pool's live workers, plus 5 %) is
claimed before its instant at the claim rate it measures, at most `claim_ahead_max_seconds`
early and `claim_ahead_max` occurrences at once. A burst's size is the most any live worker
of the pool has seen due at its instant (each publishes its view in the registry). A worker
that holds more than its share when the pool's live count rises gives the surplus back,
unstarted, for the newcomer to claim ahead. A claimed-ahead occurrence waiting for its
instant holds no handler slot: it takes one at its instant (first come, first served, so
in instant order). The wait is part of the attempt's lease (heartbeats renew it; the
watchdog fences it). Stopping gives back the ones not started yet, in one statement.

Starting at the instant (issue 30). An AtLeastOnce attempt starts at its instant with no
database round trip in front of it: only if the worker judges its lease held (the
watchdog's judgement: last renewal sent + lease, less the self-fencing margin); otherwise
it is given back unstarted. Its start instant, on the database clock (`run_at` + the time
since the aligned timer fired), is written with its ending (the completion or the
failure), or, for a handler still running `START_RECORD_AFTER_SECONDS` later, by a
low-priority batched start record. A worker that dies first leaves started_at NULL; the
reaper then counts the attempt as one that may have run if its instant came before its
lease expired (the worker starts only while its lease is held) and as never started
otherwise. An AtMostOnce attempt and a `job` target keep the older rule: the start is
written before the target runs, so started_at NULL means it never ran (never an ambiguous
AtMostOnce attempt, and no Job created for an attempt the reaper gives back unconsumed).

Starts before completions: while an attempt is due to start within `START_GUARD_SECONDS`
or is starting (its instant passed, not started yet), completion writes (and late start
records) wait, at most `completion_hold_seconds` (1 s), then go in one larger batch. Start
writes (AtMostOnce, `job`) never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
import pydantic

from cronwell import dispatch, liveness, tenancy
from cronwell.dispatch import Claimed
from cronwell.egress import (
    ALLOW_ANNOTATION,
    DENY_ANNOTATION,
    EgressDenied,
    EgressPolicy,
    NamespaceEgress,
    Rules,
)
from cronwell.errors import EXPECTED_ERRORS, DatabaseError, LeaseLost
from cronwell.liveness import Liveness
from cronwell.maintenance import (
    announce_durability,
    announce_lock_table,
    process_id,
    this_process,
)
from cronwell.metrics import Metrics
from cronwell.models import Delivery, RetryPolicy, ScheduledJobSpec
from cronwell.schedule import key_job
from cronwell.sdk import Context
from cronwell.secretbox import SecretBox, SecretsKeyError
from cronwell.settings import EgressSettings, SecretsSettings, WorkerSettings
from cronwell.store import claims, job_secrets, notify, processes
from cronwell.store import policies as store_policies
from cronwell.store.attempts import Restored
from cronwell.store.db import Database
from cronwell.supervise import RETRY_MAX_SECONDS, Backoff, Supervisor, wait_event
from cronwell_worker import egress, targets
from cronwell_worker.kubejob import KubeJobs

log = logging.getLogger("cronwell.worker")

RECORDING_WRITERS = ("start", "completion")
"""Writers whose stall withholds lease renewal: the attempts they record could not be
recorded. A stalled claim only fails the liveness probe: withholding the leases would
re-run attempts that can still be recorded."""

# Why the runtime cancelled an attempt.
ABORT_LEASE_LOST = "lease_lost"  # a heartbeat renewed nothing: someone else owns it now
ABORT_SELF_FENCE = "self_fenced"  # no renewal within the lease: it may be someone else's
ABORT_SHUTDOWN = "shutdown"  # forced shutdown (second signal, or grace period over)
ABORT_RELEASE = "release"  # claimed ahead, not started, and the worker is stopping
ABORT_GIVE_BACK = "give_back"  # claimed ahead, not started, over the share when a peer joined
UNSTARTED_ABORTS = (ABORT_SHUTDOWN, ABORT_RELEASE, ABORT_GIVE_BACK)
"""Aborts of a claimed-ahead attempt before its start that give it back unstarted."""


@dataclass
class Outcome:
    """What happened to one attempt (for the live view, tests and metrics)."""

    claimed: Claimed
    result: str  # succeeded | retry | dead | lease_lost | stale | cancelled | released | skipped
    error: str | None = None
    finished_monotonic: float = field(default_factory=time.monotonic)
    start_lag: float | None = None
    """Seconds from the (jittered) instant, run_at, to the start; None: never started."""


def backoff_seconds(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: base * factor^(attempt-1), capped, times [0.5, 1)."""
    base = min(
        policy.max_delay_seconds,
        policy.initial_delay_seconds * policy.factor ** max(0, attempt - 1),
    )
    return base * (0.5 + 0.5 * (rng or random).random())


SPEC_CACHE_SIZE = 10_000
"""Parsed specs a worker keeps (by hash, least recently used out)."""
BUSY_RETRY_SECONDS = 0.05
"""The least wait before claiming again when a claim took nothing although something is
due: another claimer holds it (SKIP LOCKED), possibly for long (a paused process)."""
CLAIM_RATE_GUESS = 2_000.0
"""Occurrences per second a worker's claims are assumed to achieve before it measured any
(low: a burst claimed too early costs nothing, too late costs its start lag)."""
CLAIM_RATE_SAFETY = 2.0
"""A burst is planned at the measured claim rate divided by this: its claims compete with the
handlers and bookkeeping of what came before it, and a claim that starts too early costs
only memory (bounded by claim_ahead_max), one too late costs start lag (at 1x, 5-20 % of a
50k burst was left to its instant on 2 cores: p99 3-5 s instead of 0.75)."""
CLAIM_RATE_SMOOTHING = 0.3
"""Weight of each new claim's rate in the measured one (an exponential moving average)."""
REGISTRY_TTL_SECONDS = 15.0
"""A worker whose registry heartbeat (every 5 s) is older is not counted in its pool."""
LOOK_MIN_SECONDS = 0.1
"""Least time between two looks at what is coming: every handler that returns wakes the
claim loop, and a burst's thousands of wakes must not become thousands of queries."""
LOOK_NEAR_SECONDS = 1.0
"""A look reads the instants within the claim-ahead window plus this first: under a steady
stream (per-second jobs) its plan stops there, and reading the whole widest window (30 s,
up to claim_ahead_max rows per worker) cost 100 ms a look at 5,000 per-second jobs."""
LOOK_REACH_FACTOR = 4.0
"""Each further window a look reads reaches this many times farther, up to the widest."""
HELD_LOOK_SECONDS = 1.0
"""Longest sleep of the claim loop while it holds claims ahead: it then counts the pool's
live workers again (Worker._recount), and looks and gives back its surplus if one joined."""
GIVE_BACK_LEAD_SECONDS = 1.0
"""A surplus is given back only from instants at least this far ahead: a nearer one would
be claimed by a peer only once due, later than it starts here."""
GIVE_BACK_WINDOW_SECONDS = 5.0
"""How long after the pool's live count rose a worker's looks give back its surplus. Only
then: in a steady stream a worker may hold more than its share of one instant and less of
the next (its quota is the window's), and giving that back would only churn claims."""
PUBLISHED_INSTANTS = 64
"""Most coming instants a worker publishes burst sizes for (the earliest)."""
PUBLISH_MIN_SECONDS = 1.0
"""Least time between two writes of a worker's burst view: under a per-second stream the
view changes at every look (up to ten a second), and a joiner needs a burst's size, which
only grows, not every count in between."""


@dataclass(frozen=True)
class ClaimPlan:
    """What to claim now: occurrences due within `window` seconds, at most `quota` of them
    ahead of their instant; the next instant beyond the window wants its claim to start in
    `next_in` seconds (None: nothing beyond it is known)."""

    window: float
    quota: int
    next_in: float | None


def share_of(n: int, workers: int, slack: int) -> int:
    """One worker's share of `n` occurrences due at one instant: n / workers, plus a slack
    of 5 % of that (at least 1, at most `slack`), at most n."""
    base = math.ceil(n / max(1, workers))
    return min(n, base + min(slack, max(1, base // 20)))


def plan_claims(
    coming: list[tuple[float, int]],
    *,
    workers: int,
    rate: float,
    min_window: float,
    max_window: float,
    slack: int,
    margin: float,
    pending: Sequence[int] | None = None,
) -> ClaimPlan:
    """Size the claim ahead from the coming instants, (seconds until it, occurrences due at
    it) each, earliest first: each instant's share (its count / the pool's workers, plus a
    slack of 5 % of that, at least 1 and at most `slack`) must be claimed before it, after
    the shares of the instants before it, at `rate` per second, `margin` seconds early.
    Why: a fixed window claims a large burst mostly after its instant; a window as wide as
    the scheduler's horizon holds memory for nothing. The slack is proportional: a fixed
    one (a claim batch, then 256) let one worker claim all of a 100-occurrence burst of 10 s
    handlers, 36 of them waiting for its 64 slots while another worker idled.

    `pending`: how many are left to claim at each instant. An instant with none left takes
    no claiming time from those after it (one being claimed still takes its whole share:
    a burst is claimed from the front, not just in time). Counting the claimed ones too, a
    steady stream's plan did not settle within the near window when its share of a second
    took over a second to claim at the planning rate: looks read on towards the widest
    window, counting the rows the scheduler's horizon held, and the claim ahead widened
    with the plan (5,000 per-second jobs at the default 30 s horizon, two runs each: looks
    of 21-24 ms, workers 0.123-0.127 and PostgreSQL 0.192-0.196 ms of CPU per occurrence,
    p99 0.48-0.52 s; with this, 12-15 ms, 0.093-0.098, 0.166-0.176 and 0.24 s)."""
    window, quota, cum = min_window, 0, 0
    for i, (until, n) in enumerate(coming):
        share = share_of(n, workers, slack)
        if pending is None or pending[i] > 0:
            cum += share
        lead = min(max_window, cum / rate + margin)
        if until > min_window and until > lead:
            return ClaimPlan(window, quota, until - lead)
        window = max(window, until)
        quota += share
    return ClaimPlan(window, quota, None)


@dataclass
class _Coming:
    """The last look at what is coming for the pool (claims.coming)."""

    instants: list[tuple[datetime, int]]
    """(instant, occurrences due then: the most seen pending plus held here), earliest
    first."""
    pending: dict[datetime, int]
    """Pending occurrences at each instant (what is left to claim)."""
    db_now: datetime
    at: float
    """The monotonic instant the look returned (db_now, give or take its round trip)."""
    workers: int

    def until(self, within: datetime | None = None) -> list[tuple[float, int]]:
        """(seconds from now until each instant, its count); `within`: up to that one."""
        base = time.monotonic() - self.at
        return [
            ((t - self.db_now).total_seconds() - base, n)
            for t, n in self.instants
            if within is None or t <= within
        ]

    def db_clock(self) -> datetime:
        """The database clock now, by this look's reading (give or take its round trip)."""
        return self.db_now + timedelta(seconds=time.monotonic() - self.at)

    def left(self, within: datetime | None = None) -> list[int]:
        """How many are left to claim at each of `until`'s instants."""
        return [self.pending.get(t, 0) for t, _ in self.instants if within is None or t <= within]

    def first_pending(self) -> float | None:
        """Seconds from now until the earliest instant with something left to claim."""
        if not self.pending:
            return None
        base = time.monotonic() - self.at
        return (min(self.pending) - self.db_now).total_seconds() - base


UNTIL_SLACK_SECONDS = 120.0
"""How far a claim's `until` reaches past the widest claim window: room for the error of
the database clock's reading and for an occurrence claimed ahead by a worker with a wider
window, then put back early (a waiting one promoted before its instant). Beyond it, an
occurrence is claimed once `until` reaches it: still before its instant."""

START_GUARD_SECONDS = 0.05
"""Completion writes wait while an attempt is due to start within this (or is starting)."""
HOLD_RECHECK_SECONDS = 0.01
"""While completions are held, how often the writer looks again (a start write wakes it)."""
START_RECORD_AFTER_SECONDS = 1.0
"""An AtLeastOnce attempt started without a write still running this long after its start
gets its start recorded (low priority, batched): the dashboard shows it started."""

_Queued = tuple[str, int, int, datetime, datetime | None, "asyncio.Future[bool] | _Running | None"]
"""A queued fenced write: (key, occurrence id, fence, its instant (scheduled_for), start
instant or None, who learns whether the key was still held: the future an attempt awaits
(a start written before its target runs), the attempt itself (its completion: settled by
Worker._completed, the attempt's task having ended when it queued it), or None (a late
start record, which nothing waits for))."""
_Write = Callable[..., Awaitable[set[str]]]
"""A fenced batch write: (db, [(id, fence)], [start or None], within=(lo, hi) instants)."""


def _attempt_fields(c: Claimed) -> dict[str, Any]:
    """An attempt's log fields: its job, key, attempt and fence."""
    return {"job": f"{c.namespace}/{c.name}", "key": c.key, "attempt": c.attempt, "fence": c.fence}


def self_fence_margin(lease_seconds: float) -> float:
    """How long before the local lease deadline an unrenewed attempt is abandoned."""
    return min(1.0, lease_seconds * 0.1)


@dataclass(eq=False)  # one attempt is itself only: hashed by identity (Timeouts' sets)
class _Running:
    claimed: Claimed
    ctx: Context
    deadline: float
    """Monotonic instant by which the lease has surely ended unless renewed since: the
    send time of the claim or last successful heartbeat, plus the lease."""
    spec: ScheduledJobSpec | None = None
    spec_error: Exception | None = None
    """Why the stored spec could not be parsed (the attempt is then dead-lettered)."""
    task: asyncio.Task[None] | None = None
    completing: bool = False
    """The target returned; only the fenced completion is left (never aborted)."""
    abort: str | None = None
    timed_out: bool = False
    """Its timeout came while its target ran (Timeouts): cancelled for that alone."""
    start_lag: float | None = None
    """Set when the attempt starts: seconds from its instant (run_at) to its start."""
    admitted: tuple[EgressPolicy, dict[str, str] | None] | Exception | None = None
    """Claimed ahead: the pool and egress policies and Secret values, read while waiting
    for the instant (or why not); None: read at the start."""
    slot: bool = False
    """It holds a handler slot (from its start until its target is over); a claimed-ahead
    attempt waiting for its instant holds none."""
    waiting: bool = False
    """Claimed ahead and not holding a slot yet (counted in Worker._waiting and _held)."""
    starting: bool = False
    """Claimed ahead and not started yet (in Worker._upcoming): completion writes wait for
    it near its instant, and while it waits for a slot after it."""
    start_db: datetime | None = None
    """Started without a write: its start on the database clock, written with its ending."""
    instant: datetime | None = None
    """Its row's instant when a re-assertion found the row materialised again at another
    (a trigger's is its insertion time); None: the claim's."""
    queued: bool = False
    """Its completion is queued, not written: it stays in `running` (its lease renewed)
    after its task ended, until Worker._completed settles it."""

    @property
    def held(self) -> tuple[str, int, int, datetime]:
        """(key, row id, fence, instant) for its fenced writes: the id is the context's, which
        a re-assertion moves (with the instant) when a failover lost the row and it was
        materialised again."""
        oid = self.ctx.occurrence_id
        c = self.claimed
        at = c.scheduled_for if self.instant is None else self.instant
        return c.key, c.id if oid is None else oid, c.fence, at


def _woke_early(due: float, callback: Callable[[Any], None], arg: Any) -> bool:
    """Whether a timer meant for monotonic `due` fired before it: then `callback(arg)` is
    armed once more, for what is left. A loop may wake a timer early (uvloop's timers count
    whole milliseconds; asyncio's by up to its clock resolution, seen: 56 us)."""
    if (left := due - time.monotonic()) <= 0:
        return False
    asyncio.get_running_loop().call_later(left, callback, arg)
    return True


class Instants:
    """Futures done at monotonic instants: one event-loop timer per instant, however many
    attempts wait for it (a claim's attempts of one instant share it exactly: one arrival,
    one `run_at`). A timer per attempt was ~5 us of a worker's CPU per occurrence on uvloop
    (~10 on asyncio's loop). Each waiter has its own future: cancelling one cancels only it."""

    def __init__(self) -> None:
        self._waiters: dict[float, list[asyncio.Future[None]]] = {}

    def at(self, due: float) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        waiters = self._waiters.get(due)
        if waiters is None:
            waiters = self._waiters[due] = []
            loop.call_at(due, self._came, due)
        fut: asyncio.Future[None] = loop.create_future()
        waiters.append(fut)
        return fut

    def _came(self, due: float) -> None:
        """The timer of `due` fired: its waiters go, never before `due`."""
        if _woke_early(due, self._came, due):
            return
        for fut in self._waiters.pop(due, ()):
            if not fut.done():
                fut.set_result(None)


TIMEOUT_BUCKET_SECONDS = 0.05
"""Attempt timeouts share one event-loop timer per this much of the clock (Timeouts)."""


class Timeouts:
    """Attempt timeouts: one event-loop timer per TIMEOUT_BUCKET_SECONDS of deadlines,
    however many attempts' timeouts end in it, so a timeout fires at most that late and
    never early. An `asyncio.timeout` per attempt armed and cancelled a timer each: 5.5 us
    of a worker's CPU per occurrence on uvloop (py-spy: ~6 % of a worker under sustained
    load), where adding to a bucket and discarding from it cost about 0.3."""

    def __init__(self, expire: Callable[[_Running], None]) -> None:
        self._buckets: dict[int, set[_Running]] = {}
        self._expire = expire

    def arm(self, r: _Running, seconds: float) -> int:
        """`r` expires `seconds` from now unless disarmed; returns its bucket."""
        bucket = math.ceil((time.monotonic() + seconds) / TIMEOUT_BUCKET_SECONDS)
        armed = self._buckets.get(bucket)
        if armed is None:
            armed = self._buckets[bucket] = set()
            asyncio.get_running_loop().call_at(bucket * TIMEOUT_BUCKET_SECONDS, self._fire, bucket)
        armed.add(r)
        return bucket

    def disarm(self, bucket: int, r: _Running) -> None:
        armed = self._buckets.get(bucket)
        if armed is not None:
            armed.discard(r)

    def _fire(self, bucket: int) -> None:
        """The bucket's timer fired: its attempts expire, never before the bucket's end."""
        if _woke_early(bucket * TIMEOUT_BUCKET_SECONDS, self._fire, bucket):
            return
        for r in self._buckets.pop(bucket, ()):
            self._expire(r)


class Worker:
    def __init__(
        self,
        db: Database,
        settings: WorkerSettings,
        *,
        worker_id: str | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        metrics: Metrics | None = None,
        egress: EgressPolicy | None = None,
        secrets: SecretBox | None = None,
        kube: KubeJobs | None = None,
    ):
        """`egress` is the cluster's policy (default: CRONWELL_EGRESS_*); `secrets` the key
        of Secret-backed header values (default: CRONWELL_SECRETS_KEY[_FILE], if set);
        `kube` runs `job` targets (None: no cluster, as in standalone mode; refused)."""
        self.db = db
        self.kube = kube
        self.egress = egress if egress is not None else EgressSettings().policy()
        if secrets is None:
            ss = SecretsSettings()
            secrets = SecretBox.from_settings(ss.secrets_key, ss.secrets_key_file)
        self.secrets = secrets
        self._tenancy = _Tenancy(db, settings)
        static = tenancy.static(settings.pool, settings.pool_namespaces, settings.pool_handlers)
        restricts = tenancy.ANY not in static.namespaces or static.handlers is not None
        self._static_pool = [static] if restricts else None
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.live = Liveness(liveness.stall_seconds(settings.lease_seconds, db.deadline_seconds))
        """Its writers' progress: one stalled for a lease, it renews no lease, registers
        no more and /healthz fails (liveness means progress)."""
        self.id = worker_id or process_id("worker")
        self.on_outcome = on_outcome
        self.running: dict[str, _Running] = {}
        self._writing: list[list[str]] = []
        """The keys of each batch statement now executing: the heartbeat leaves their rows
        alone. A list per statement, not a Counter of keys: subtracting a 25,000-key batch
        from a Counter was 4 % of a worker's CPU after a 50,000 burst's instant."""
        self._beat_done = asyncio.Event()
        self._beat_done.set()
        """Clear while a heartbeat statement executes: a batch write waits for it to end.
        Both lock several of this worker's rows, each in its own plan's order (over
        partitions not id order), so one must not start while the other runs: a deadlock."""
        self._handlers = 0  # handler slots taken: attempts whose target has not returned yet
        # No running attempt's lease deadline is earlier (deadlines only move later, a new
        # attempt lowers it): the watchdog reads no attempt before it comes near.
        self._earliest_deadline = math.inf
        self._waiting = 0  # claimed ahead, waiting for their instant or a slot (no slot)
        self._slot_queue: deque[asyncio.Future[None]] = deque()  # due, waiting for a slot
        self._unstarted: list[Claimed] = []  # claimed ahead, stopped before their start
        self._claim_rate = CLAIM_RATE_GUESS  # occurrences per second, measured
        self._turn = dispatch.ClaimTurn()  # the wait for the pool's turn to claim
        self._coming: _Coming | None = None
        self._workers = 1  # the pool's live workers at the last look that counted them
        self._seen: dict[datetime, int] = {}  # instant -> most occurrences seen due at it
        self._published: dict[datetime, int] = {}  # the view of _seen last written
        self._published_at = -math.inf  # monotonic: when it was written
        self._give_back_until = 0.0  # monotonic: looks give back a surplus until then
        self._held: dict[datetime, int] = {}  # instant -> claimed ahead here, not started
        self._specs: OrderedDict[str, ScheduledJobSpec] = OrderedDict()  # by spec hash
        self._m = _PoolMetrics(self.metrics, settings.pool)
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # Queued fenced writes (see _Queued: who learns whether the key was still held).
        self._done: list[_Queued] = []  # completions
        self._completing: list[_Queued] = []  # the completions being written
        self._starts: list[_Queued] = []  # starts a target waits on (AtMostOnce, job)
        self._late: list[_Queued] = []  # starts of long handlers started without a write
        self._held_since: float | None = None  # completions held since (starts first)
        self._queued = 0  # attempts whose task ended with their completion queued, unwritten
        self._all_written = asyncio.Event()  # set while none is (_settle waits for it)
        self._all_written.set()
        # Attempts claimed ahead and not started, counted by instant (monotonic), and those
        # instants earliest first (an instant whose count fell to 0 is dropped lazily). A
        # heap entry per attempt, popped one by one once started, was 6 % of a worker's CPU
        # after a 50,000 burst's instant.
        self._upcoming: dict[float, int] = {}
        self._upcoming_at: list[float] = []
        self._instants = Instants()
        self._timeouts = Timeouts(self._time_out)
        # Conditional claims at their instant, decided together (_pass_gate), and the
        # transactions deciding them.
        self._gating: list[tuple[Claimed, asyncio.Future[str | None]]] = []
        self._gates: set[asyncio.Task[None]] = set()
        # Started without a write, in start order: (monotonic start, attempt).
        self._unrecorded: deque[tuple[float, _Running]] = deque()
        self._flush_now = asyncio.Event()
        self._clients: dict[tuple[bool, EgressPolicy], httpx.AsyncClient] = {}

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stop(); then drain within the grace period and release what is left.

        The background tasks (heartbeats, the self-fencing watchdog, completions, LISTEN,
        the registry) are watched while the worker runs: if one dies of an unexpected
        error, claiming stops, running attempts are cancelled at once (their leases may no
        longer be guarded) and the error is raised, so the process exits non-zero."""
        await self._register()
        tasks = Supervisor(f"worker {self.id}")
        for c in (
            self._listen,
            self._heartbeat_loop,
            self._watchdog_loop,
            self._complete_loop,
            self._late_start_loop,
            self._registry_loop,
        ):
            tasks.spawn(c(), c.__name__.lstrip("_"))
        log.info(
            "worker started",
            extra={"action": "worker_start", "worker": self.id, "pool": self.settings.pool},
        )
        await announce_durability(self.db)
        await announce_lock_table(self.db, self.settings.claim_batch_size)
        claim = asyncio.create_task(self._claim_loop(), name="claim_loop")
        try:
            await tasks.wait(claim)
        except BaseException:
            self._stopping.set()
            self._abort_all("a background task of the worker crashed")
            raise
        finally:
            self._stopping.set()
            self._wake.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await claim
            await self._drain()
            if self._gates:
                await asyncio.wait(self._gates, timeout=10.0)
            # The ones given back unstarted, in one statement (stopping may hold thousands).
            await self._release(self._unstarted)
            await tasks.stop()
            self._queue_late_starts(float("inf"))
            await self._flush(force=True)
            with contextlib.suppress(DatabaseError):
                await processes.delete(self.db, self.id)
            for client in self._clients.values():
                await client.aclose()
            if self.kube is not None:
                self.kube.close()
            log.info("worker stopped", extra={"action": "worker_stop", "worker": self.id})

    def stop(self) -> None:
        """First call: stop claiming and let running attempts finish within the grace
        period. Second call: cancel running attempts now (each is recorded as cancelled)."""
        if self._stopping.is_set():
            self._abort_all("second stop signal")
        self._stopping.set()
        self._wake.set()
        for r in list(self.running.values()):
            if r.start_lag is None and r.claimed.started_at is None:
                self._cancel(r, ABORT_RELEASE, "stopping before its instant")

    def _abort_all(self, why: str) -> None:
        for r in list(self.running.values()):
            self._cancel(r, ABORT_SHUTDOWN, why)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _drain(self) -> None:
        tasks = [r.task for r in self.running.values() if r.task is not None and not r.task.done()]
        if not tasks and not self._queued:
            return
        log.info(
            "draining running attempts",
            extra={
                "action": "worker_drain",
                "running": len(self.running),
                "grace_seconds": self.settings.shutdown_grace_seconds,
            },
        )
        pending = await self._settle(tasks, self.settings.shutdown_grace_seconds)
        if pending or self._queued:
            for r in list(self.running.values()):
                self._cancel(r, ABORT_SHUTDOWN, "shutdown grace period is over")
            # A handler that swallows its cancellation is abandoned (its lease will lapse).
            stuck = await self._settle(pending, 10.0)
            if stuck:
                log.error(
                    "attempts ignored cancellation; leaving them to the reaper",
                    extra={"action": "worker_drain_stuck", "n": len(stuck)},
                )
            if self._queued:
                log.error(
                    "completions not written yet; written at the end if the database answers,"
                    " else their leases lapse and the reaper retries them",
                    extra={"action": "worker_drain_unwritten", "n": self._queued},
                )

    async def _settle(
        self, tasks: Collection[asyncio.Task[None]], timeout: float
    ) -> set[asyncio.Task[None]]:
        """Wait up to `timeout` for `tasks` to end and then for the queued completions to
        be written (the completion loop writes them meanwhile); the tasks still running."""
        end = time.monotonic() + timeout
        pending: set[asyncio.Task[None]] = set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
        if self._queued:
            await wait_event(self._all_written, max(0.0, end - time.monotonic()))
        return pending

    # -- claiming ---------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        s = self.settings
        backoff = Backoff(first_seconds=0.5, max_seconds=min(s.poll_seconds, RETRY_MAX_SECONDS))
        look = True  # look at what is coming before claiming (not within a run of full claims)
        looked = True
        recount = False  # the last sleep ended only to count the pool's workers (_recount)
        while not self._stopping.is_set():
            # Cleared before the claim: a NOTIFY arriving while it runs wakes the next one.
            self._wake.clear()
            delay = s.poll_seconds
            self.live.waiting("claim")
            try:
                if look:
                    looked = (recount and await self._recount()) or await self._look()
                recount = False
                free, plan = self._free_slots(), self._plan()
                want = self._claim_size(free, plan)
                took_some = False
                if want > 0:
                    claimed = await self._claim(want, plan.window, free)
                    if self._stopping.is_set():
                        # Stopped while the claim was in flight: give them back unstarted.
                        await self._release(claimed)
                        break
                    for c in claimed:
                        self._start(c, c.lease_from_monotonic + s.lease_seconds)
                    if claimed:
                        # The batch's handlers take their first step before the next claim
                        # is sized: a handler that returns at once frees its slot in it.
                        # Sized at once, a claim counted those slots taken and took the
                        # rest: behind a backlog, claims alternated b and concurrency - b
                        # (half the slots each on average; 10,000 per-second jobs 4 s
                        # behind never caught up, a sixth of the CPU idle).
                        await asyncio.sleep(0)
                    # Trimmed after the batch: a hash the claim was told we know stays
                    # known until every occurrence of the batch has its spec.
                    while len(self._specs) > SPEC_CACHE_SIZE:
                        self._specs.popitem(last=False)
                    look = len(claimed) < want
                    if not look:
                        continue
                    took_some = bool(claimed)
                    looked = await self._look()
                    free, plan = self._free_slots(), self._plan()
                delay = self._claim_delay(plan, took_some, free)
                if not looked:
                    delay = min(delay, LOOK_MIN_SECONDS)  # look again soon: something woke it
                look = True
                backoff.success()
                self.live.progressed("claim")
            except EXPECTED_ERRORS as e:
                delay = backoff.failure()
                look = True
                log.warning(
                    f"claim failed; retrying in {delay:.1f}s: {e}",
                    extra={"action": "claim_failed"},
                )
            if delay > 0 and not self._stopping.is_set():
                held = bool(self._held) and delay >= HELD_LOOK_SECONDS
                recount = not await wait_event(self._wake, min(delay, s.poll_seconds)) and held

    async def _look(self) -> bool:
        """Read what is coming for the pool and how many live workers share it; False when
        the last look is too recent to look again (LOOK_MIN_SECONDS)."""
        s = self.settings
        now = time.monotonic()
        if self._coming is not None and now - self._coming.at < LOOK_MIN_SECONDS:
            return False
        live = self._workers
        widest = max(s.claim_ahead_seconds, s.claim_ahead_max_seconds)
        reach = min(widest, s.claim_ahead_seconds + LOOK_NEAR_SECONDS)
        budget = max(1, s.claim_ahead_max) * max(1, live)
        # What is due already is claimed first, in batches, whatever its count: a look
        # reads what the pool's next claims take of it, not a backlog (see the query).
        due_rows = s.claim_batch_size * max(1, live)
        pending: dict[datetime, int] = {}
        peers: dict[datetime, int] = {}  # the most each live worker of the pool has seen
        after: datetime | None = None
        counted = False
        while True:
            rows = await claims.coming(
                self.db,
                pool=s.pool,
                horizon_seconds=reach,
                rows=budget,
                due_rows=due_rows,
                until=self._until(),
                after=after,
            )
            at = time.monotonic()
            for r in rows:
                if r.run_at is not None:
                    pending[r.run_at] = r.n or 0
                    budget -= r.n or 0
            if not counted and (
                self._held or any(r.run_at is not None and r.run_at > r.db_now for r in rows)
            ):
                # Something to claim ahead, or held ahead: the pool's live workers counted at
                # this look, not reused. A worker that joins while another claims a burst
                # ahead shrinks the other's share at its next look (ahead claims run at tens
                # of thousands a second here: a count reused for 2 s let one worker take most
                # of a burst meant for two), and what the other holds over it is given back
                # (_give_back). Only then: a look at due work only (a share bounds ahead
                # claims) adds no statement to a claim loop waiting on rows another holds.
                live, peers = await self._pool_view()
                counted = True
            # A burst's size is the most seen of it: pending ones plus those held here (others'
            # claims shrink what is pending, not the burst each worker takes a share of), or
            # the most a live peer has seen (one that joined after claims began, or after a
            # peer gave back its surplus, sees only what is left pending).
            seen = {
                t: max(
                    self._seen.get(t, 0),
                    pending.get(t, 0) + self._held.get(t, 0),
                    peers.get(t, 0),
                )
                for t in pending.keys() | self._held.keys()
            }
            self._coming = _Coming(sorted(seen.items()), pending, rows[0].db_now, at, max(1, live))
            # Farther only when what was read leaves the plan open (it stops at the first
            # instant that needs no claim yet, and nothing after that one changes it) and
            # nothing is due: due work is claimed before anything ahead, and behind it the
            # plan never settles (the due instants count whole). Reading on then cost 47 ms
            # a look, a sixth of PostgreSQL's time at 10,000 per-second jobs and the 30 s
            # horizon, for claims ahead that would wait until the due ones were taken.
            read_to = rows[0].db_now + timedelta(seconds=reach)
            first = self._coming.first_pending()
            behind = first is not None and first <= 0
            if reach >= widest or budget <= 0 or behind or self._plan(read_to).next_in is not None:
                self._seen = seen
                if counted and time.monotonic() < self._give_back_until:
                    await self._give_back(live)
                return True
            after = read_to
            reach = min(widest, reach * LOOK_REACH_FACTOR)

    async def _recount(self) -> bool:
        """The claim loop slept HELD_LOOK_SECONDS holding claims ahead and nothing woke it:
        count the pool's live workers (one statement) instead of looking again. True when
        the last look's plan stands (the same count: nothing that changes it was notified);
        False when a full look must follow: a peer joined or left (its surplus is given back
        at that look), a give-back window is open, or the last look is older than
        poll_seconds (the poll that finds what a lost NOTIFY did not announce). Why: a
        worker holding a burst's first claims from 26 s ahead looked every second, three
        reads of up to 30 s of the pool's instants a look: 92 reads in 16 s for two workers
        before a 50,000 burst, a tenth of the statements' execution time in that burst."""
        c = self._coming
        now = time.monotonic()
        if c is None or now - c.at >= self.settings.poll_seconds or now < self._give_back_until:
            return False
        live, _ = await self._pool_view()
        return max(1, live) == c.workers

    async def _pool_view(self) -> tuple[int, dict[datetime, int]]:
        """The pool's live workers and the burst sizes they have seen; publishes this
        worker's own (its earliest PUBLISHED_INSTANTS instants) when it changed, at most
        every PUBLISH_MIN_SECONDS."""
        now = time.monotonic()
        view = None
        if now - self._published_at >= PUBLISH_MIN_SECONDS:
            view = dict(sorted(self._seen.items())[:PUBLISHED_INSTANTS])
            if view == self._published:
                view = None
        live, peers = await processes.pool_view(
            self.db,
            worker_id=self.id,
            pool=self.settings.pool,
            ttl_seconds=REGISTRY_TTL_SECONDS,
            publish=view,
        )
        if view is not None:
            self._published, self._published_at = view, now
        if live > self._workers:
            self._give_back_until = time.monotonic() + GIVE_BACK_WINDOW_SECONDS
        self._workers = live
        return live, peers

    async def _give_back(self, live: int) -> None:
        """Give back, unstarted, what this worker holds claimed ahead over its share of each
        burst, for GIVE_BACK_WINDOW_SECONDS after the pool's live count rose (a peer joined:
        what it claimed before the peer registered was planned for fewer workers). Only
        attempts still sleeping until an instant at least GIVE_BACK_LEAD_SECONDS away:
        pending again, attempt not consumed, for the peer to claim ahead. Why: two workers
        registering a second apart before a 50,000-occurrence burst split it 70/30, and a
        1 ms CPU handler burst then took as long as the larger part on one core."""
        slack = self.settings.claim_batch_size
        surplus = {
            t: over
            for t, held in self._held.items()
            if (over := held - share_of(self._seen.get(t, held), live, slack)) > 0
        }
        if not surplus:
            return
        after = time.monotonic() + GIVE_BACK_LEAD_SECONDS
        chosen: list[asyncio.Task[None]] = []
        for r in list(self.running.values()):
            t = r.claimed.run_at
            if (
                surplus.get(t, 0) > 0
                and r.waiting
                and r.starting
                and r.claimed.due_monotonic > after
            ):
                self._cancel(r, ABORT_GIVE_BACK, "over this worker's share")
                if r.abort == ABORT_GIVE_BACK and r.task is not None:
                    surplus[t] -= 1
                    chosen.append(r.task)
        if not chosen:
            return
        await asyncio.wait(chosen, timeout=5.0)  # each ends in _begin: added to _unstarted
        given, self._unstarted = self._unstarted, []
        log.info(
            "giving back claims ahead over this worker's share",
            extra={"action": ABORT_GIVE_BACK, "n": len(given), "workers": live},
        )
        await self._release(given)

    def _until(self) -> datetime | None:
        """The latest instant a claim or a look reads (their `until`: the partitions after
        it stay out of the plan): the database clock plus the widest claim window and
        UNTIL_SLACK_SECONDS; None before the first look (no bound)."""
        if self._coming is None:
            return None
        s = self.settings
        reach = max(s.claim_ahead_seconds, s.claim_ahead_max_seconds) + UNTIL_SLACK_SECONDS
        return self._coming.db_clock() + timedelta(seconds=reach)

    def _plan(self, within: datetime | None = None) -> ClaimPlan:
        """The claim plan from the last look (`within`: its instants up to that one)."""
        s = self.settings
        if self._coming is None:
            return ClaimPlan(s.claim_ahead_seconds, 0, None)
        return plan_claims(
            self._coming.until(within),
            workers=self._coming.workers,
            rate=self._claim_rate / CLAIM_RATE_SAFETY,
            min_window=s.claim_ahead_seconds,
            max_window=max(s.claim_ahead_seconds, s.claim_ahead_max_seconds),
            slack=s.claim_batch_size,
            margin=s.claim_ahead_margin_seconds,
            pending=self._coming.left(within),
        )

    def _claim_size(self, free: int, plan: ClaimPlan) -> int:
        """How many occurrences to claim now: while something is due, as many as there are
        free slots (due ones come first in the claim's order, and a worker takes no due
        work it cannot start); otherwise ahead ones, up to this worker's share of what is
        in the window and the memory bound."""
        s = self.settings
        first = self._coming.first_pending() if self._coming is not None else None
        if first is None:
            return 0  # nothing pending within the horizon
        if first <= 0:
            return min(s.claim_batch_size, max(0, free))
        ahead = min(s.claim_ahead_max, plan.quota) - self._waiting
        return min(s.claim_batch_size, max(0, ahead))

    async def _claim(self, want: int, window: float, free: int) -> list[Claimed]:
        """One claim; its rate (occurrences per second) updates the measured one."""
        s = self.settings
        sent = time.monotonic()
        claimed = await dispatch.claim(
            self.db,
            pool=s.pool,
            worker_id=self.id,
            limit=want,
            lease_seconds=s.lease_seconds,
            known_specs=self._specs,
            ahead_seconds=window,
            due_limit=max(0, free),
            until=self._until(),
            turn=self._turn,
        )
        took = time.monotonic() - sent
        # Full claims of at least half a batch: a few due ones claimed into freed slots
        # say how fast slots free, not how fast this worker can claim.
        if len(claimed) == want >= max(1, s.claim_batch_size // 2) and took > 0:
            a = CLAIM_RATE_SMOOTHING
            self._claim_rate = (1 - a) * self._claim_rate + a * len(claimed) / took
        return claimed

    def _claim_delay(self, plan: ClaimPlan, took_some: bool, free: int) -> float:
        """How long to sleep after a claim that took less than it asked for (or none):
        until the next instant when what is left of it is in the window (held back for its
        overlap decision, over this worker's share, or over the memory bound), else until
        the next burst's claim should start. A slot that frees, a NOTIFY or the poll wakes
        it sooner."""
        first = self._coming.first_pending() if self._coming is not None else None
        delay = self.settings.poll_seconds
        if first is not None and first <= plan.window:
            delay = first
            if first <= 0 and free <= 0:
                delay = self.settings.poll_seconds  # due, no slot: a slot that frees wakes it
            elif not took_some:
                # Due yet nothing taken: another claimer holds it, or it waits behind one it
                # holds (dispatch.hold_back). Not a busy loop.
                delay = max(delay, BUSY_RETRY_SECONDS)
        if plan.next_in is not None:
            delay = min(delay, max(plan.next_in, BUSY_RETRY_SECONDS))
        if self._held:
            delay = min(delay, HELD_LOOK_SECONDS)  # a peer that joins: give back the surplus
        return delay

    def _free_slots(self) -> int:
        """How many more due occurrences to claim now: the handler slots not taken and not
        promised to a claimed-ahead attempt whose instant came. A slot frees when its
        handler returns, not when its completion is written: the next batch is claimed
        while the last one's completions are in flight (the database works on both at
        once). Attempts running or completing stay below twice the concurrency; those
        claimed ahead and waiting for their instant count against neither."""
        s = self.settings
        started = len(self.running) - self._waiting
        return min(
            s.concurrency - self._handlers - len(self._slot_queue), 2 * s.concurrency - started
        )

    def _handler_done(self, r: _Running) -> None:
        """The attempt's target is over (returned, raised or was cancelled): what is left,
        recording it, is never aborted, and its slot goes to the first attempt waiting for
        one, else to a new claim."""
        if r.completing:
            return
        r.completing = True
        if r.slot:
            r.slot = False
            self._handlers -= 1
            self._hand_slot()
        else:
            self._unhold(r)
        self._wake.set()

    def _hand_slot(self) -> None:
        """A slot is free: the first claimed-ahead attempt waiting for one takes it."""
        while self._slot_queue and self._handlers < self.settings.concurrency:
            fut = self._slot_queue.popleft()
            if not fut.done():
                self._handlers += 1
                fut.set_result(None)

    async def _take_slot(self, r: _Running) -> None:
        """A claimed-ahead attempt whose instant came takes a handler slot, or waits for one
        behind those whose instants came before (first come, first served)."""
        if self._handlers < self.settings.concurrency and not self._slot_queue:
            self._handlers += 1
        else:
            fut = asyncio.get_running_loop().create_future()
            self._slot_queue.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._unhold(r)
                    r.slot = True  # handed over as it was cancelled: _forget gives it back
                raise
        self._unhold(r)
        r.slot = True

    def _unhold(self, r: _Running) -> None:
        """The attempt no longer waits as claimed ahead (it took a slot, or is over)."""
        if r.waiting:
            r.waiting = False
            self._waiting -= 1
            t = r.claimed.run_at
            n = self._held.get(t, 0) - 1
            if n > 0:
                self._held[t] = n
            else:
                self._held.pop(t, None)

    async def _release(self, claimed: list[Claimed]) -> None:
        """Give claimed-but-unstarted occurrences back: pending now, attempt not consumed."""
        if not claimed:
            return
        try:
            released = await dispatch.release(
                self.db,
                [(c.id, c.fence) for c in claimed],
                within=dispatch.bounds([c.scheduled_for for c in claimed]),
            )
        except DatabaseError as e:
            log.error(
                "could not release claimed occurrences; their leases will expire and be reaped",
                extra={"action": "release_failed", "error": str(e), "n": len(claimed)},
            )
            released = set()
        log.info(
            "released unstarted occurrences",
            extra={"action": "released", "n": len(claimed), "released": len(released)},
        )
        for c in claimed:
            log.debug(
                "released unstarted occurrence",
                extra={"action": "released", "key": c.key, "fence": c.fence},
            )
            self._report(c, "released" if c.key in released else "stale")

    async def _listen(self) -> None:
        """LISTEN cronwell_due on a dedicated connection; wake the claim loop when a batch
        for our pool lands (it then asks the database when the batch is due)."""
        while True:
            try:
                async for pools in notify.due_pools(self.db):
                    # None: listening (again); anything notified meanwhile was missed.
                    if pools is None or self.settings.pool in pools:
                        self._wake.set()
            except (DatabaseError, OSError) as e:
                log.info(
                    "listen connection lost; polling until it is back",
                    extra={"action": "listen_lost", "error": str(e)},
                )
                await asyncio.sleep(1.0)

    # -- running ----------------------------------------------------------------------

    def _start(self, c: Claimed, deadline: float) -> None:
        ctx = Context.for_claim(c, self.db)
        old = self.running.get(c.key)
        if old is not None:
            # Claimed again: the attempt this worker still runs for the key lost its lease.
            self._cancel(old, ABORT_LEASE_LOST, "the occurrence was claimed again")
        r = _Running(c, ctx, deadline)
        self._earliest_deadline = min(self._earliest_deadline, deadline)
        try:
            r.spec = self._spec(c)
        except (pydantic.ValidationError, ValueError) as e:
            r.spec_error = e
        self.running[c.key] = r
        if c.started_at is None:
            r.waiting = True  # claimed ahead: takes a slot at its instant
            self._waiting += 1
            self._held[c.run_at] = self._held.get(c.run_at, 0) + 1
        else:
            r.slot = True
            self._handlers += 1
        r.task = asyncio.create_task(self._execute(r), name=f"attempt {c.key}")
        # A task cancelled before its first step never runs _execute's `finally`: without
        # this its slot and entry would leak, and a worker whose slots all leaked claims
        # nothing again (seen when a claim that waited for a connection arrived with its
        # leases already looking lapsed, and the watchdog cancelled them at once).
        r.task.add_done_callback(lambda _: self._forget(r))

    def _client(self, spec: ScheduledJobSpec, policy: EgressPolicy) -> httpx.AsyncClient:
        """One client per (TLS verification, egress policy): a pooled connection is reused
        only by jobs under the policy it was checked against."""
        verify = spec.target.http is None or spec.target.http.verify_tls
        client = self._clients.get((verify, policy))
        if client is None:
            client = self._clients[(verify, policy)] = egress.client(policy, verify=verify)
        return client

    def _policy(self, view: _View, namespace: str, handler: str | None) -> EgressPolicy:
        """The egress policy of a job of `namespace` running `handler` (if a handler
        target); raises a non-retryable TargetError when it may not use this pool or
        handler. Decided once per (namespace, handler) and view: a burst's occurrences
        share a few (the whole admission took 1.4 us an occurrence deciding each again with no
        policy to apply, 0.85 memoised)."""
        key = (namespace, handler)
        judged = view.judged.get(key)
        if judged is None:
            judged = view.judged[key] = self._judge(view, namespace, handler)
        if isinstance(judged, tenancy.Refusal):
            raise targets.TargetError(
                judged.message, retryable=False, sent=False, reason=judged.reason
            )
        return judged

    def _judge(
        self, view: _View, namespace: str, handler: str | None
    ) -> EgressPolicy | tenancy.Refusal:
        # The WorkerPools' rows (any may allow) and this worker's own static policy.
        sets = (
            [view.pool_rows] if self._static_pool is None else [view.pool_rows, self._static_pool]
        )
        for policies in sets:
            refusal = tenancy.check(
                policies,
                pool=self.settings.pool,
                namespace=namespace,
                labels=view.labels(namespace),
                handler=handler,
            )
            if refusal is not None:
                return refusal
        ns_egress = view.egress(namespace)
        return self.egress if ns_egress is None else self.egress.for_namespace(ns_egress)

    async def _admit(
        self, c: Claimed, spec: ScheduledJobSpec
    ) -> tuple[EgressPolicy, dict[str, str] | None]:
        """The pool policy (raises a non-retryable TargetError when the job's namespace
        may not use this pool or handler), the job's egress policy and its Secret values."""
        view = await self._tenancy.view()
        handler = spec.target.handler.name if spec.target.handler is not None else None
        policy = self._policy(view, c.namespace, handler)
        http = spec.target.http
        if http is None or not http.secret_headers:
            return policy, None
        token = await job_secrets.ciphertext(self.db, job_id=c.job_id)
        if token is None:
            return policy, {}
        if self.secrets is None:
            raise targets.TargetError(
                "the job has Secret-backed headers but this worker has no secrets key: set "
                "CRONWELL_SECRETS_KEY (the chart's secrets Secret) as on the operator",
                sent=False,
                reason="SecretUnresolved",
            )
        try:
            return policy, self.secrets.decrypt(token)
        except SecretsKeyError as e:
            raise targets.TargetError(str(e), sent=False, reason="SecretUnresolved") from None

    async def _execute(self, r: _Running) -> None:
        try:
            if await self._begin(r):
                await self._attempt(r)
                if not r.queued:
                    self._recorded(r)
        finally:
            self._forget(r)

    def _recorded(self, r: _Running) -> None:
        """The attempt's outcome is recorded: a `job` target's Jobs are tidied."""
        if self.kube is not None and r.spec is not None and r.spec.target.job is not None:
            self.kube.recorded(r.claimed, r.spec)

    def _forget(self, r: _Running) -> None:
        """The attempt is over: free its slot and entry (idempotent); an entry whose
        completion is queued stays until it is written (_completed)."""
        self._handler_done(r)
        if r.queued:
            return
        # The same key may have been claimed again meanwhile (a new attempt under a new
        # fence after this one lost its lease): remove only this attempt.
        if self.running.get(r.claimed.key) is r:
            del self.running[r.claimed.key]
        self._wake.set()

    async def _begin(self, r: _Running) -> bool:
        """Wait for the attempt's instant (claimed ahead) and start it (see the module's
        docstring); False when it must not run (lease lost or not surely held, or the worker
        stops: then it is given back unstarted). An attempt claimed when due started at its
        claim."""
        c = r.claimed
        ahead = c.started_at is None
        durable = ahead and self._durable_start(r)
        try:
            if ahead:
                await self._wait_for_instant(r)
                if c.conditional and not await self._pass_gate(c):
                    return False
                await self._take_slot(r)
                # AtMostOnce and `job`: the target runs only once its start is durable, so
                # started_at NULL means it never ran (the reaper gives it back unconsumed).
                if durable and not await self._record_start(r):
                    self._report(c, "lease_lost", error="start not recorded")
                    return False
        except asyncio.CancelledError:
            if r.abort in UNSTARTED_ABORTS:
                self._unstarted.append(c)  # given back in one statement (_run, _give_back)
            else:
                self._report(c, "lease_lost", error=r.abort)
            return False
        finally:
            if r.starting:
                r.starting = False
                self._started(c.due_monotonic)
        now = time.monotonic()
        if ahead and not durable and not self._lease_held(r, now):
            # No write before the start: the worker's own judgement of its lease decides.
            r.abort = ABORT_SELF_FENCE  # given back below, not cancelled meanwhile
            log.warning(
                "lease not surely held at the instant; giving the occurrence back unstarted",
                extra={"action": ABORT_SELF_FENCE, "key": c.key, "fence": c.fence},
            )
            await self._release([c])
            return False
        r.start_lag = now - c.due_monotonic
        if ahead and not durable:
            self._started_unwritten(r, now)
        if c.attempt == 1:
            self._m.start_lag.observe(r.start_lag)
        return True

    async def _pass_gate(self, c: Claimed) -> bool:
        """A conditional claim at its instant (dispatch.gate): whether it may start; if not,
        it is reported skipped, given back or stale. The conditional claims one timer
        releases together (one loop turn) share one transaction."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()
        self._gating.append((c, fut))
        if len(self._gating) == 1:
            loop.call_soon(self._open_gate)
        verdict = await fut
        if verdict == dispatch.GATE_START:
            return True
        if verdict is not None:  # None: given back after the gate failed (_gate_batch)
            result = {dispatch.GATE_SKIP: "skipped", dispatch.GATE_BACK: "released"}
            self._report(c, result.get(verdict, "stale"))
        return False

    def _open_gate(self) -> None:
        batch, self._gating = self._gating, []
        task = asyncio.create_task(self._gate_batch(batch), name="gate")
        self._gates.add(task)
        task.add_done_callback(self._gates.discard)

    async def _gate_batch(self, batch: list[tuple[Claimed, asyncio.Future[str | None]]]) -> None:
        """Decide a batch of conditional claims; if the database does not answer, none of
        them starts: they are given back (or left to the reaper, which gives back
        unconsumed a conditional claim whose lease lapsed)."""
        verdicts: dict[int, str | None] = {}
        try:
            # Runs of these jobs this worker saw succeed whose completion is not written yet:
            # over, not active (the gate reads the store, which does not know it yet).
            jobs = {str(c.job_id) for c, _ in batch}
            over = [q[1] for q in (*self._done, *self._completing) if key_job(q[0]) in jobs]
            verdicts = dict(
                await dispatch.gate(
                    self.db, [c for c, _ in batch], pool=self.settings.pool, over=over
                )
            )
        except DatabaseError as e:
            log.error(
                "could not decide conditional claims at their instant; giving them back",
                extra={"action": "gate_failed", "error": str(e), "n": len(batch)},
            )
            await self._release([c for c, _ in batch])
            verdicts = {c.id: None for c, _ in batch}
        finally:  # whatever happened, none waits for ever (missing: not to run)
            for c, fut in batch:
                if not fut.done():
                    fut.set_result(verdicts.get(c.id, "stale"))

    async def _wait_for_instant(self, r: _Running) -> None:
        """Read what the attempt needs first, then sleep until its instant (meanwhile it
        counts among the starts that completion writes wait for)."""
        c = r.claimed
        if r.spec is not None:
            # What the attempt reads first is read before its instant, not at it.
            try:
                r.admitted = await self._admit(c, r.spec)
            except Exception as e:  # raised at the start, as if read then
                r.admitted = e
        r.starting = True
        due = c.due_monotonic
        if (n := self._upcoming.get(due, 0)) == 0:
            heapq.heappush(self._upcoming_at, due)
        self._upcoming[due] = n + 1
        # Until the instant, never before it (Instants waits again when the loop wakes its
        # timer early): the start, with no write in front of it, is the handler's.
        if c.due_monotonic > time.monotonic():
            await self._instants.at(c.due_monotonic)

    @staticmethod
    def _durable_start(r: _Running) -> bool:
        """Whether the start is written before the target runs: AtMostOnce (started_at
        NULL must mean it never ran: never Ambiguous) and a `job` target (its Job outlives
        the worker; the reaper's rule for it reads started_at)."""
        job = r.spec is not None and r.spec.target.job is not None
        return r.claimed.delivery == Delivery.AT_MOST_ONCE or job

    def _lease_held(self, r: _Running, now: float) -> bool:
        """The watchdog's judgement: the lease surely runs until past `now` (the last
        renewal sent + the lease, less the self-fencing margin; monotonic clock)."""
        return now < r.deadline - self_fence_margin(self.settings.lease_seconds)

    def _started_unwritten(self, r: _Running, now: float) -> None:
        """Started without a write: keep its start on the database clock (the claim's
        alignment: `due_monotonic` is `run_at`) for its ending or a late record."""
        c = r.claimed
        r.start_db = c.run_at + timedelta(seconds=now - c.due_monotonic)
        r.ctx.start_instant = r.start_db
        self._unrecorded.append((now, r))

    def _spec(self, c: Claimed) -> ScheduledJobSpec:
        """The parsed spec, cached by spec hash (a content hash: jobs sharing a spec share
        the entry). Validating it again for every attempt was a fifth of the worker's CPU
        in a burst; the claim sends a document only for hashes not cached here."""
        if c.spec is None:
            spec = self._specs[c.spec_hash]
            self._specs.move_to_end(c.spec_hash)
            return spec
        spec = ScheduledJobSpec.model_validate(c.spec)
        if c.spec_hash:
            self._specs[c.spec_hash] = spec
        return spec

    async def _attempt(self, r: _Running) -> None:
        c, ctx = r.claimed, r.ctx
        spec = r.spec
        if spec is None:
            self._handler_done(r)  # nothing runs; recording the failure is all that is left
            await self._failed(
                c,
                targets.TargetError(
                    f"stored spec is invalid: {r.spec_error}",
                    retryable=False,
                    sent=False,
                    reason="InvalidTarget",
                ),
            )
            return
        error: targets.TargetError | None = None
        outcome = "failed"
        try:
            admitted = r.admitted
            if isinstance(admitted, Exception):
                raise admitted
            policy, secrets = admitted or await self._admit(c, spec)
            limit = float(c.timeout_seconds)
            job = None
            if spec.target.job is not None:
                limit += targets.JOB_TIMEOUT_GRACE_SECONDS  # run_job's own timeout goes first
                job = None if self.kube is None else functools.partial(self.kube.run, c, spec)
            # Only an HTTP target uses a client: looking one up hashes the egress policy
            # (its networks), 5.7 % of a worker's busy time in a 20k handler burst.
            client = self._client(spec, policy) if spec.target.http is not None else None
            timer = self._timeouts.arm(r, limit)
            try:
                await targets.run(spec.target, ctx, client, c.timeout_seconds, secrets, job)
            except asyncio.CancelledError:
                if r.timed_out and r.abort is None:  # its own timeout, nothing else
                    raise TimeoutError from None
                raise
            finally:
                self._timeouts.disarm(timer, r)
                if r.timed_out:  # the cancellation _time_out requested is spent
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
        except asyncio.CancelledError:
            ctx.cancel()
            self._handler_done(r)
            if r.abort == ABORT_SHUTDOWN:
                await self._failed(
                    c,
                    targets.TargetError(
                        "cancelled: the worker shut down before the attempt finished",
                        reason="WorkerShutdown",
                    ),
                    outcome="cancelled",
                    retry=spec.retry,
                    immediate=True,
                )
                return
            log.warning(
                "attempt aborted: lease lost",
                extra=_attempt_fields(c) | {"why": r.abort or "cancelled"},
            )
            self._report(c, "lease_lost", error=r.abort)
            return
        except LeaseLost as e:
            # Raised by the handler: ctx.check_cancelled(), or ctx.transaction() whose
            # fenced completion matched nothing (its effect was rolled back).
            ctx.cancel()
            log.warning("attempt aborted: lease lost", extra=_attempt_fields(c) | {"error": str(e)})
            self._report(c, "lease_lost", error=str(e))
            return
        except TimeoutError:
            error = targets.TargetError(
                f"attempt timed out after {c.timeout_seconds}s", reason="Timeout"
            )
            outcome = "timeout"
        except targets.TargetError as e:
            error = e
        except Exception as e:  # the job's own code: any error is this attempt's failure
            error = targets.TargetError(f"{type(e).__name__}: {e}")
        self._handler_done(r)
        if error is not None:
            await self._failed(c, error, outcome=outcome, retry=spec.retry)
            return
        if ctx.completed_in_transaction:
            self._report(c, "succeeded", start_lag=r.start_lag)
        else:
            self._complete(r)

    async def _failed(
        self,
        c: Claimed,
        e: targets.TargetError,
        *,
        outcome: str = "failed",
        retry: RetryPolicy | None = None,
        immediate: bool = False,
    ) -> None:
        """Record a failed attempt, fenced: retry after a backoff, or dead-letter it.

        Not retried: errors retrying cannot fix (HTTP 4xx but 408/429, unknown handler,
        invalid target), the last attempt, and under AtMostOnce any attempt that may have
        had an effect (`sent`): that one is dead with reason Ambiguous."""
        extra = _attempt_fields(c)
        if e.reason in POLICY_REASONS:
            self.metrics.policy_denied.labels(self.settings.pool, e.reason).inc()
        r = self.running.get(c.key)
        mine = r if r is not None and r.claimed is c else None
        started = mine.start_db if mine is not None else None
        at_most_once = c.delivery == Delivery.AT_MOST_ONCE
        ambiguous = at_most_once and e.sent and e.retryable
        retry_ok = e.retryable and c.attempt < c.max_attempts and not ambiguous
        reason = "Ambiguous" if ambiguous else e.reason
        if retry_ok:
            delay = 0.0 if immediate else backoff_seconds(retry or RetryPolicy(), c.attempt)
            state = "pending"
        else:
            state, delay = "dead", 0.0
            if e.retryable and not ambiguous:
                reason = "AttemptsExhausted"
        record = functools.partial(
            dispatch.fail,
            self.db,
            fence=c.fence,
            next_state=state,
            reason=reason,
            error=str(e),
            delay_seconds=delay,
            outcome=outcome,
            started=started,
        )
        try:
            _, oid, _, at = (
                mine.held if mine is not None else (c.key, c.id, c.fence, c.scheduled_for)
            )
            new = await record(occurrence_id=oid, within=(at, at))
            if new is None and (back := await self._reassert([(c.key, c.fence)])):
                row = back[c.key]  # its row may have been materialised again
                new = await record(
                    occurrence_id=row.id, within=(row.scheduled_for, row.scheduled_for)
                )
        except DatabaseError as db_error:
            log.error(
                "could not record failure; the lease will expire and be reaped",
                extra=extra | {"error": str(db_error)},
            )
            new = None
        if new == "dead":
            log.error(
                "occurrence dead-lettered",
                extra=extra | {"action": "dead_letter", "reason": reason, "error": str(e)[:500]},
            )
        else:
            log.warning(
                "attempt failed",
                extra=extra
                | {"error": str(e), "next": new or "stale", "retry_in": round(delay, 3)},
            )
        result = {"pending": "retry", "dead": "dead", None: "stale"}[new]
        if outcome == "cancelled" and new is not None:
            result = "cancelled"
        lag = r.start_lag if r is not None and r.claimed is c else None
        self._report(c, result, error=str(e), start_lag=lag)

    def _report(
        self, c: Claimed, result: str, error: str | None = None, start_lag: float | None = None
    ) -> None:
        """Count an attempt's outcome; an Outcome is built only for `on_outcome` (the dev
        console, tests): 0.6 us an occurrence that nothing else reads."""
        self._m.count(result, len(self.running), self._handlers / self.settings.concurrency)
        self._wake.set()
        if self.on_outcome is not None:
            self.on_outcome(Outcome(c, result, error=error, start_lag=start_lag))

    # -- completion batching ----------------------------------------------------------

    def _complete(self, r: _Running) -> None:
        """Queue the attempt's completion; its task then ends, and the write settles it
        (_completed). Why not await it: a future per attempt and a second step of its task
        after the write bought nothing a callback does not do, for 3-5 us of a worker's CPU
        per occurrence (50,000 bursts alternated: medians 0.058 -> 0.053 ms)."""
        r.queued = True
        self._queued += 1
        self._all_written.clear()
        self._done.append((*r.held, r.start_db, r))
        self._flush_now.set()

    def _completed(self, r: _Running, ok: bool) -> None:
        """The attempt's completion was written (`ok`: its fence still held; else stale):
        its outcome is reported and its entry freed."""
        r.queued = False
        self._queued -= 1
        if not self._queued:
            self._all_written.set()
        c = r.claimed
        self._report(c, "succeeded" if ok else "stale", start_lag=r.start_lag)
        if not ok:
            log.warning("completion rejected: fence is stale", extra=_attempt_fields(c))
        self._recorded(r)
        self._forget(r)

    def _record_start(self, r: _Running) -> asyncio.Future[bool]:
        """Queue the start of an AtMostOnce or `job` attempt claimed ahead, written before
        anything else. The future says whether the lease was still held."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._starts.append((*r.held, None, fut))
        self._flush_now.set()
        return fut

    async def _complete_loop(self) -> None:
        while True:
            await self._flush_now.wait()
            await asyncio.sleep(self.settings.complete_flush_seconds)
            self._flush_now.clear()
            if await self._flush():
                # Held: look again shortly, or as soon as a start write is queued.
                await wait_event(self._flush_now, HOLD_RECHECK_SECONDS)
                self._flush_now.set()

    async def _late_start_loop(self) -> None:
        """Record the start of attempts started without a write and still running after
        START_RECORD_AFTER_SECONDS, so the dashboard shows them started."""
        while True:
            await asyncio.sleep(START_RECORD_AFTER_SECONDS / 2)
            self._queue_late_starts(time.monotonic())

    def _queue_late_starts(self, now: float) -> None:
        """Queue start records (low priority: written with completions) for attempts
        started without a write at least START_RECORD_AFTER_SECONDS before `now`."""
        q = self._unrecorded
        while q and q[0][0] <= now - START_RECORD_AFTER_SECONDS:
            _, r = q.popleft()
            if not r.completing and self.running.get(r.claimed.key) is r:
                self._late.append((*r.held, r.start_db, None))
        if self._late:
            self._flush_now.set()

    async def _flush(self, force: bool = False) -> bool:
        """Write every pending start write (a target waits on each), then, unless held
        (starts before completions; `force`: never), the late start records and the
        completions, one fenced statement each. True when completions were held."""
        starts, self._starts = self._starts, []
        await self._write(starts, dispatch.record_starts, "start")
        if not force and self._hold(time.monotonic()):
            return True
        self._held_since = None
        # Taken after the start writes: every completion taken had its start written
        # (AtMostOnce, job: its target ran after) or carries it (the others).
        late, self._late = self._late, []
        batch, self._done = self._done, []
        await self._write(late, dispatch.record_starts, "start")
        self._completing = batch
        try:
            await self._write(batch, dispatch.succeed, "completion")
        finally:
            self._completing = []
        return False

    def _hold(self, now: float) -> bool:
        """Starts before completions: hold queued completions while an attempt is due to
        start within START_GUARD_SECONDS or is starting, for at most
        `completion_hold_seconds` (then they go, in one larger batch)."""
        if not (self._done or self._late):
            return False
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since >= self.settings.completion_hold_seconds:
            return False
        at = self._upcoming_at
        while at and at[0] not in self._upcoming:
            heapq.heappop(at)
        return bool(at) and at[0] <= now + START_GUARD_SECONDS

    def _started(self, due: float) -> None:
        """An attempt claimed ahead for `due` is no longer starting (started, or not to)."""
        n = self._upcoming[due] - 1
        if n:
            self._upcoming[due] = n
        else:
            del self._upcoming[due]

    @contextlib.asynccontextmanager
    async def _executing(self, keys: list[str]) -> AsyncIterator[None]:
        """Run a batch statement over `keys`: after any heartbeat statement executing now,
        with the keys marked for its duration (see `_writing`, `_beat_done`)."""
        await self._beat_done.wait()
        self._writing.append(keys)
        try:
            yield
        finally:
            # An equal batch's list, if remove finds that one first, stands for the same keys.
            self._writing.remove(keys)

    async def _write(self, batch: list[_Queued], write: _Write, what: str) -> None:
        """One fenced batch write by (id, fence), retried through database errors; each
        waiter (see _Queued) learns whether its key was still held."""
        if not batch:
            return
        # In id order (a stable order across batches). A batch and this worker's heartbeat
        # never execute over the same rows at once (`_executing`): two multi-row writes of
        # one worker's rows lock them in plan order, which over partitions (an Append by
        # instant, a bitmap scan on a partition with stale statistics) is not id order, and
        # deadlocked in the soak (PostgreSQL aborts one, retried: a second lost).
        batch.sort(key=lambda q: q[1])
        backoff = Backoff(first_seconds=0.1, max_seconds=RETRY_MAX_SECONDS)
        self.live.waiting(what)
        # Built once, not again on each retry.
        done = [(i, f) for _, i, f, _, _, _ in batch]
        starts = [s for _, _, _, _, s, _ in batch]
        within = dispatch.bounds([q[3] for q in batch])
        keys = [q[0] for q in batch]
        for _ in range(30):
            try:
                async with self._executing(keys):
                    ok = await write(self.db, done, starts, within=within)
                self.live.progressed(what)
                break
            except EXPECTED_ERRORS as e:
                delay = backoff.failure()
                log.warning(
                    f"{what} write failed; retrying in {delay:.1f}s: {e}",
                    extra={"action": f"{what}_retry"},
                )
                await asyncio.sleep(delay)
        else:
            ok = set()
            # Given up: these attempts' leases lapse and they run again, fenced. The writer
            # waits no more; a next batch that cannot get through stalls it again.
            self.live.progressed(what)
        missing = [(k, f, s) for k, _, f, _, s, _ in batch if k not in ok]
        if missing:
            with contextlib.suppress(*EXPECTED_ERRORS):
                back = await self._reassert([(k, f) for k, f, _ in missing])
                if back:
                    # By the row the store has now: the lost commits may have included the
                    # occurrence's materialisation (materialised again, under another id,
                    # and a trigger under another instant).
                    again = [(back[k], f, s) for k, f, s in missing if k in back]
                    ok |= await write(
                        self.db,
                        [(row.id, f) for row, f, _ in again],
                        [s for *_, s in again],
                        within=dispatch.bounds([row.scheduled_for for row, _, _ in again]),
                    )
        for k, _, _, _, _, then in batch:
            if isinstance(then, _Running):
                self._completed(then, k in ok)
            elif then is not None and not then.done():
                then.set_result(k in ok)

    # -- heartbeats and self-fencing --------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                # A hung renewal must not hold up the next one (the watchdog self-fences).
                async with asyncio.timeout(lease / 2):
                    await self.heartbeat_once()
            except TimeoutError:
                log.warning("heartbeat timed out", extra={"action": "heartbeat_failed"})

    async def heartbeat_once(self) -> None:
        lease = self.settings.lease_seconds
        # Attempts that are only completing are renewed too (a slow completion write must
        # not let the lease lapse), but a renewal they miss aborts nothing.
        # Not the rows of a batch statement executing now: this statement would wait for
        # them in its own lock order (a deadlock); it renews them at the next beat.
        writing = set().union(*self._writing)
        beating = [r.held for k, r in self.running.items() if k not in writing]
        if not beating:
            self.live.progressed("heartbeat")
            return
        held = [(k, f) for k, _, f, _ in beating]
        stalled = self.live.stalled(among=RECORDING_WRITERS)
        if stalled:
            # A writer that cannot get through would only keep leases of attempts it cannot
            # record: let them lapse, so the reaper gives them to another worker, fenced.
            log.error(
                "writers stalled; not renewing leases",
                extra={"action": "heartbeat_withheld", "stalled": stalled, "held": len(held)},
            )
            return
        sent = time.monotonic()
        self.live.waiting("heartbeat")
        self._beat_done.clear()
        try:
            alive = await dispatch.heartbeat(
                self.db,
                worker_id=self.id,
                running=[(i, f) for _, i, f, _ in beating],
                lease_seconds=lease,
                within=dispatch.bounds([at for *_, at in beating]),
            )
        except EXPECTED_ERRORS as e:
            # The watchdog self-fences the attempts if renewals keep failing.
            log.warning(f"heartbeat failed: {e}", extra={"action": "heartbeat_failed"})
            return
        finally:
            self._beat_done.set()
        self.live.progressed("heartbeat")
        lost = [(k, f) for k, f in held if k not in alive]
        if lost:
            try:
                alive |= (await self._reassert(lost)).keys()
            except EXPECTED_ERRORS as e:
                log.warning(f"heartbeat failed: {e}", extra={"action": "heartbeat_failed"})
                return
        for k, fence in held:
            r = self.running.get(k)
            if r is None or r.claimed.fence != fence:
                continue
            if k in alive:
                r.deadline = max(r.deadline, sent + lease)
            elif not (r.completing or r.ctx.completed_in_transaction):
                self._cancel(r, ABORT_LEASE_LOST, "a heartbeat renewed nothing")

    async def _reassert(self, lost: list[tuple[str, int]]) -> dict[str, Restored]:
        """Claims (key, fence) that a fenced write found missing: restore those the store
        forgot (a failover lost the commits that made them; see OccurrenceReassert), so an
        attempt that ran is recorded as itself, attempt number and all. Returns the keys
        restored with their rows (each attempt takes its row's id and instant: its later
        writes go by them); the others lost their lease."""
        held = []
        for k, f in lost:
            r = self.running.get(k)
            if r is not None and r.claimed.fence == f:
                started = r.start_lag is not None or r.claimed.started_at is not None
                held.append((k, f, r.claimed.attempt, started))
        back = await dispatch.reassert(
            self.db, worker_id=self.id, held=held, lease_seconds=self.settings.lease_seconds
        )
        for k, row in back.items():
            r = self.running.get(k)
            if r is not None:
                r.ctx.occurrence_id, r.instant = row.id, row.scheduled_for
        if back:
            log.warning(
                "re-asserted claims the database had forgotten (a failover lost its last commits)",
                extra={"action": "claims_reasserted", "n": len(back), "keys": sorted(back)[:5]},
            )
        return back

    async def _watchdog_loop(self) -> None:
        """Self-fencing: abandon attempts whose lease may have run out unrenewed."""
        lease = self.settings.lease_seconds
        margin = self_fence_margin(lease)
        while True:
            # Tick well inside the margin: a tick longer than the margin could notice an
            # unrenewed lease only after it ran out (lease 1.5 s: margin 0.15 s, tick 0.075 s).
            await asyncio.sleep(min(0.25, margin / 2))
            now = time.monotonic()
            if now < self._earliest_deadline - margin:
                continue  # no lease near its end: reading 25,000 attempts 4 times a second
            earliest = math.inf
            for r in list(self.running.values()):
                if r.completing or r.abort is not None:
                    continue
                if not self._lease_held(r, now):
                    self._cancel(
                        r, ABORT_SELF_FENCE, "no heartbeat renewed the lease within its term"
                    )
                if r.abort is None:  # held, or not cancellable yet: read it again
                    earliest = min(earliest, r.deadline)
            self._earliest_deadline = earliest

    def _time_out(self, r: _Running) -> None:
        """Its timeout came while its target runs: stop the target (the attempt records
        the timeout); not an attempt already cancelled for another reason."""
        if r.task is None or r.task.done() or r.abort is not None or r.completing:
            return
        r.timed_out = True
        r.task.cancel()

    def _cancel(self, r: _Running, why: str, detail: str) -> None:
        """Abort an attempt at once: flag for sync handlers, task cancellation for the rest
        (a sync handler's thread also gets LeaseLost raised inside it)."""
        if r.task is None or r.task.done() or r.abort is not None or r.completing:
            return
        # A give-back cancels thousands at once: _give_back logs one line for them.
        log.log(
            logging.DEBUG if why == ABORT_GIVE_BACK else logging.WARNING,
            "cancelling attempt"
            if why in (ABORT_SHUTDOWN, ABORT_RELEASE)
            else ("LeaseLost: aborting attempt"),
            extra={
                "action": why,
                "key": r.claimed.key,
                "fence": r.claimed.fence,
                "attempt": r.claimed.attempt,
                "why": detail,
            },
        )
        r.abort = why
        r.ctx.cancel()
        r.task.cancel()

    # -- registry ---------------------------------------------------------------------

    async def _register(self) -> None:
        if self.live.stalled():
            return  # a stalled worker does not look healthy in the registry either
        with contextlib.suppress(DatabaseError):
            await processes.heartbeat(
                self.db,
                this_process(
                    self.id,
                    "worker",
                    pool=self.settings.pool,
                    concurrency=self.settings.concurrency,
                    running=len(self.running),
                ),
            )

    async def _registry_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            await self._register()


POLICY_REASONS = frozenset({"EgressDenied", "PoolNotAllowed", "HandlerNotAllowed"})


@dataclass(frozen=True)
class _View:
    """Namespace and pool policies as last read from the store."""

    namespaces: dict[str, store_policies.NamespacePolicy]
    pool_rows: list[tenancy.PoolPolicy]
    judged: dict[tuple[str, str | None], EgressPolicy | tenancy.Refusal] = field(
        default_factory=dict
    )
    """Worker._policy's decisions under this view, by (namespace, handler): the only cache
    of them, so `labels` and `egress` work each namespace out anew when asked."""

    def labels(self, namespace: str) -> dict[str, str]:
        row = self.namespaces.get(namespace)
        return dict(row.labels) if row is not None else {}

    def egress(self, namespace: str) -> NamespaceEgress | None:
        row = self.namespaces.get(namespace)
        ann = {}
        if row is not None:
            ann = {
                k: v
                for k, v in (
                    (ALLOW_ANNOTATION, row.egress_allow),
                    (DENY_ANNOTATION, row.egress_deny),
                )
                if v is not None
            }
        try:
            return NamespaceEgress.from_annotations(namespace, ann) if ann else None
        except EgressDenied:
            # An annotation that does not parse denies everything rather than nothing.
            return NamespaceEgress(namespace, allow=Rules())


class _Tenancy:
    """Reads the policies the operator syncs, at most once per policy_refresh_seconds."""

    def __init__(self, db: Database, settings: WorkerSettings):
        self.db, self.settings = db, settings
        self._view: _View | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def view(self) -> _View:
        if self._view is not None and time.monotonic() - self._at < (
            self.settings.policy_refresh_seconds
        ):
            return self._view
        async with self._lock:
            if self._view is None or time.monotonic() - self._at >= (
                self.settings.policy_refresh_seconds
            ):
                ns = await store_policies.list_namespaces(self.db)
                pools = await store_policies.list_pool(self.db, pool=self.settings.pool)
                self._view = _View(
                    {r.namespace: r for r in ns},
                    [tenancy.PoolPolicy.from_row(r) for r in pools],
                )
                self._at = time.monotonic()
        return self._view


#: Outcomes are counted in memory and reach the metrics at most this long after (in one
#: update per outcome kind): three locked metric updates per occurrence were ~3-7 us of a
#: worker's ~0.1 ms per occurrence in a burst; a scrape every few seconds sees no difference.
METRICS_FLUSH_SECONDS = 0.5


class _PoolMetrics:
    """The worker's metric children for its pool, resolved once: `.labels(pool)` per
    attempt was 4-8% of a worker's CPU in a burst. Outcomes are batched (`count`)."""

    def __init__(self, metrics: Metrics, pool: str):
        self._metrics, self._pool = metrics, pool
        self.start_lag = metrics.start_lag.labels(pool)
        self.lease_lost = metrics.lease_lost.labels(pool)
        self.fence_rejections = metrics.fence_rejections.labels(pool)
        self.running = metrics.running.labels(pool)
        self.utilisation = metrics.utilisation.labels(pool)
        self._outcomes: dict[str, Any] = {}
        self._pending: dict[str, int] = {}
        self._gauges = (0, 0.0)
        self._flush: asyncio.TimerHandle | None = None

    def count(self, result: str, running: int, utilisation: float) -> None:
        """Count one outcome, with the running attempts and utilisation after it: they
        reach the metrics within METRICS_FLUSH_SECONDS."""
        self._pending[result] = self._pending.get(result, 0) + 1
        self._gauges = (running, utilisation)
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(METRICS_FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        """Add the outcomes counted since the last flush, one update per kind."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        pending, self._pending = self._pending, {}
        for result, n in pending.items():
            self.outcome(result).inc(n)
            if result == "lease_lost":
                self.lease_lost.inc(n)
            elif result == "stale":
                self.fence_rejections.inc(n)
        self.running.set(self._gauges[0])
        self.utilisation.set(self._gauges[1])

    def outcome(self, result: str) -> Any:
        child = self._outcomes.get(result)
        if child is None:
            child = self._outcomes[result] = self._metrics.outcomes.labels(self._pool, result)
        return child
