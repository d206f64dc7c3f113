"""`cronwell backfill` on a real PostgreSQL: absent instants are created and missed ones
re-opened under their real keys, everything else is left alone, a second backfill is a
no-op, workers run what it made, DST instants are the scheduler's, and user mistakes are
one clear line."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from click.testing import CliRunner, Result

from cronwell import dispatch, jobs, maintenance, schedule
from cronwell.backfill import backfill
from cronwell.cli import main
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database

from .helpers import db_now, make_job, occurrences, scheduler, set_cursor

H = timedelta(hours=1)


LONG_RETENTION = 10 * 365 * 86400.0
"""Windows of 2024 are older than the default retention, which backfill refuses."""


async def _cli(db_url: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["--database-url", db_url, *args],
        catch_exceptions=False,
        env={"CRONWELL_RETENTION_SECONDS": str(LONG_RETENTION)},
    )


async def _run_all(db: Database, pool: str = "default") -> list[str]:
    """Claim and succeed until nothing is claimable; the keys run, in order."""
    ran: list[str] = []
    for _ in range(50):
        claimed = await dispatch.claim(db, pool=pool, worker_id="w1", limit=100, lease_seconds=60)
        if not claimed:
            return ran
        done = await dispatch.succeed(db, [(c.id, c.fence) for c in claimed])
        assert done == {c.key for c in claimed}
        ran += [c.key for c in claimed]
    raise AssertionError("occurrences kept coming")


def _by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["idempotency_key"]: r for r in rows}


async def _history(db: Database) -> tuple[Any, datetime]:
    """An hourly job that ended an hour ago (H = this hour): the scheduler, back after an
    outage from H-4h, recorded H-4h .. H-1h as missed (misfirePolicy Skip); then H-4h and
    H-3h were backfilled and ran. H-6h and H-5h have no occurrence at all."""
    now = await db_now(db)
    top = now.replace(minute=0, second=0, microsecond=0)
    job = await make_job(
        db, "hourly", schedule="0 * * * *", misfirePolicy="Skip", endAt=(top - H).isoformat()
    )
    await set_cursor(db, "hourly", "date_trunc('hour', now()) - interval '4 hours'")
    s = await scheduler(db)
    await s.materialise_until_idle()
    rows = await occurrences(db, "hourly")
    assert [(r["scheduled_for"], r["state"]) for r in rows] == [
        (top - k * H, "missed") for k in (4, 3, 2, 1)
    ]
    first = await backfill(
        db, namespace="default", name="hourly", start=top - 4 * H, end=top - 3 * H
    )
    assert (len(first.created), len(first.reopened)) == (0, 2)
    assert len(await _run_all(db)) == 2
    return job, top


async def test_backfill_creates_absent_reopens_missed_and_leaves_the_rest(db: Database) -> None:
    job, top = await _history(db)
    key = {k: schedule.occurrence_key(job.id, top - k * H) for k in range(1, 7)}
    missed_before = (await store_jobs.list_live(db, namespace="default"))[0].missed_total
    assert missed_before == 2

    dry = await backfill(
        db, namespace="default", name="hourly", start=top - 6 * H, end=top - H, dry_run=True
    )
    assert sorted(dry.created) == sorted([key[6], key[5]])
    assert sorted(dry.reopened) == sorted([key[2], key[1]])
    assert len(await occurrences(db, "hourly")) == 4  # the dry run wrote nothing

    res = await backfill(db, namespace="default", name="hourly", start=top - 6 * H, end=top - H)
    assert res.instants == [top - k * H for k in (6, 5, 4, 3, 2, 1)]
    assert sorted(res.created) == sorted([key[6], key[5]])
    assert sorted(res.reopened) == sorted([key[2], key[1]])
    assert res.present == {"succeeded": 2}
    rows = _by_key(await occurrences(db, "hourly"))
    assert set(rows) == set(key.values())  # one row per instant, under its real key
    assert rows[key[6]]["origin"] == "backfill" and rows[key[6]]["state"] == "pending"
    assert rows[key[2]]["origin"] == "schedule" and rows[key[2]]["state"] == "pending"
    assert rows[key[2]]["finished_at"] is None
    assert (await store_jobs.list_live(db, namespace="default"))[0].missed_total == 0

    again = await backfill(db, namespace="default", name="hourly", start=top - 6 * H, end=top - H)
    assert (again.created, again.reopened) == ([], [])
    assert again.present == {"succeeded": 2, "pending": 4}

    # Workers run them one at a time (the job's policy is Skip: the backfill is buffered,
    # not skipped), oldest first, each once.
    ran = await _run_all(db)
    assert ran == [key[6], key[5], key[2], key[1]]
    rows = _by_key(await occurrences(db, "hourly"))
    assert {r["state"] for r in rows.values()} == {"succeeded"}
    assert all(r["attempt"] == 1 for r in rows.values())
    final = await backfill(db, namespace="default", name="hourly", start=top - 6 * H, end=top - H)
    assert (final.created, final.reopened, final.present) == ([], [], {"succeeded": 6})


async def test_backfill_cli_summary_and_dry_run(db: Database, db_url: str) -> None:
    _, top = await _history(db)
    t1, t2 = schedule.format_instant(top - 6 * H), schedule.format_instant(top - H)
    dry = await _cli(db_url, "backfill", "hourly", "--from", t1, "--to", t2, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "6 instant(s) in the window (dry run: nothing written)" in dry.output
    assert "would be created:   2" in dry.output and "would be re-opened: 2" in dry.output
    assert "already present, left alone: succeeded=2" in dry.output
    assert len(await occurrences(db, "hourly")) == 4
    done = await _cli(db_url, "backfill", "hourly", "-n", "default", "--from", t1, "--to", t2)
    assert done.exit_code == 0, done.output
    assert "  created:   2" in done.output and "  re-opened: 2" in done.output
    runs = await _cli(db_url, "runs", "--job", "hourly")
    assert runs.output.count(" backfill ") == 2 and runs.output.count(" pending ") == 4


async def test_backfill_uses_the_jobs_zone_and_dst_policy(db: Database) -> None:
    job = await make_job(
        db,
        "paris",
        schedule="30 2 * * *",
        timeZone="Europe/Paris",
        dstPolicy={"springForward": "RunAtGapEnd", "fallBack": "RunTwice"},
    )

    async def window(start: str, end: str) -> list[str]:
        res = await backfill(
            db,
            namespace="default",
            name="paris",
            start=datetime.fromisoformat(start),
            end=datetime.fromisoformat(end),
            retention_seconds=LONG_RETENTION,
        )
        assert sorted(res.created) == sorted(
            schedule.occurrence_key(job.id, t) for t in res.instants
        )
        return [schedule.format_instant(t) for t in res.instants]

    # Spring forward (31 March 2024): 02:30 does not exist, it runs at the gap's end 03:00.
    assert await window("2024-03-30T00:00:00Z", "2024-04-01T12:00:00Z") == [
        "2024-03-30T01:30:00Z",  # 02:30 CET
        "2024-03-31T01:00:00Z",  # 03:00 CEST, end of the gap
        "2024-04-01T00:30:00Z",  # 02:30 CEST
    ]
    # Fall back (27 October 2024): 02:30 happens twice, RunTwice runs both.
    assert await window("2024-10-26T00:00:00Z", "2024-10-28T12:00:00Z") == [
        "2024-10-26T00:30:00Z",
        "2024-10-27T00:30:00Z",  # 02:30 CEST
        "2024-10-27T01:30:00Z",  # 02:30 CET
        "2024-10-28T01:30:00Z",
    ]
    keys = {r["idempotency_key"] for r in await occurrences(db, "paris")}
    assert f"{job.id}:2024-03-31T01:00:00Z" in keys and f"{job.id}:2024-10-27T01:30:00Z" in keys


async def test_backfill_respects_start_and_end_of_the_job(db: Database) -> None:
    await make_job(
        db,
        "bounded",
        schedule="0 12 * * *",
        startAt="2024-05-03T00:00:00Z",
        endAt="2024-05-05T23:00:00Z",
    )
    res = await backfill(
        db,
        namespace="default",
        name="bounded",
        start=datetime(2024, 5, 1, tzinfo=UTC),
        end=datetime(2024, 5, 9, tzinfo=UTC),
        retention_seconds=LONG_RETENTION,
    )
    assert [t.day for t in res.instants] == [3, 4, 5]


async def test_backfill_mistakes_are_clear_messages(db: Database, db_url: str) -> None:
    await make_job(db, "minutely", schedule="* * * * *")
    await make_job(db, "held", schedule="0 * * * *", suspend=True)
    cases = [
        (("backfill", "nope", "--from", "2024-01-01", "--to", "2024-01-02"),
         "no ScheduledJob default/nope in the store"),
        (("backfill", "minutely", "--from", "2024-01-02", "--to", "2024-01-01"),
         "is after --to 2024-01-01T00:00:00Z: give the earlier instant first"),
        (("backfill", "minutely", "--from", "2024-01-01", "--to", "2024-01-02", "--max", "100"),
         "has more than 100 instants: narrow it"),
        (("backfill", "minutely", "--from", "2024-01-01", "--to", "2999-01-01"),
         "is in the future"),
        (("backfill", "minutely", "--from", "yesterday", "--to", "now"),
         "'yesterday': use ISO-8601"),
        (("backfill", "held", "--from", "2024-01-01", "--to", "2024-01-02"),
         "is suspended (spec.suspend)"),
    ]  # fmt: skip
    for args, message in cases:
        r = await _cli(db_url, *args)
        assert r.exit_code in (1, 2), (args, r.output)
        assert message in r.output, (args, r.output)
        assert "Traceback" not in r.output
    assert await occurrences(db, "minutely") == []
    # The default --max is 10,000 instants: 10,000 minutes pass, one more does not.
    ok = await _cli(db_url, "backfill", "minutely", "--from", "2024-01-01", "--to",
                    "2024-01-07T22:39:00Z", "--dry-run")  # fmt: skip
    assert ok.exit_code == 0 and "10000 instant(s)" in ok.output, ok.output
    over = await _cli(db_url, "backfill", "minutely", "--from", "2024-01-01", "--to",
                      "2024-01-07T22:40:00Z", "--dry-run")  # fmt: skip
    assert over.exit_code == 1 and "more than 10000 instants" in over.output


async def test_backfill_queued_behind_a_running_occurrence_is_not_stranded(db: Database) -> None:
    """A Skip job's manual run is running when its backfill is claimed: the backfilled
    (buffered) occurrences wait; the Skip run's completion promotes nothing, so the reaper
    starts the oldest, whose completion starts the next."""
    job, top = await _history(db)
    key, _ = await jobs.trigger_job(db, namespace="default", name="hourly", trigger_id="t1")
    (running,) = await dispatch.claim(
        db, pool="default", worker_id="w1", limit=10, lease_seconds=60
    )
    assert running.key == key
    res = await backfill(db, namespace="default", name="hourly", start=top - 6 * H, end=top - 5 * H)
    assert len(res.created) == 2
    assert (
        await dispatch.claim(db, pool="default", worker_id="w1", limit=10, lease_seconds=60) == []
    )
    assert {r["state"] for r in await occurrences(db, "hourly") if r["origin"] == "backfill"} == {
        "waiting"
    }
    assert await dispatch.succeed(db, [(running.id, running.fence)]) == {key}
    assert await _run_all(db) == []  # stranded until the reaper passes
    await maintenance.reap(db, limit=100)
    # The first starts; its completion (buffered) promotes the next.
    assert await _run_all(db) == [schedule.occurrence_key(job.id, top - k * H) for k in (6, 5)]
