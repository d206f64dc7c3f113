"""Transactional outbox: the effect, its messages and the fenced completion commit together
or not at all; a duplicate dispatch of one key has its effect at most once; the relay
publishes every message at least once, always under the same idempotency key."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from click.testing import CliRunner, Result

from cronwell import dispatch
from cronwell.cli import Env
from cronwell.errors import LeaseLost
from cronwell.sdk import Context, StaleFence
from cronwell.store import outbox
from cronwell.store.db import Database
from cronwell_worker.cli import outbox_relay
from cronwell_worker.outbox import HttpPublisher, OutboxMessage, Relay, RelaySettings
from tests.helpers.wait import wait_for

from .helpers import sql
from .worker_helpers import (
    EFFECTS_DDL,
    OUTBOX_SEEN,
    attempts,
    handler_job,
    http_server,
    occurrence,
    running_worker,
    state_is,
    steal,
    trigger,
)


def _ctx(db: Database, c: dispatch.Claimed) -> Context:
    return Context.for_claim(c, db)


async def _effect(ctx: Context) -> None:
    """A handler's body: fenced write, effect row and outbox message, completed together."""
    async with ctx.transaction() as conn:
        await ctx.fenced_write("account-42")
        await conn.execute(
            "INSERT INTO test_effects (key, fence, attempt, pid, tag) "
            "VALUES (%s, %s, %s, 0, 'dup')",
            (ctx.key, ctx.fence, ctx.attempt),
        )
        await ctx.outbox("effects", {"fence": ctx.fence})


async def test_raise_inside_the_transaction_leaves_no_effect_message_or_completion(
    db: Database, db_url: str
) -> None:
    await sql(db, EFFECTS_DDL)
    await handler_job(
        db, "crashy", "t-outbox-effect", {"raise": True}, retry={"initialDelaySeconds": 0}
    )
    async with running_worker(db_url):
        key = await trigger(db, "crashy")
        o = await wait_for(lambda: state_is(db, key, "succeeded"))
    atts = await attempts(db, key)
    assert [(a["attempt"], a["outcome"]) for a in atts] == [(1, "failed"), (2, "succeeded")]
    assert "crash between effect and completion" in atts[0]["error"]
    assert await sql(db, "SELECT attempt, fence FROM test_effects") == [
        {"attempt": 2, "fence": o["fence"]}
    ]
    box = await sql(db, "SELECT idempotency_key, payload FROM cronwell_outbox")
    assert box == [{"idempotency_key": key, "payload": {"key": key, "attempt": 2}}]


@pytest.mark.parametrize("order", ["stale-first", "taker-first", "concurrent"])
async def test_forced_duplicate_dispatch_has_its_effect_at_most_once(
    db: Database, order: str
) -> None:
    """The same key dispatched twice (the occurrence was requeued while its first attempt
    still ran): two contexts, fences f1 < f2. Only one effect, one message, one success."""
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "dup", "t-outbox-effect")
    key = await trigger(db, "dup")
    (c1,) = await dispatch.claim(db, pool="default", worker_id="w1", limit=5, lease_seconds=60)
    c2 = await steal(db, key, worker_id="w2")
    assert c1.key == c2.key == key and c1.fence < c2.fence
    stale, taker = _ctx(db, c1), _ctx(db, c2)
    results: dict[str, BaseException | None] = {}

    async def run(name: str, ctx: Context) -> None:
        try:
            await _effect(ctx)
            results[name] = None
        except (LeaseLost, StaleFence) as e:
            results[name] = e

    if order == "stale-first":
        await run("stale", stale)
        await run("taker", taker)
    elif order == "taker-first":
        await run("taker", taker)
        await run("stale", stale)
    else:
        await asyncio.gather(run("stale", stale), run("taker", taker))
    assert results["taker"] is None
    assert isinstance(results["stale"], LeaseLost | StaleFence)
    assert await sql(db, "SELECT fence FROM test_effects") == [{"fence": c2.fence}]
    assert await sql(db, "SELECT payload FROM cronwell_outbox") == [
        {"payload": {"fence": c2.fence}}
    ]
    assert await sql(db, "SELECT fence FROM cronwell_fences") == [{"fence": c2.fence}]
    atts = await attempts(db, key)
    assert [(a["outcome"], a["fence"]) for a in atts] == [
        ("lease_expired", c1.fence),
        ("succeeded", c2.fence),
    ]


