"""Worker *processes* (`python -m cronwell worker`) killed with -9, paused with SIGSTOP and
stopped with SIGTERM, against the real PostgreSQL. The reaper (the scheduler's job in
production) is called by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from cronwell import maintenance
from cronwell.store.db import Database
from tests.helpers.procs import spawn, stop
from tests.helpers.wait import wait_for

from .helpers import sql
from .worker_helpers import (
    EFFECTS_DDL,
    HANDLERS_MODULE,
    attempts,
    due_in,
    handler_job,
    http_server,
    marks_of,
    occurrence,
    read_marks,
    state_is,
    trigger,
    worker_env,
)

pytestmark = pytest.mark.slow

LEASE = "2"


def _worker(db_url: str, marks: Path, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return spawn(
        "--database-url",
        db_url,
        "worker",
        "--lease-seconds",
        LEASE,
        "--import",
        HANDLERS_MODULE,
        *args,
        env=worker_env(db_url, marks, **env),
        log=log,
    )


async def _mark(marks: Path, event: str, key: str, timeout: float = 20.0) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        ms = marks_of(marks, event, key)
        return ms[-1] if ms else None

    return await wait_for(found, timeout, f"mark {event!r} of {key}")


async def _reap_until(db: Database, key: str, timeout: float = 15.0) -> dict[str, Any]:
    """Run the reaper until it requeues `key` (only possible once its lease ran out)."""

    async def reaped() -> dict[str, Any] | None:
        rows = await maintenance.reap(db, limit=100)
        return next((asdict(r) for r in rows if r.idempotency_key == key), None)

    return await wait_for(reaped, timeout, f"the reaper to requeue {key}")


async def _rerun_after_lease_expired(db: Database, key: str) -> dict[str, Any]:
    """The reaper requeues `key` as an attempt that ran (LeaseExpired); a taker runs it to
    success. Returns the succeeded occurrence."""
    r = await _reap_until(db, key)
    assert (r["state"], r["reason"]) == ("pending", "LeaseExpired")
    return await wait_for(lambda: state_is(db, key, "succeeded"), 20, "the taker to succeed")


async def _worker_a_runs(
    db: Database, db_url: str, tmp_path: Path, name: str, handler: str, payload: dict[str, Any]
) -> tuple[str, Path, subprocess.Popen[bytes]]:
    """The effects table, job `name` triggered, and worker A (a.log) started to run it:
    its key, the marks dir and A."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, name, handler, payload=payload)
    key = await trigger(db, name)
    marks = tmp_path / "marks"
    marks.mkdir()
    return key, marks, _worker(db_url, marks, tmp_path / "a.log")


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else "(no log)"


