"""`cronwell dlq`: dead occurrences keep their reason and error; replay keeps the key and
the next attempt gets a higher fence; Ambiguous ones need --include-ambiguous; purge asks
for --yes."""

from __future__ import annotations

import asyncio
import json

import click
import pytest
from click.testing import CliRunner, Result

from cronwell import dispatch
from cronwell.cli import Env, parse_duration
from cronwell.store.db import Database
from cronwell_worker.dlq import dlq
from tests.helpers.store import fail_dead

from .helpers import sql
from .worker_helpers import attempts, handler_job, occurrence, trigger


def test_parse_duration() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("15m") == 900
    assert parse_duration("12h") == 43200
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("2w") == 14 * 86400
    assert parse_duration("1d12h") == 86400 + 43200
    for bad in ("", "d", "5x", "1d 2h", "-1d", "h5"):
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(bad)


async def _cli(db_url: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, dlq, list(args), obj=Env(db_url, None), catch_exceptions=False
    )


async def _dead(
    db: Database, name: str, reason: str, error: str, *, delivery: str = "AtLeastOnce"
) -> tuple[str, int]:
    """A job whose triggered occurrence died on its first attempt; returns (key, fence)."""
    await handler_job(db, name, "t-fail-while", delivery=delivery, retry={"maxAttempts": 2})
    key = await trigger(db, name)
    (c,) = await dispatch.claim(db, pool="default", worker_id="w1", limit=5, lease_seconds=60)
    assert await fail_dead(db, key, c.fence, reason, error) == "dead"
    return key, c.fence


async def test_list_and_show_keep_reason_and_error(db: Database, db_url: str) -> None:
    k400, f400 = await _dead(db, "rejects", "HTTP400", "POST http://x answered 400: nope")
    kamb, _ = await _dead(db, "unsure", "Ambiguous", "timeout", delivery="AtMostOnce")

    r = await _cli(db_url, "list")
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.output.splitlines() if k400 in ln]
    assert "default/rejects" in line and "HTTP400" in line and "answered 400" in line
    assert "1/2" in line

    r = await _cli(db_url, "list", "--json")
    docs = [json.loads(ln) for ln in r.output.splitlines()]
    assert {d["idempotency_key"]: d["reason"] for d in docs} == {
        k400: "HTTP400",
        kamb: "Ambiguous",
    }
    r = await _cli(db_url, "list", "--job", "unsure", "--json")
    assert [json.loads(ln)["idempotency_key"] for ln in r.output.splitlines()] == [kamb]

    r = await _cli(db_url, "show", k400)
    assert r.exit_code == 0, r.output
    assert "state:            dead" in r.output and "reason:           HTTP400" in r.output
    (att,) = [ln for ln in r.output.splitlines() if " failed " in ln]
    assert att.split()[:3] == ["1", str(f400), "failed"]
    doc = json.loads((await _cli(db_url, "show", k400, "--json")).output)
    assert doc["last_error"] == "POST http://x answered 400: nope"
    assert [(a["attempt"], a["fence"], a["outcome"]) for a in doc["attempts"]] == [
        (1, f400, "failed")
    ]

    r = await _cli(db_url, "show", "no-such-key")
    assert r.exit_code == 1 and "no occurrence with key" in r.output


async def test_replay_keeps_the_key_and_the_next_claim_has_a_higher_fence(
    db: Database, db_url: str
) -> None:
    key, fence = await _dead(db, "again", "AttemptsExhausted", "boom")
    r = await _cli(db_url, "replay", "--job", "again")
    assert r.exit_code == 0, r.output
    assert f"replayed {key} (next attempt 2 of 3)" in r.output
    o = await occurrence(db, key)
    assert (o["state"], o["reason"], o["attempt"], o["max_attempts"]) == (
        "pending",
        "Replayed",
        1,
        3,  # attempt numbers continue; the job's maxAttempts (2) is granted again
    )
    assert o["last_error"] == "boom"  # history is kept
    (c,) = await dispatch.claim(db, pool="default", worker_id="w2", limit=5, lease_seconds=60)
    assert (c.key, c.attempt) == (key, 2)
    assert c.fence > fence
    assert await dispatch.succeed(db, [(c.id, c.fence)]) == {key}
    atts = await attempts(db, key)
    assert [(a["attempt"], a["outcome"], a["fence"]) for a in atts] == [
        (1, "failed", fence),
        (2, "succeeded", c.fence),
    ]
    # Nothing dead is left to replay; a succeeded occurrence is never replayed.
    r = await _cli(db_url, "replay", key)
    assert r.exit_code == 1 and "is succeeded, not dead" in r.output


