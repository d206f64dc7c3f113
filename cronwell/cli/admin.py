"""Commands that look after the store rather than the jobs in it: version, migrate,
partitions (P), status, and the embedded PostgreSQL (db)."""

from __future__ import annotations

import click

from cronwell import __version__, partitions
from cronwell.cli import render
from cronwell.cli.main import Env, main, partition_width, run
from cronwell.embedded import EmbeddedPostgres
from cronwell.errors import CronwellError
from cronwell.store import fences, gauges, leases, migrate, processes
from cronwell.store.gauges import StateCount
from cronwell.store.leases import Owner
from cronwell.store.processes import Process


@main.command()
def version() -> None:
    """Print the cronwell version."""
    from cronwell.store import SCHEMA_VERSION

    click.echo(f"cronwell {__version__} (schema {SCHEMA_VERSION})")


@main.command("migrate")
@click.option(
    "--partitions",
    type=click.IntRange(1, partitions.MAX_PARTITIONS),
    envvar="CRONWELL_PARTITIONS",
    help="P of a new store (default 16); a store that has one keeps it and refuses another "
    "(change it with `cronwell partitions set`).",
)
@click.pass_obj
def migrate_cmd(env: Env, partitions: int | None) -> None:
    """Apply database migrations (safe to run from several replicas at once)."""
    from cronwell import partitions as parts

    async def go() -> tuple[list[int], int]:
        async with env.database() as db:
            applied = await migrate(
                db, partitions=partitions, history_partition_seconds=partition_width()
            )
            return applied, await parts.check(db, partitions)

    applied, p = run(go())
    click.echo(
        (f"applied migrations {applied}" if applied else "schema is up to date")
        + f" ({p} partitions)"
    )


@main.group("partitions")
def partitions_group() -> None:
    """The partition count P of the store (one value, read by every process)."""


@partitions_group.command("get")
@click.pass_obj
def partitions_get(env: Env) -> None:
    """Print the store's partition count."""

    async def go() -> int:
        async with env.database() as db:
            return await partitions.read(db)

    click.echo(run(go()))


@partitions_group.command("set")
@click.argument("count", type=click.IntRange(1, partitions.MAX_PARTITIONS))
@click.pass_obj
def partitions_set(env: Env, count: int) -> None:
    """Change P online: one transaction moves every job to hash(uid) % COUNT and adjusts
    the partition leases; running schedulers pick it up within a lease period, and no
    occurrence is lost or repeated. Schedulers started with --partitions (or
    CRONWELL_PARTITIONS) must be given the new value before their next restart."""

    async def go() -> tuple[int, int]:
        async with env.database() as db:
            return await partitions.set_count(db, count)

    old, moved = run(go())
    if old == count:
        click.echo(f"the store already uses {count} partitions")
    else:
        click.echo(f"partitions {old} -> {count}: {moved} job(s) moved")


@main.command("status")
@click.pass_obj
def status_cmd(env: Env) -> None:
    """Partitions and their owners, live processes, occurrences by state."""

    async def go() -> tuple[
        list[Owner], list[Process], list[StateCount], fences.Durability, fences.Epoch | None
    ]:
        async with env.database(reads=True) as db:
            return (
                # Liveness is heartbeats against now(): the primary's, not a lagging copy.
                await leases.list_all(db),
                await processes.list_all(db, ttl_seconds=15),
                await gauges.occurrence_counts(db.reads),
                await fences.durability(db),
                await fences.epoch(db),
            )

    render.render_status(*run(go()))


@main.group("db")
def db_group() -> None:
    """The embedded PostgreSQL (used when no --database-url is given)."""


@db_group.command("url")
@click.pass_obj
def db_url(env: Env) -> None:
    """Print the database URL (starting the embedded PostgreSQL if needed)."""
    try:
        click.echo(env.url())
    except CronwellError as e:
        raise click.ClickException(str(e)) from None


@db_group.command("new-generation")
@click.pass_obj
def db_new_generation(env: Env) -> None:
    """Move fences to the next generation: run it after restoring the store from a backup,
    before starting cronwell, so no fence handed out since the backup is handed out again."""

    async def go() -> int:
        async with env.database() as db:
            return await fences.next_generation(db)

    click.echo(f"fence generation is now {run(go())}")


@db_group.command("stop")
@click.pass_obj
def db_stop(env: Env) -> None:
    """Stop the embedded PostgreSQL."""
    EmbeddedPostgres(env.db_settings.data_dir).stop()
    click.echo("embedded PostgreSQL stopped")