async def test_kill_minus_nine_mid_job_another_worker_takes_over(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    key, marks, a = await _worker_a_runs(
        db, db_url, tmp_path, "victim", "t-sleepy-effect", {"sleep": 60}
    )
    b: subprocess.Popen[bytes] | None = None
    try:
        first = await _mark(marks, "start", key)
        assert first["pid"] == a.pid
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        b = _worker(db_url, marks, tmp_path / "b.log")
        o = await _rerun_after_lease_expired(db, key)
    finally:
        stop(a)
        rc = stop(b) if b is not None else None
    assert rc == 0, _log(tmp_path / "b.log")
    atts = await attempts(db, key)
    assert [(x["attempt"], x["outcome"]) for x in atts] == [
        (1, "lease_expired"),
        (2, "succeeded"),
    ]
    assert atts[0]["fence"] == first["fence"] < atts[1]["fence"] == o["fence"]
    assert atts[0]["worker_id"] != atts[1]["worker_id"]
    effects = await sql(db, "SELECT key, fence, pid FROM test_effects")
    assert effects == [{"key": key, "fence": o["fence"], "pid": b.pid if b else None}]
    # The taker deregistered on SIGTERM; the killed worker's row is just silent.
    procs = await sql(db, "SELECT pid FROM cronwell_processes WHERE role = 'worker'")
    assert procs == [{"pid": a.pid}]


async def test_kill_minus_nine_holding_occurrences_claimed_ahead_they_run_once(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """Worker A claims occurrences ahead of their instant and is killed (-9) before it: the
    reaper gives them back as never started (even AtMostOnce: not Ambiguous), at their
    instant, attempt unconsumed; worker B runs each once, not before its instant."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "least", "t-sleepy-effect")
    await handler_job(db, "most", "t-sleepy-effect", delivery="AtMostOnce")
    keys = [await trigger(db, "least"), await trigger(db, "most")]
    # Far enough ahead that A's lease (renewed until the kill) lapses before the instants
    # even when A starts slowly: a lease lapsing after an AtLeastOnce instant is an attempt
    # that may have run (the reaper's rule), not this test's never-started case.
    instants = {k: (await due_in(db, k, 25.0))[0] for k in keys}
    marks = tmp_path / "marks"
    marks.mkdir()
    a = _worker(db_url, marks, tmp_path / "a.log", "--claim-ahead-seconds", "30")
    b: subprocess.Popen[bytes] | None = None
    reaped: dict[str, Any] = {}
    try:

        async def held() -> bool:
            rows = await sql(
                db,
                "SELECT 1 FROM cronwell_occurrences WHERE idempotency_key = ANY(%s)"
                " AND state = 'running' AND started_at IS NULL",
                keys,
            )
            return len(rows) == 2

        await wait_for(held, 20, "worker A to claim both ahead of their instant")
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        b = _worker(db_url, marks, tmp_path / "b.log")

        async def requeued() -> bool:
            for r in await maintenance.reap(db, limit=100):
                reaped[r.idempotency_key] = r
            return reaped.keys() >= set(keys)

        await wait_for(requeued, 15, "the reaper to requeue both")
        for k in keys:
            await wait_for(lambda k=k: state_is(db, k, "succeeded"), 45, f"{k} to succeed")
    finally:
        stop(a)
        rc = stop(b) if b is not None else None
    assert rc == 0, _log(tmp_path / "b.log")
    assert {(r.state, r.reason) for r in reaped.values()} == {("pending", "NotStarted")}, reaped
    for k in keys:
        assert [(x["attempt"], x["outcome"]) for x in await attempts(db, k)] == [(1, "succeeded")]
        o = await occurrence(db, k)
        assert o["started_at"] >= instants[k], "started before its instant"
        print(f"{k}: started {(o['started_at'] - instants[k]).total_seconds():.3f}s after it")
    effects = await sql(db, "SELECT key, pid FROM test_effects ORDER BY key")
    assert effects == [{"key": k, "pid": b.pid if b else None} for k in sorted(keys)]
    assert not [m for m in read_marks(marks) if m["pid"] == a.pid], "A ran something"


async def test_kill_minus_nine_as_an_at_least_once_start_with_no_write_it_counts_as_run(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """Worker A claims an AtLeastOnce occurrence ahead and starts it at its instant with no
    write; the handler kills A (-9) as it starts, so started_at is still NULL. Its instant
    came before its lease expired (A starts only while its lease is held): the reaper counts
    an attempt that may have run (LeaseExpired, attempt consumed, an attempt row), and
    worker B runs attempt 2."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "dies", "t-die-first")
    key = await trigger(db, "dies")
    # Far enough ahead that A, still importing on a loaded machine, claims it before it.
    run_at, _ = await due_in(db, key, 10.0)
    marks = tmp_path / "marks"
    marks.mkdir()
    a = _worker(db_url, marks, tmp_path / "a.log", "--claim-ahead-seconds", "30")
    b: subprocess.Popen[bytes] | None = None
    try:
        first = await _mark(marks, "start", key)
        assert first["pid"] == a.pid
        await asyncio.to_thread(a.wait, 10)
        (o,) = await sql(
            db,
            "SELECT state, claimed_at, run_at, started_at, lease_expires_at"
            " FROM cronwell_occurrences WHERE idempotency_key = %s",
            key,
        )
        assert (o["state"], o["started_at"]) == ("running", None), o
        assert o["claimed_at"] < o["run_at"] == run_at < o["lease_expires_at"], o
        b = _worker(db_url, marks, tmp_path / "b.log")
        done = await _rerun_after_lease_expired(db, key)
    finally:
        stop(a)
        rc = stop(b) if b is not None else None
    assert rc == 0, _log(tmp_path / "b.log")
    atts = await attempts(db, key)
    assert [(x["attempt"], x["outcome"], x["started_at"]) for x in atts] == [
        (1, "lease_expired", None),
        (2, "succeeded", done["started_at"]),
    ]
    assert atts[0]["fence"] == first["fence"] < atts[1]["fence"]
    effects = await sql(db, "SELECT fence, attempt, pid FROM test_effects")
    assert effects == [{"fence": done["fence"], "attempt": 2, "pid": b.pid if b else None}]


async def test_sigstop_past_the_lease_then_sigcont_late_writes_are_rejected(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """A paused worker wakes up after its occurrence was taken over and completed. Its
    attempt is aborted, and the work it still does (the handler shields it, like code that
    cannot be interrupted) is rejected: the fenced write by the resource's fence, the
    completion (with its effect) by the occurrence's fence."""
    key, marks, a = await _worker_a_runs(
        db, db_url, tmp_path, "paused", "t-stubborn-write", {"sleep": 3}
    )
    b: subprocess.Popen[bytes] | None = None
    try:
        first = await _mark(marks, "start", key)
        assert first["pid"] == a.pid
        os.kill(a.pid, signal.SIGSTOP)
        b = _worker(db_url, marks, tmp_path / "b.log")
        await _reap_until(db, key)
        o = await wait_for(lambda: state_is(db, key, "succeeded"), 20, "the taker to succeed")
        taker = o["fence"]
        assert await sql(db, "SELECT fence FROM cronwell_fences") == [{"fence": taker}]
        os.kill(a.pid, signal.SIGCONT)
        rejected = await _mark(marks, "completion-rejected", key)
        assert rejected["fence"] == first["fence"]
        assert "is stale; rolled back" in rejected["error"]  # the database said no

        async def aborted() -> bool:
            return "LeaseLost: aborting attempt" in _log(tmp_path / "a.log")

        await wait_for(aborted, 10, "worker A to abort its attempt")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(a.pid, signal.SIGCONT)
        rc_a = stop(a)
        rc_b = stop(b) if b is not None else None
    assert rc_a == 0, _log(tmp_path / "a.log")
    assert rc_b == 0, _log(tmp_path / "b.log")
    f1 = first["fence"]
    assert f1 < taker
    events = {
        (m["event"], m["fence"])
        for ev in (
            "fenced-write-accepted",
            "fenced-write-rejected",
            "completed",
            "completion-rejected",
        )
        for m in marks_of(marks, ev, key)
    }
    assert events == {
        ("fenced-write-accepted", taker),
        ("completed", taker),
        ("fenced-write-rejected", f1),
        ("completion-rejected", f1),
    }
    # Only the taker's effects exist; the taker's completion stands.
    effects = await sql(db, "SELECT fence, tag FROM test_effects ORDER BY id")
    assert effects == [
        {"fence": taker, "tag": "fenced-write"},
        {"fence": taker, "tag": "completion"},
    ]
    o = await occurrence(db, key)
    assert (o["state"], o["fence"]) == ("succeeded", taker)
    assert await sql(db, "SELECT fence FROM cronwell_fences") == [{"fence": taker}]
    atts = await attempts(db, key)
    assert [(x["attempt"], x["outcome"], x["fence"]) for x in atts] == [
        (1, "lease_expired", f1),
        (2, "succeeded", taker),
    ]
    log_a = _log(tmp_path / "a.log")
    assert "action=lease_lost" in log_a or "action=self_fenced" in log_a, log_a


async def test_sigterm_finishes_within_grace_cancels_the_rest_and_deregisters(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "short", "t-sleepy-effect", payload={"sleep": 1.0})
    await handler_job(db, "long", "t-sleepy-effect", payload={"sleep": 60})
    short, long = await trigger(db, "short"), await trigger(db, "long")
    marks = tmp_path / "marks"
    marks.mkdir()
    a = _worker(db_url, marks, tmp_path / "a.log", "--shutdown-grace-seconds", "2.5")
    try:
        await _mark(marks, "start", short)
        await _mark(marks, "start", long)
        (me,) = await sql(db, "SELECT id FROM cronwell_processes WHERE pid = %s", a.pid)
        listed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cronwell", "--database-url", db_url, "workers"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert listed.returncode == 0, listed.stderr
        (line,) = [ln for ln in listed.stdout.splitlines() if me["id"] in ln]
        # (RUNNING is refreshed every 5 s with the registry heartbeat: not asserted.)
        assert line.split()[1] == "default" and line.split()[-1] == "yes"
        a.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(a.wait, 20)
    finally:
        stop(a)
    assert rc == 0, _log(tmp_path / "a.log")
    assert (await occurrence(db, short))["state"] == "succeeded"
    o = await occurrence(db, long)
    assert (o["state"], o["reason"], o["attempt"]) == ("pending", "WorkerShutdown", 1)
    assert [x["outcome"] for x in await attempts(db, long)] == ["cancelled"]
    assert await sql(db, "SELECT id FROM cronwell_processes") == []


async def test_kill_inside_the_job_transaction_leaves_nothing_and_relay_publishes(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """Effect + outbox message + completion commit together: kill -9 inside the transaction
    leaves none of them; the retry commits all three once, and the relay running inside the
    taker (--outbox-url) publishes the message with its idempotency key."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "boxed", "t-outbox-effect", payload={"hang": True})
    key = await trigger(db, "boxed")
    marks = tmp_path / "marks"
    marks.mkdir()
    with http_server() as srv:
        a = _worker(db_url, marks, tmp_path / "a.log")
        b: subprocess.Popen[bytes] | None = None
        try:
            await _mark(marks, "in-transaction", key)
            os.kill(a.pid, signal.SIGKILL)
            a.wait()

            async def transaction_gone() -> bool:
                rows = await sql(
                    db,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state LIKE 'idle in transaction%%'",
                )
                return not rows

            await wait_for(transaction_gone, 10, "the killed worker's transaction to end")
            assert await sql(db, "SELECT id FROM test_effects") == []
            assert await sql(db, "SELECT id FROM cronwell_outbox") == []
            assert (await occurrence(db, key))["state"] == "running"
            b = _worker(db_url, marks, tmp_path / "b.log", "--outbox-url", srv.url)
            await _reap_until(db, key)
            o = await wait_for(lambda: state_is(db, key, "succeeded"), 20, "the retry")

            async def published() -> list[dict[str, Any]]:
                return await sql(db, "SELECT * FROM cronwell_outbox WHERE published_at IS NOT NULL")

            (box,) = await wait_for(published, 10, "the relay to publish")
        finally:
            stop(a)
            rc = stop(b) if b is not None else None
    assert rc == 0, _log(tmp_path / "b.log")
    assert await sql(db, "SELECT key, fence, attempt FROM test_effects") == [
        {"key": key, "fence": o["fence"], "attempt": 2}
    ]
    assert (box["idempotency_key"], box["topic"], box["payload"]) == (
        key,
        "effects",
        {"key": key, "attempt": 2},
    )
    assert srv.requests, "nothing was published"
    for req in srv.requests:  # at least once; every delivery carries the same key
        h = {k.lower(): v for k, v in req.headers.items()}
        assert h["idempotency-key"] == f"{key}:outbox:{box['id']}"
    assert [x["outcome"] for x in await attempts(db, key)] == ["lease_expired", "succeeded"]
