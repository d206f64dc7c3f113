"""Handlers for the chaos suite (`cronwell worker --import tests.chaos.chaos_handlers`).

`chaos.effect` writes its effect into a user table, an outbox message and a fenced write,
all in `ctx.transaction()`: the effect commits with the fenced completion or not at all.
"""

from __future__ import annotations

import os
import random

import cronwell
from cronwell.sdk import Context, sleep_or_cancel

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS chaos_effects (id bigserial PRIMARY KEY, key text NOT NULL,"
    " fence bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
    " at timestamptz NOT NULL DEFAULT now())"
)


@cronwell.handler("chaos.effect")
async def effect(ctx: Context) -> None:
    # A little work before the effect widens the windows faults can hit.
    await sleep_or_cancel(ctx, float(ctx.payload.get("max_sleep", 0.2)) * random.random())
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO chaos_effects (key, fence, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.key, ctx.fence, ctx.attempt, os.getpid()),
        )
        await ctx.outbox("chaos.effect", {"key": ctx.key, "fence": ctx.fence})
        await ctx.fenced_write(f"chaos:{ctx.key}")
