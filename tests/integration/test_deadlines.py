"""A silent or demoted database never wedges a process (invariant 9): every call has a
deadline and a connection that misses it is dropped, a connection that answers read-only
is dropped, every connection gets keepalives and a per-host connect timeout, and a worker
whose writers make no progress stops renewing its leases and fails /healthz."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import signal
import time
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cronwell.embedded import free_port
from cronwell.errors import DatabaseUnavailable
from cronwell.liveness import Liveness
from cronwell.metrics import Metrics
from cronwell.store import fences
from cronwell.store.db import IDLE_MARGIN_SECONDS, Database, connection_options
from cronwell_worker.runtime import ABORT_SELF_FENCE
from tests.helpers.wait import wait_for

from .helpers import sql
from .test_fence_epoch import claim
from .worker_helpers import CONTROL, handler_job, occurrence, running_worker, started, trigger


async def backend_pid(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT pg_backend_pid() AS pid")
        row = await cur.fetchone()
        assert row is not None
        return int(row["pid"])


async def test_a_call_to_a_silent_server_fails_at_its_deadline(db_url: str) -> None:
    """The server process behind the pool's one connection stops (as a frozen primary: the
    kernel still acknowledges, nothing answers). The call fails at its deadline instead of
    waiting for ever, and the next checkout gets a new connection that works."""
    async with Database(db_url, max_size=1, deadline_seconds=1.0) as db:
        pid = await backend_pid(db)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(DatabaseUnavailable, match="no answer from the database within 1s"):
                async with asyncio.timeout(20):  # the old code waited here for ever
                    async with db.connection() as conn:
                        await conn.execute("SELECT 1")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await backend_pid(db) != pid


class HandshakeThenSilence:
    """A TCP proxy to the test server whose first `freeze` connections pass the startup and
    authentication through, then forward nothing more the client sends (a server gone
    silent between a new connection's handshake and its first statement); the ones after
    them pass everything. `frozen`: connections frozen so far."""

    def __init__(self, port: int, freeze: int) -> None:
        self.port, self.freeze, self.frozen, self._seen = port, freeze, 0, 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._tasks:
            t.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port)
        self._seen += 1
        freezes = self._seen <= self.freeze
        ready = asyncio.Event()  # set once the handshake is over, if this one freezes

        async def to_server() -> None:
            while data := await reader.read(65536):
                if not ready.is_set():
                    up_w.write(data)  # the startup packet and the password, if asked

        async def to_client() -> None:
            buf = b""
            while data := await up_r.read(65536):
                writer.write(data)
                buf += data
                while not ready.is_set() and len(buf) >= 5:  # type byte, int32 length
                    size = 1 + int.from_bytes(buf[1:5], "big")
                    if len(buf) < size:
                        break
                    if buf[:1] == b"Z" and freezes:  # ReadyForQuery: the handshake is over
                        ready.set()
                        self.frozen += 1
                    buf = buf[size:]

        for coro in (to_server(), to_client()):
            task = asyncio.create_task(coro)
            self._tasks.add(task)


async def test_a_server_silent_after_the_handshake_costs_a_new_connection_its_deadline(
    db_url: str,
) -> None:
    """A new connection's first statement (its server-side bounds, run by the pool's
    `configure` outside any checkout) is under the deadline too: the connection that met a
    server silent after its handshake is dropped at the deadline and the pool connects
    again, instead of its connecting worker waiting for ever (the pool then never opened,
    whatever the server did next)."""
    proxy = HandshakeThenSilence(int(conninfo_to_dict(db_url)["port"]), freeze=1)
    async with proxy as proxy_port:
        url = make_conninfo(db_url, port=proxy_port, sslmode="disable", gssencmode="disable")
        async with (
            asyncio.timeout(30),
            Database(url, max_size=1, deadline_seconds=1.0, connect_timeout_seconds=10) as db,
        ):
            assert await backend_pid(db) > 0  # the old code: cannot connect (PoolTimeout)
    assert proxy.frozen == 1


async def test_a_read_only_answer_drops_the_connection(db_url: str) -> None:
    """A connection that answers read-only (a demoted primary, a standby) is an unavailable
    database, retried by the loops, and is never handed out again."""
    async with Database(db_url, max_size=1) as db:
        async with db.connection() as conn:
            await conn.execute("SET default_transaction_read_only = on")
        pid = await backend_pid(db)
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            await fences.write(db, resource="r", fence=1)
        assert await backend_pid(db) != pid
        assert await fences.write(db, resource="r", fence=1)


async def test_every_connection_gets_keepalives_and_a_per_host_timeout(db: Database) -> None:
    async with db.connection() as conn:
        opts = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    assert opts["connect_timeout"] == "3"
    assert opts["keepalives_idle"] == "10"
    assert opts["tcp_user_timeout"] == "15000"
    assert opts["target_session_attrs"] == "read-write"
    # What the URL says wins.
    own = connection_options("postgresql://u@h1:1,h2:2/db?connect_timeout=7&keepalives=0")
    assert "connect_timeout" not in own and "keepalives" not in own
    assert own["target_session_attrs"] == "read-write"


async def test_the_server_holds_the_same_bounds_on_its_side(db: Database) -> None:
    """The server's session gets the client's keepalives and user timeout, and ends a
    transaction left idle past the connection's deadline plus the margin."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT current_setting('tcp_keepalives_idle') AS idle,"
            " current_setting('tcp_keepalives_interval') AS interval,"
            " current_setting('tcp_keepalives_count') AS count,"
            " current_setting('tcp_user_timeout') AS user_timeout,"
            " current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction,"
            " current_setting('statement_timeout') AS statement,"
            " current_setting('client_connection_check_interval') AS check_interval"
        )
        got = await cur.fetchone()
    bound = f"{int(db.deadline_seconds + IDLE_MARGIN_SECONDS)}s"
    assert got == {
        "idle": "10",
        "interval": "3",
        "count": "3",
        "user_timeout": "15000",
        "idle_in_transaction": bound,
        "statement": bound,
        "check_interval": "1s",
    }