async def test_the_same_attempt_run_twice_has_its_effect_once(db: Database) -> None:
    await sql(db, EFFECTS_DDL)
    await handler_job(db, "twice", "t-outbox-effect")
    key = await trigger(db, "twice")
    (c,) = await dispatch.claim(db, pool="default", worker_id="w1", limit=5, lease_seconds=60)
    await _effect(_ctx(db, c))
    with pytest.raises(LeaseLost, match="stale"):
        await _effect(_ctx(db, c))
    assert len(await sql(db, "SELECT id FROM test_effects")) == 1
    assert len(await sql(db, "SELECT id FROM cronwell_outbox")) == 1
    assert (await occurrence(db, key))["state"] == "succeeded"


# -- the relay ------------------------------------------------------------------------------


async def _messages(db: Database, n: int, key: str = "job:2026-01-01T00:00:00Z") -> list[int]:
    for i in range(n):
        await outbox.insert(db, key=key, topic="t", payload={"i": i})
    return [r["id"] for r in await sql(db, "SELECT id FROM cronwell_outbox ORDER BY id")]


async def test_http_relay_retries_with_backoff_and_keeps_the_key(db: Database) -> None:
    ids = await _messages(db, 2)
    with http_server([500]) as srv:  # the first POST fails, then 200s
        pub = HttpPublisher(srv.url)
        relay = Relay(db, pub, RelaySettings(initial_backoff_seconds=0.3))
        try:
            assert await relay.publish_once() == (1, 1)
            row = (await sql(db, "SELECT * FROM cronwell_outbox WHERE id = %s", ids[0]))[0]
            assert row["published_at"] is None and row["attempts"] == 1
            assert "answered 500" in row["last_error"]
            assert await relay.publish_once() == (0, 0)  # backing off
            await asyncio.sleep(0.35)
            assert await relay.publish_once() == (1, 0)
        finally:
            await pub.aclose()
    rows = await sql(db, "SELECT id, published_at, attempts, last_error FROM cronwell_outbox")
    assert all(r["published_at"] is not None and r["last_error"] is None for r in rows)
    assert {r["id"]: r["attempts"] for r in rows} == {ids[0]: 2, ids[1]: 1}
    sent = [
        ({k.lower(): v for k, v in r.headers.items()}["idempotency-key"], json.loads(r.body))
        for r in srv.requests
    ]
    first = f"job:2026-01-01T00:00:00Z:outbox:{ids[0]}"
    assert [s[0] for s in sent] == [first, f"job:2026-01-01T00:00:00Z:outbox:{ids[1]}", first]
    assert sent[0][1]["payload"] == {"i": 0} and sent[0][1]["idempotencyKey"] == first


@pytest.mark.parametrize("kind", ["async", "sync", "its own timeout"])
async def test_a_publisher_past_its_timeout_is_a_failed_publish_retried_later(
    db: Database, kind: str
) -> None:
    await _messages(db, 1)

    async def hangs(m: OutboxMessage) -> None:
        await asyncio.sleep(30)

    def blocks(m: OutboxMessage) -> None:  # a thread cannot be stopped: it runs out alone
        time.sleep(0.5)

    async def times_out(m: OutboxMessage) -> None:
        raise TimeoutError("the broker did not answer")

    hook = {"async": hangs, "sync": blocks, "its own timeout": times_out}[kind]
    relay = Relay(db, hook, RelaySettings(publish_timeout_seconds=0.1))
    async with asyncio.timeout(10):
        assert await relay.publish_once() == (0, 1)
    (row,) = await sql(db, "SELECT published_at, attempts, last_error FROM cronwell_outbox")
    assert row["published_at"] is None and row["attempts"] == 1
    assert row["last_error"] == (
        "TimeoutError: the broker did not answer"
        if kind == "its own timeout"
        else "not published within 0.1s (publish timeout)"
    )


