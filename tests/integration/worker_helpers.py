"""Helpers for worker tests: an in-process Worker, a local HTTP server, marks written by
handlers, and the handlers themselves.

This module is also imported by worker *processes* (`cronwell worker --import
tests.integration.worker_helpers`), so the same handlers run in-process and out. Handlers
running in a process write their marks as JSON lines into $CRONWELL_TEST_MARKS/<pid>.jsonl;
in-process they go to the `MARKS` list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar

import psycopg

import cronwell
from cronwell import dispatch, jobs
from cronwell.egress import EgressPolicy
from cronwell.errors import LeaseLost
from cronwell.sdk import Context, StaleFence
from cronwell.secretbox import SecretBox
from cronwell.settings import WorkerSettings
from cronwell.store import attempts as attempts_store
from cronwell.store import claims, runs
from cronwell.store.db import Database
from cronwell_worker.runtime import Outcome, Worker
from tests.helpers.http import serve
from tests.helpers.wait import wait_for

from .helpers import make_job, sql

REPO = Path(__file__).resolve().parents[2]
HANDLERS_MODULE = "tests.integration.worker_helpers"
FAR_FUTURE = "0 0 1 1 *"  # once a year: jobs that only run when triggered
LOCAL_EGRESS = "127.0.0.1/32"
"""Tests' HTTP servers listen on 127.0.0.1, which the egress policy denies by default:
every test worker allows exactly this address, explicitly."""
T = TypeVar("T")

# -- store views ----------------------------------------------------------------------------


async def occurrence(db: Database, key: str) -> dict[str, Any]:
    row = await runs.get(db, key)
    assert row is not None, key
    return asdict(row)


async def attempts(db: Database, key: str) -> list[dict[str, Any]]:
    return [asdict(r) for r in await runs.attempts(db, key)]


async def state_is(db: Database, key: str, *states: str) -> dict[str, Any] | None:
    o = await occurrence(db, key)
    return o if o["state"] in states else None


async def handler_job(
    db: Database, name: str, handler: str, payload: dict[str, Any] | None = None, **spec: Any
) -> None:
    await make_job(
        db,
        name,
        schedule=FAR_FUTURE,
        target={"handler": {"name": handler, "payload": payload or {}}},
        **spec,
    )


async def trigger(db: Database, name: str) -> str:
    key, created = await jobs.trigger_job(db, namespace="default", name=name)
    assert created
    return key


async def _expire_and_reap(db: Database, conn: Any, key: str) -> int:
    cur = await conn.execute(
        "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = %s AND state = 'running' RETURNING id",
        (key,),
    )
    (row,) = await cur.fetchall()
    reaped = await attempts_store.reap_leases(db, limit=100, conn=conn)
    assert [r.state for r in reaped if r.idempotency_key == key] == ["pending"]
    occurrence_id: int = row["id"]
    return occurrence_id


async def requeue(db: Database, key: str) -> None:
    """The attempt's lease runs out (time passing) and the reaper's query requeues it, in
    one transaction (so no heartbeat renews the lease in between)."""
    async with db.transaction() as conn:
        await _expire_and_reap(db, conn, key)


async def steal(db: Database, key: str, worker_id: str = "thief") -> dispatch.Claimed:
    """Another worker takes the occurrence over: its lease is made to run out (time passing),
    then the reaper's query requeues it and the claim's query hands it to `worker_id` with a
    new fence, in one transaction (so the worker under test cannot claim it back between)."""
    async with db.transaction() as conn:
        oid = await _expire_and_reap(db, conn, key)
        (r,) = await claims.start(
            db, [oid], worker_id=worker_id, lease_seconds=60, row=dispatch.Claimed, conn=conn
        )
    return dispatch.arrived(r)


async def started(key: str, timeout: float = 10.0) -> dict[str, Any]:
    """The last 'start' mark of an in-process handler for `key`."""

    async def found() -> dict[str, Any] | None:
        ms = marks_of(None, "start", key)
        return ms[-1] if ms else None

    return await wait_for(found, timeout, f"{key} to start")


EFFECTS_DDL = (
    "CREATE TABLE test_effects (id serial PRIMARY KEY, key text NOT NULL, fence bigint NOT NULL,"
    " attempt int NOT NULL, pid int NOT NULL, tag text)"
)


# -- an in-process worker ---------------------------------------------------------------


@dataclass
class RunningWorker:
    worker: Worker
    db: Database
    task: asyncio.Task[None]
    outcomes: list[Outcome] = field(default_factory=list)

    def results(self, key: str) -> list[str]:
        return [o.result for o in self.outcomes if o.claimed.key == key]

    async def outcome(self, key: str, timeout: float = 15.0) -> Outcome:
        async def found() -> Outcome | None:
            return next((o for o in self.outcomes if o.claimed.key == key), None)

        return await wait_for(found, timeout, f"an outcome for {key}")


@contextlib.asynccontextmanager
async def running_worker(
    db_url: str,
    *,
    worker_id: str | None = None,
    egress: EgressPolicy | None = None,
    secrets: SecretBox | None = None,
    **settings: Any,
) -> AsyncIterator[RunningWorker]:
    settings.setdefault("lease_seconds", 2.0)
    settings.setdefault("poll_seconds", 0.2)
    settings.setdefault("shutdown_grace_seconds", 5.0)
    async with Database(db_url, max_size=10) as wdb:
        outcomes: list[Outcome] = []
        if egress is None:
            egress = EgressPolicy.from_lists(allow_cidrs=[LOCAL_EGRESS])
        w = Worker(
            wdb,
            WorkerSettings(**settings),
            worker_id=worker_id,
            on_outcome=outcomes.append,
            egress=egress,
            secrets=secrets,
        )
        task = asyncio.create_task(w.run())
        rw = RunningWorker(w, wdb, task, outcomes)
        try:
            yield rw
        finally:
            w.stop()
            try:
                await asyncio.wait_for(asyncio.shield(task), 20)
            except TimeoutError:
                w.stop()
                await asyncio.wait_for(task, 10)


# -- a local HTTP server --------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpServer:
    url: str
    requests: list[Request]
    statuses: list[int]
    """Answers to give, in order; then the status a path /status/NNN names, else 200."""

    @property
    def base(self) -> str:
        return self.url.rsplit("/", 1)[0]


@contextlib.contextmanager
def http_server(statuses: list[int] | None = None) -> Iterator[HttpServer]:
    """A real HTTP server on 127.0.0.1 in a thread, recording every request."""
    state = HttpServer("", [], list(statuses or []))
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        def _any(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            with lock:
                state.requests.append(
                    Request(self.command, self.path, dict(self.headers.items()), body)
                )
                if state.statuses:
                    status = state.statuses.pop(0)
                elif self.path.startswith("/status/"):
                    status = int(self.path.rsplit("/", 1)[1])
                else:
                    status = 200
            payload = b'{"ok": true}' if status < 300 else b'{"error": "test"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = serve("127.0.0.1", H)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# -- marks written by handlers ------------------------------------------------------------

MARKS: list[dict[str, Any]] = []


def mark(event: str, ctx: Context, **data: Any) -> None:
    doc = {
        "event": event,
        "key": ctx.key,
        "fence": ctx.fence,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "t": time.monotonic(),
    } | data
    where = os.environ.get("CRONWELL_TEST_MARKS")
    if where:
        with open(Path(where) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(doc) + "\n")
    else:
        MARKS.append(doc)


def read_marks(where: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in where.glob("*.jsonl"):
        out += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda m: m["t"])


def marks_of(where: Path | None, event: str, key: str | None = None) -> list[dict[str, Any]]:
    ms = read_marks(where) if where is not None else list(MARKS)
    return [m for m in ms if m["event"] == event and (key is None or m["key"] == key)]


# -- handlers (payload drives their behaviour; attempt 1 is the one that stalls) ---------


async def _insert_effect(conn: Any, ctx: Context, tag: str) -> None:
    await conn.execute(
        "INSERT INTO test_effects (key, fence, attempt, pid, tag) VALUES (%s, %s, %s, %s, %s)",
        (ctx.key, ctx.fence, ctx.attempt, os.getpid(), tag),
    )


@cronwell.handler("t-sleepy-effect")
async def sleepy_effect(ctx: Context) -> None:
    """Attempt 1 sleeps `sleep` seconds; then the effect is written on its own connection
    and the runtime completes the attempt (batched, fenced)."""
    mark("start", ctx)
    if ctx.attempt == 1:
        await asyncio.sleep(float(ctx.payload.get("sleep", 0)))
    assert ctx.db is not None
    async with await psycopg.AsyncConnection.connect(ctx.db.url, autocommit=True) as conn:
        await _insert_effect(conn, ctx, "sleepy")
    mark("done", ctx)


@cronwell.handler("t-outbox-effect")
async def outbox_effect(ctx: Context) -> None:
    """Effect + outbox message + completion in one transaction. Attempt 1 can hang inside
    the transaction (`hang`) or raise inside it (`raise`)."""
    mark("start", ctx)
    async with ctx.transaction() as conn:
        await _insert_effect(conn, ctx, "outbox")
        await ctx.outbox("effects", {"key": ctx.key, "attempt": ctx.attempt})
        if ctx.attempt == 1 and ctx.payload.get("hang"):
            mark("in-transaction", ctx)
            await asyncio.sleep(60)
        if ctx.attempt == 1 and ctx.payload.get("raise"):
            raise RuntimeError("crash between effect and completion")
    mark("done", ctx)


async def _late_work(ctx: Context) -> None:
    if ctx.attempt == 1:
        await asyncio.sleep(float(ctx.payload.get("sleep", 0)))
    mark("resumed", ctx, cancelled=ctx.cancelled.is_set())
    assert ctx.db is not None
    # A fenced write to the user's resource, in the user's own transaction.
    try:
        async with await psycopg.AsyncConnection.connect(ctx.db.url) as conn:
            await ctx.fenced_write("resource-1", conn=conn)  # type: ignore[arg-type]
            await _insert_effect(conn, ctx, "fenced-write")
        mark("fenced-write-accepted", ctx)
    except StaleFence as e:
        mark("fenced-write-rejected", ctx, error=str(e))
    # Pretend this attempt never learned it was aborted: only the database's fence can stop
    # its completion now.
    ctx.cancelled.clear()
    # The effect + completion, fenced, in one transaction.
    try:
        async with ctx.transaction() as conn:
            await _insert_effect(conn, ctx, "completion")
        mark("completed", ctx)
    except LeaseLost as e:
        mark("completion-rejected", ctx, error=str(e))


_ORPHANS: set[asyncio.Task[None]] = set()


@cronwell.handler("t-stubborn-write")
async def stubborn_write(ctx: Context) -> None:
    """Like a worker that cannot be interrupted: its work runs to the end even when the
    runtime aborts the attempt (shielded), so its late writes reach the database."""
    mark("start", ctx)
    work = asyncio.ensure_future(_late_work(ctx))
    _ORPHANS.add(work)
    work.add_done_callback(_ORPHANS.discard)
    await asyncio.shield(work)


CONTROL: dict[str, Any] = {}
"""In-process handlers' switches, set by tests."""