async def test_sessions_run_in_utc_whatever_the_servers_zone(db_url: str) -> None:
    """SessionBounds sets TimeZone UTC: psycopg then returns timestamptz values with
    `datetime.timezone.utc`, not through zoneinfo as for any other zone name (Etc/UTC,
    or a server default like the one this session starts with)."""
    url = make_conninfo(db_url, options="-c TimeZone=America/New_York")
    async with Database(url, max_size=1) as db, db.connection() as conn:
        cur = await conn.execute("SELECT current_setting('TimeZone') AS tz, now() AS at")
        got = await cur.fetchone()
    assert got is not None
    assert got["tz"] == "UTC"
    assert got["at"].tzinfo is datetime.UTC


async def test_a_client_paused_mid_transaction_lets_go_of_its_locks(db_url: str) -> None:
    """A process stopped (SIGSTOP, a frozen host) between two statements of a transaction
    cannot run its own deadline: its session would hold the transaction's locks (a claim's
    rows, a completion's job counters) until the server noticed the client gone, two hours
    of keepalive by default. The server ends it past the deadline plus the margin: another
    session gets the lock, and the paused one finds its connection gone."""
    # The pool's connection without the store's client-side deadline: what a paused
    # process leaves behind (its timers do not run).
    async with (
        Database(db_url, max_size=2, deadline_seconds=1.0) as db,
        db.pool.connection() as paused,
    ):
        await paused.execute("BEGIN")
        await paused.execute("SELECT pg_advisory_xact_lock(424242)")
        t0 = time.monotonic()
        async with db.connection(deadline_seconds=60) as other:
            await other.execute("SET lock_timeout = '30s'")  # the old code waited 30 s
            await other.execute("SELECT pg_advisory_lock(424242)")
            await other.execute("SELECT pg_advisory_unlock(424242)")
        waited = time.monotonic() - t0
        gone = (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)
        with pytest.raises(gone):
            await paused.execute("SELECT 1")
    assert waited < 30


BOUNDS = (
    "SELECT current_setting('idle_in_transaction_session_timeout') AS idle,"
    " current_setting('statement_timeout') AS statement"
)


async def bounds(conn: psycopg.AsyncConnection[Any]) -> tuple[str, str]:
    cur = await conn.execute(BOUNDS)
    row = await cur.fetchone()
    assert row is not None
    return row["idle"], row["statement"]


async def test_a_longer_deadline_gets_the_servers_bounds_of_its_own(db_url: str) -> None:
    """A handler's ctx.transaction() lasts up to its timeout, the history's conversion
    builds indexes for minutes on one connection outside a transaction: the server's idle
    and statement bounds follow the checkout's deadline, for its transaction or for the
    checkout, and the session's are back after it (one connection: the same session)."""
    async with Database(db_url, max_size=1, min_size=1) as db:
        session = (f"{int(db.deadline_seconds + IDLE_MARGIN_SECONDS)}s",) * 2
        wide = (f"{int(600 + IDLE_MARGIN_SECONDS)}s",) * 2
        async with db.transaction(deadline_seconds=600) as conn:
            assert await bounds(conn) == wide
        async with db.connection() as conn:
            assert await bounds(conn) == session
        async with db.connection(deadline_seconds=600) as conn:
            assert await bounds(conn) == wide
            await conn.execute("SELECT pg_sleep(0.01)")
        async with db.connection() as conn:
            assert await bounds(conn) == session
    # A widened checkout past its own deadline: the deadline's error, not the restore's.
    async with Database(db_url, max_size=1, min_size=1, deadline_seconds=1.0) as db:
        with pytest.raises(DatabaseUnavailable, match="within 2s"):
            async with db.connection(deadline_seconds=2.0) as conn:
                await conn.execute("SELECT pg_sleep(30)")
        async with db.connection() as conn:
            assert await bounds(conn) == (f"{int(1.0 + IDLE_MARGIN_SECONDS)}s",) * 2