class _Crash(BaseException):
    """The relay process dies (not an error it could handle)."""


async def test_a_crash_after_publishing_republishes_under_the_same_key(db: Database) -> None:
    (mid,) = await _messages(db, 1)
    seen: list[str] = []

    def crashing(m: OutboxMessage) -> None:  # sync hooks run in a thread
        seen.append(m.idempotency_key)
        raise _Crash()

    with pytest.raises(_Crash):
        await Relay(db, crashing).publish_once()
    assert (await sql(db, "SELECT published_at FROM cronwell_outbox"))[0]["published_at"] is None

    def ok(m: OutboxMessage) -> None:
        seen.append(m.idempotency_key)

    assert await Relay(db, ok).publish_once() == (1, 0)
    assert seen == [f"job:2026-01-01T00:00:00Z:outbox:{mid}"] * 2
    assert (await sql(db, "SELECT published_at FROM cronwell_outbox"))[0]["published_at"]


async def test_concurrent_relays_publish_each_message_once(db: Database, db_url: str) -> None:
    ids = await _messages(db, 60)
    got: list[int] = []

    async def hook(m: OutboxMessage) -> None:
        await asyncio.sleep(0.002)
        got.append(m.id)

    async with Database(db_url, max_size=4) as db2:
        relays = [Relay(d, hook, RelaySettings(batch_size=7, poll_seconds=0.05)) for d in (db, db2)]
        tasks = [asyncio.create_task(r.run()) for r in relays]

        async def all_published() -> bool:
            rows = await sql(db, "SELECT 1 FROM cronwell_outbox WHERE published_at IS NULL")
            return not rows

        await wait_for(all_published, 15, "every message to be published")
        for r in relays:
            r.stop()
        await asyncio.gather(*tasks)
    assert sorted(got) == ids, "a message was published twice or not at all"
    assert all(r.published > 0 for r in relays), "SKIP LOCKED should share the work"


async def test_outbox_relay_command_drains_to_a_url(db: Database, db_url: str) -> None:
    await _messages(db, 3)
    with http_server() as srv:
        result = await asyncio.to_thread(
            CliRunner().invoke,
            outbox_relay,
            ["--url", srv.url, "--drain", "--header", "Authorization: Bearer x"],
            obj=Env(db_url, None),
        )
    assert result.exit_code == 0, result.output
    assert "published 3 message(s)" in result.output
    assert len(srv.requests) == 3
    assert all(r.headers["Authorization"] == "Bearer x" for r in srv.requests)
    assert await sql(db, "SELECT 1 FROM cronwell_outbox WHERE published_at IS NULL") == []


async def test_outbox_relay_command_hook_usage_and_failure_status(
    db: Database, db_url: str
) -> None:
    (mid,) = await _messages(db, 1)

    async def invoke(*args: str) -> Result:
        return await asyncio.to_thread(
            CliRunner().invoke, outbox_relay, list(args), obj=Env(db_url, None)
        )

    r = await invoke("--drain")
    assert r.exit_code == 2 and "exactly one of --url or --hook" in r.output
    with http_server() as srv:
        r = await invoke("--url", f"{srv.base}/status/503", "--drain", "--drain-timeout", "0.5")
    assert r.exit_code == 1 and "could not be published yet" in r.output
    assert {req.path for req in srv.requests} == {"/status/503"}
    row = (await sql(db, "SELECT * FROM cronwell_outbox"))[0]
    assert row["published_at"] is None and "answered 503" in row["last_error"]

    r = await invoke("--hook", "tests.integration.worker_helpers:record_outbox", "--drain")
    assert r.exit_code == 0, r.output
    assert OUTBOX_SEEN[-1] == f"job:2026-01-01T00:00:00Z:outbox:{mid}"
    assert (await sql(db, "SELECT published_at FROM cronwell_outbox"))[0]["published_at"]