@cronwell.handler("t-fail-while")
async def fail_while(ctx: Context) -> None:
    """Raises while CONTROL[<job name>] is truthy; counts calls."""
    CONTROL[f"calls:{ctx.name}"] = CONTROL.get(f"calls:{ctx.name}", 0) + 1
    if CONTROL.get(ctx.name, True):
        raise RuntimeError(f"{ctx.name} is failing on purpose (attempt {ctx.attempt})")


@cronwell.handler("t-noop")
async def noop(ctx: Context) -> None:
    """Does nothing (bursts)."""


@cronwell.handler("t-clock")
async def clock(ctx: Context) -> None:
    """Marks its start first thing (the mark's `t` is this process's monotonic clock), then
    what the database says of its occurrence at that moment (`started_at` recorded yet?)."""
    mark("start", ctx)
    assert ctx.db is not None
    async with await psycopg.AsyncConnection.connect(ctx.db.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT started_at FROM cronwell_occurrences WHERE idempotency_key = %s", (ctx.key,)
        )
        row = await cur.fetchone()
    assert row is not None
    mark("row", ctx, started_at=row[0].isoformat() if row[0] is not None else None)


async def burst_in(db: Database, name: str, n: int, seconds: float) -> None:
    """n occurrences of job `name` (overlap Allow) due at one instant `seconds` from now,
    as the scheduler leaves a burst: pending, materialised ahead."""
    await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at,"
        " state, overlap, delivery, max_attempts, timeout_seconds)"
        " SELECT j.id || ':' || i, j.id, 'default', t, t, 'pending', 'Allow', 'AtLeastOnce',"
        " 3, 60 FROM cronwell_jobs j,"
        " (SELECT date_trunc('milliseconds', now() + make_interval(secs => %s)) t) s,"
        " generate_series(1, %s) i WHERE j.name = %s",
        seconds,
        n,
        name,
    )