async def test_a_statement_whose_client_dropped_it_ends_on_the_server(db_url: str) -> None:
    """A call past its deadline drops its connection; the server looks for its client
    while the statement runs and ends it within a second, instead of running it (and
    holding what it locked) to its end for nobody: here a 30 s sleep."""
    async with Database(db_url, max_size=1, deadline_seconds=1.0) as db:
        with pytest.raises(DatabaseUnavailable):
            async with db.connection() as conn:
                cur = await conn.execute("SELECT pg_backend_pid() AS pid")
                pid = (await cur.fetchone() or {})["pid"]
                await conn.execute("SELECT pg_sleep(30)")
        dropped = time.monotonic()
    async with Database(db_url, max_size=1) as watcher:

        async def ended() -> bool:
            rows = await sql(
                watcher, "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active'", pid
            )
            return not rows

        await wait_for(ended, 10, "the dropped client's statement to end on the server")
    assert time.monotonic() - dropped < 10


async def test_a_paused_clients_statement_waiting_on_a_lock_is_cancelled_by_the_server(
    db_url: str,
) -> None:
    """A process stopped while its statement waits for a lock cannot run its deadline:
    the server cancels the statement past the deadline plus the margin, and the locks its
    transaction holds go with the session's idle bound after it."""
    async with (
        Database(db_url, max_size=2, deadline_seconds=1.0) as db,
        db.pool.connection() as holder,
        db.pool.connection() as paused,  # no client-side deadline: a paused process's
    ):
        await holder.execute("SELECT pg_advisory_lock(434343)")
        t0 = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            await asyncio.wait_for(paused.execute("SELECT pg_advisory_lock(434343)"), 30)
        assert time.monotonic() - t0 >= 1.0 + IDLE_MARGIN_SECONDS - 0.5
        await holder.execute("SELECT pg_advisory_unlock(434343)")


async def test_the_servers_keepalives_follow_the_urls(db_url: str) -> None:
    """What the URL says wins on the server's side too."""
    async with (
        Database(f"{db_url}?keepalives_idle=30", max_size=1) as db,
        db.connection() as conn,
    ):
        cur = await conn.execute("SELECT current_setting('tcp_keepalives_idle') AS idle")
        assert (await cur.fetchone() or {})["idle"] == "30"


def test_liveness_names_the_loops_waiting_longer_than_the_stall() -> None:
    live = Liveness(stall_seconds=5)
    live.waiting("claim")
    live.waiting("completion")
    assert live.stalled() == []
    live._since["completion"] -= 10  # ten seconds pass without progress
    live.waiting("completion")  # a retry keeps the first start
    assert live.stalled() == ["completion"]
    assert live.stalled(among=("claim",)) == []
    live.progressed("completion")
    assert live.stalled() == []


async def test_a_stalled_writer_stops_lease_renewal(db: Database, db_url: str) -> None:
    """The completion writer has made no progress for longer than a lease (it waits on a
    silent primary) while heartbeats would succeed: the worker renews nothing, so the
    reaper hands the attempt to another worker, fenced."""
    await handler_job(db, "stuck", "t-wait-event")
    async with running_worker(db_url, lease_seconds=30) as w:
        key = await trigger(db, "stuck")
        await started(key)
        before = (await occurrence(db, key))["lease_expires_at"]
        await w.worker.heartbeat_once()
        renewed = (await occurrence(db, key))["lease_expires_at"]
        assert renewed > before
        w.worker.live._since["completion"] = time.monotonic() - 60  # stuck for two leases
        await w.worker.heartbeat_once()
        assert (await occurrence(db, key))["lease_expires_at"] == renewed
        w.worker.live.progressed("completion")
        w.worker.live._since["claim"] = time.monotonic() - 60  # a stalled claim: /healthz
        await w.worker.heartbeat_once()  # fails, but leases that can be recorded are kept
        assert (await occurrence(db, key))["lease_expires_at"] > renewed