async def test_replay_needs_one_selector_and_ambiguous_needs_a_flag(
    db: Database, db_url: str
) -> None:
    kamb, _ = await _dead(db, "unsure", "Ambiguous", "timeout", delivery="AtMostOnce")
    kdead, _ = await _dead(db, "plain", "AttemptsExhausted", "boom")
    for args in ([], ["--all", "--job", "plain"], [kamb, "--all"]):
        r = await _cli(db_url, "replay", *args)
        assert r.exit_code == 2 and "exactly one of KEY, --job NAME or --all" in r.output

    r = await _cli(db_url, "replay", kamb)
    assert r.exit_code == 1 and "--include-ambiguous" in r.output
    assert (await occurrence(db, kamb))["state"] == "dead"

    r = await _cli(db_url, "replay", "--all")
    assert r.exit_code == 0 and "1 occurrence(s) replayed" in r.output
    assert (await occurrence(db, kamb))["state"] == "dead"
    assert (await occurrence(db, kdead))["state"] == "pending"

    r = await _cli(db_url, "replay", kamb, "--include-ambiguous")
    assert r.exit_code == 0, r.output
    assert (await occurrence(db, kamb))["state"] == "pending"


async def test_purge_asks_for_yes_and_honours_the_age(db: Database, db_url: str) -> None:
    old, _ = await _dead(db, "old", "HTTP400", "nope")
    new, _ = await _dead(db, "new", "HTTP400", "nope")
    await sql(
        db,
        "UPDATE cronwell_occurrences SET finished_at = now() - interval '2 days' "
        "WHERE idempotency_key = %s",
        old,
    )

    async def keys() -> set[str]:
        return {r["idempotency_key"] for r in await sql(db, "SELECT * FROM cronwell_occurrences")}

    r = await _cli(db_url, "purge", "--older-than", "1d")
    assert r.exit_code == 1 and "would delete 1 dead occurrence(s)" in r.output
    assert "--yes" in r.output
    assert await keys() == {old, new}

    r = await _cli(db_url, "purge", "--older-than", "1d", "--yes")
    assert r.exit_code == 0 and "deleted 1 dead occurrence(s)" in r.output
    assert await keys() == {new}
    assert await attempts(db, old) == []  # its history went with it

    r = await _cli(db_url, "purge", "--older-than", "forever", "--yes")
    assert r.exit_code == 2 and "invalid duration" in r.output
    assert await keys() == {new}


async def test_discard_deletes_one_dead_key_and_its_attempts(db: Database, db_url: str) -> None:
    gone, _ = await _dead(db, "discarded", "HTTP400", "nope")
    kept, _ = await _dead(db, "kept", "HTTP400", "nope")
    assert await attempts(db, gone) != []

    r = await _cli(db_url, "discard", gone)
    assert r.exit_code == 0 and f"discarded {gone}" in r.output
    keys = {r["idempotency_key"] for r in await sql(db, "SELECT * FROM cronwell_occurrences")}
    assert keys == {kept}
    assert await attempts(db, gone) == []

    r = await _cli(db_url, "discard", gone)
    assert r.exit_code == 1 and "no occurrence with key" in r.output
    r = await _cli(db_url, "replay", kept)
    assert r.exit_code == 0
    r = await _cli(db_url, "discard", kept)  # pending again: not a dead letter any more
    assert r.exit_code == 1 and "is pending, not dead" in r.output
    assert (await occurrence(db, kept))["state"] == "pending"


def test_dlq_is_a_click_group() -> None:
    assert isinstance(dlq, click.Group)
    assert set(dlq.commands) == {"list", "show", "replay", "discard", "purge"}