async def due_in(db: Database, key: str, seconds: float) -> tuple[datetime, float]:
    """Move a pending occurrence's instant (run_at) to `seconds` from now. Returns the new
    instant and the earliest local monotonic instant at which the database clock can read
    it (the clock was read after the local clock was: a start before this is early)."""
    sent = time.monotonic()
    rows = await sql(
        db,
        "UPDATE cronwell_occurrences SET run_at = clock_timestamp() + make_interval(secs => %s)"
        " WHERE idempotency_key = %s AND state = 'pending'"
        " RETURNING run_at, clock_timestamp() AS db_now",
        seconds,
        key,
    )
    (row,) = rows
    return row["run_at"], sent + (row["run_at"] - row["db_now"]).total_seconds()


@cronwell.handler("t-seen-completions")
async def seen_completions(ctx: Context) -> None:
    """Marks its start with how many successes the in-process worker had reported by then
    (CONTROL["outcomes"], the test's on_outcome list: a success is reported once its
    completion is written)."""
    done = CONTROL.get("outcomes", [])
    mark("start", ctx, succeeded=sum(1 for o in done if o.result == "succeeded"))


@cronwell.handler("t-die-first")
async def die_first(ctx: Context) -> None:
    """Attempt 1 kills its own worker process (-9) the moment it starts, before anything
    else can be written; a later attempt writes its effect. Only in a worker process."""
    mark("start", ctx)
    if ctx.attempt == 1 and os.environ.get("CRONWELL_TEST_MARKS"):
        os.kill(os.getpid(), 9)
    assert ctx.db is not None
    async with await psycopg.AsyncConnection.connect(ctx.db.url, autocommit=True) as conn:
        await _insert_effect(conn, ctx, "after-kill")


