"""`cronwell backfill`: run the instants of a past window that never ran."""

from __future__ import annotations

from datetime import datetime

import click

from cronwell import backfill
from cronwell.cli import render
from cronwell.cli.main import Env, main, run
from cronwell.cli.parse import instant_option


@main.command("backfill")
@click.argument("name")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--from", "start", required=True, callback=instant_option,
              help="First instant of the window (ISO-8601; no offset means UTC).")  # fmt: skip
@click.option("--to", "end", required=True, callback=instant_option,
              help="Last instant of the window, included (not in the future).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print what would happen; write nothing.")
@click.option("--max", "max_instants", type=int, default=backfill.DEFAULT_MAX_INSTANTS,
              show_default=True, help="Refuse windows with more instants than this.")  # fmt: skip
@click.pass_obj
def backfill_cmd(
    env: Env,
    name: str,
    namespace: str,
    start: datetime,
    end: datetime,
    dry_run: bool,
    max_instants: int,
) -> None:
    """Run the instants of a past window that never ran, under their real keys.

    Every nominal instant of NAME's schedule in [--from, --to] (its time zone, DST policy,
    startAt/endAt) gets the key the scheduler gives it. Instants with no occurrence get one
    (origin backfill), instants recorded `missed` run again once, and instants that already
    have an occurrence (succeeded, dead, running, pending, skipped) are left alone, so a
    backfill never repeats a run and running it twice is a no-op. The runs start now (one
    at a time, oldest first, unless concurrencyPolicy is Allow)."""

    async def go() -> backfill.BackfillResult:
        async with env.database() as db:
            return await backfill.backfill(
                db,
                namespace=namespace,
                name=name,
                start=start,
                end=end,
                max_instants=max_instants,
                dry_run=dry_run,
            )

    render.render_backfill(run(go()))