async def test_healthz_fails_while_a_loop_is_stalled() -> None:
    stalled: list[str] = []
    port = free_port()
    Metrics().serve(port, addr="127.0.0.1", stalled=lambda: list(stalled))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        ok = await client.get("/healthz")
        assert (ok.status_code, ok.text) == (200, "ok\n")
        stalled.append("completion")
        bad = await client.get("/healthz")
        assert (bad.status_code, bad.text) == (503, "stalled: completion\n")
        assert (await client.get("/metrics")).status_code == 200


async def test_an_attempt_cancelled_before_it_ran_frees_its_slot(db: Database, db_url: str) -> None:
    """The watchdog may cancel an attempt before its task ever ran (a claim that waited for
    a connection arrives with its lease looking lapsed): its slot and entry are freed all
    the same. They leaked before, and a worker whose slots all leaked claimed nothing."""
    async with running_worker(db_url, lease_seconds=30, pool="elsewhere") as w:
        c = await claim(db, "early")  # of pool default: not this worker's to claim itself
        (job,) = await sql(db, "SELECT spec FROM cronwell_jobs WHERE id = %s", c.job_id)
        c = dataclasses.replace(c, spec=job["spec"])
        free = w.worker._free_slots()
        w.worker._start(c, time.monotonic() - 1)
        r = w.worker.running[c.key]
        w.worker._cancel(r, ABORT_SELF_FENCE, "its lease looked lapsed on arrival")
        await asyncio.sleep(0.1)
        assert c.key not in w.worker.running
        assert w.worker._free_slots() == free


COMPLETION = "%cronwell_occurrences o%SET state = 'succeeded'%"
"""The text of the completion batch statement, as pg_stat_activity shows it."""


async def _waits_on_lock(db: Database, query: str) -> bool:
    """Whether a statement whose text is LIKE `query` is waiting for a lock."""
    rows = await sql(
        db,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE %s",
        query,
    )
    return bool(rows[0]["n"])


async def _two_jobs(db: Database) -> None:
    for name in ("first", "second"):
        await handler_job(db, name, "t-wait-event")


async def _run_two(db: Database) -> tuple[str, str]:
    """Trigger both jobs and wait until both handlers run (each waits for its event)."""
    keys = await trigger(db, "first"), await trigger(db, "second")
    for k in keys:
        await started(k)
    return keys


async def test_a_heartbeat_does_not_wait_on_rows_its_worker_is_writing(
    db: Database, db_url: str
) -> None:
    """A completion batch is executing (here held up by a lock on its row) while the
    heartbeat runs: the heartbeat leaves that row alone and renews the others. Both lock
    several of the worker's rows, each in its own plan's order (over partitions not id
    order): the heartbeat that waited on the batch's rows deadlocked with it in the soak."""
    await _two_jobs(db)
    async with running_worker(db_url, lease_seconds=30) as w:
        done_key, other_key = await _run_two(db)
        before = (await occurrence(db, other_key))["lease_expires_at"]
        async with db.transaction() as conn:  # another session holds the finishing row
            await conn.execute(
                "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = %s FOR UPDATE",
                (done_key,),
            )
            CONTROL[done_key].set()  # its completion is written, and waits on that lock
            await wait_for(
                lambda: _waits_on_lock(db, COMPLETION), 15, "the completion to wait on the lock"
            )
            await asyncio.wait_for(w.worker.heartbeat_once(), 10)
        assert (await occurrence(db, other_key))["lease_expires_at"] > before
        CONTROL[other_key].set()
        await w.outcome(done_key)
        await w.outcome(other_key)
        assert (await occurrence(db, done_key))["state"] == "succeeded"


async def test_a_batch_write_waits_for_its_workers_heartbeat_statement(
    db: Database, db_url: str
) -> None:
    """The other half: while a heartbeat statement executes (here held up by a lock on one of
    its rows), a completion batch of the same worker does not start (it would take rows in
    another order than the heartbeat); it goes once the heartbeat ends."""
    await _two_jobs(db)
    async with running_worker(db_url, lease_seconds=30) as w:
        done_key, locked_key = await _run_two(db)
        async with db.transaction() as conn:
            await conn.execute(
                "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = %s FOR UPDATE",
                (locked_key,),
            )
            beat = asyncio.create_task(w.worker.heartbeat_once())
            await wait_for(
                lambda: _waits_on_lock(db, "%Extends the leases%"), 15, "the heartbeat to wait"
            )
            CONTROL[done_key].set()  # its completion is queued while the heartbeat executes
            await asyncio.sleep(1.5)
            assert not await _waits_on_lock(db, COMPLETION)
            assert (await occurrence(db, done_key))["state"] == "running"
        await asyncio.wait_for(beat, 10)
        await w.outcome(done_key)
        assert (await occurrence(db, done_key))["state"] == "succeeded"
        CONTROL[locked_key].set()
        await w.outcome(locked_key)