@cronwell.handler("t-wait-event")
async def wait_event(ctx: Context) -> None:
    """Blocks until CONTROL[<key>] (an asyncio.Event) is set; marks cancellation."""
    ev: asyncio.Event = CONTROL.setdefault(ctx.key, asyncio.Event())
    mark("start", ctx)
    try:
        await ev.wait()
    except asyncio.CancelledError:
        mark("cancelled", ctx, flag=ctx.cancelled.is_set())
        raise
    mark("done", ctx)


@cronwell.handler("t-sync-spin")
def sync_spin(ctx: Context) -> None:
    """A sync handler that never looks at ctx.cancelled: only the exception injected into
    its thread can stop it."""
    mark("start", ctx)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.005)
    except LeaseLost:
        mark("injected", ctx, flag=ctx.cancelled.is_set())
        raise
    mark("done", ctx)


@cronwell.handler("t-sync-polite")
def sync_polite(ctx: Context) -> None:
    """A sync handler that polls ctx.cancelled (and catches everything, injection too)."""
    mark("start", ctx)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if ctx.cancelled.wait(0.01):
                mark("saw-flag", ctx)
                return
        except Exception:  # swallows the injected LeaseLost: only the flag stops it
            continue
    mark("done", ctx)


def worker_env(db_url: str, marks: Path, **extra: str) -> dict[str, str]:
    env = {
        "CRONWELL_DATABASE_URL": db_url,
        "CRONWELL_TEST_MARKS": str(marks),
        "CRONWELL_LOG_LEVEL": "INFO",
        "CRONWELL_EGRESS_ALLOW_CIDRS": LOCAL_EGRESS,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "worker")]),
    }
    return env | extra


OUTBOX_SEEN: list[str] = []


def record_outbox(m: Any) -> None:
    """An outbox hook for `cronwell outbox-relay --hook` (sync: runs in a thread)."""
    OUTBOX_SEEN.append(m.idempotency_key)
