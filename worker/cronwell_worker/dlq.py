"""`cronwell dlq`: the dead-letter queue, i.e. occurrences in state `dead` (attempts
exhausted, an error retrying cannot fix, or an AtMostOnce attempt whose outcome is
ambiguous). Dead occurrences keep their reason, last error and attempt history.

Replay puts a dead occurrence back to `pending` under the **same idempotency key** (its
identity never changes, so downstream deduplication still applies). Attempt numbers
continue where they stopped (attempt 4 follows attempt 3, so `Cronwell-Attempt` and the
attempt history never repeat a number) and the budget grows by the job's current
`retry.maxAttempts`. The claim that runs it issues a new fence, higher than every fence
issued before for that key. Ambiguous occurrences (AtMostOnce) are replayed only with
`--include-ambiguous`: replaying one may repeat an effect that already happened.
"""

from __future__ import annotations

import dataclasses

import click

from cronwell import dispatch
from cronwell.cli import Env, duration_option, fmt_time, json_line, render_dead, run
from cronwell.store import dead, runs


@click.group("dlq")
def dlq() -> None:
    """Dead-lettered occurrences: list, show, replay (same key, new fence), discard, purge."""


@dlq.command("list")
@click.option("--job", "name", help="Only this job (NAME).")
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def list_cmd(env: Env, name: str | None, namespace: str | None, limit: int, as_json: bool) -> None:
    """Dead occurrences, newest first, with their reason and last error."""

    async def go() -> list[dead.Dead]:
        async with env.database() as db:
            return await dead.list_dead(db, name=name, namespace=namespace, limit=limit)

    render_dead(run(go()), as_json=as_json)


@dlq.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_obj
def show_cmd(env: Env, key: str, as_json: bool) -> None:
    """An occurrence (dead or not) and every attempt of it."""

    async def go() -> tuple[runs.Occurrence | None, list[runs.Attempt]]:
        async with env.database() as db:
            return await runs.get(db, key), await runs.attempts(db, key)

    occ, atts = run(go())
    if occ is None:
        raise click.ClickException(f"no occurrence with key {key!r}")
    if as_json:
        click.echo(json_line(occ, attempts=[dataclasses.asdict(a) for a in atts]))
        return
    for k in (
        "idempotency_key",
        "namespace",
        "name",
        "state",
        "reason",
        "last_error",
        "scheduled_for",
        "origin",
        "delivery",
        "attempt",
        "max_attempts",
        "fence",
        "worker_id",
        "started_at",
        "finished_at",
    ):
        v = getattr(occ, k)
        click.echo(f"{k + ':':<17} {'-' if v is None else v}")
    if occ.job_deleted_at is not None:
        click.echo(f"{'job:':<17} deleted at {occ.job_deleted_at} (cannot be replayed)")
    click.echo("attempts:")
    fmt = "  {:>4} {:>10} {:<14} {:<44} {:<20} {}"
    click.echo(fmt.format("TRY", "FENCE", "OUTCOME", "WORKER", "FINISHED (UTC)", "ERROR"))
    for a in atts:
        click.echo(
            fmt.format(
                a.attempt,
                a.fence,
                a.outcome,
                (a.worker_id or "-")[:44],
                fmt_time(a.finished_at),
                (a.error or "").replace("\n", " ")[:80],
            )
        )


@dlq.command("replay")
@click.argument("key", required=False)
@click.option("--job", "name", help="Every dead occurrence of this job (NAME).")
@click.option("-n", "--namespace", default=None, help="With --job/--all: only this namespace.")
@click.option("--all", "all_", is_flag=True, help="Every dead occurrence.")
@click.option(
    "--include-ambiguous",
    is_flag=True,
    help="Also replay AtMostOnce occurrences dead as Ambiguous (their effect may have "
    "happened already).",
)
@click.pass_obj
def replay_cmd(
    env: Env,
    key: str | None,
    name: str | None,
    namespace: str | None,
    all_: bool,
    include_ambiguous: bool,
) -> None:
    """Run dead occurrences again under the same key: KEY, --job NAME or --all.

    Attempt numbers continue and the job's retry.maxAttempts is granted again; the next
    attempt gets a new, higher fence."""
    if (key is not None) + (name is not None) + all_ != 1:
        raise click.UsageError("give exactly one of KEY, --job NAME or --all")

    async def go() -> tuple[list[dead.Replayed], runs.Occurrence | None]:
        async with env.database() as db:
            rows = await dispatch.replay_dead(
                db, key=key, name=name, namespace=namespace, include_ambiguous=include_ambiguous
            )
            occ = await runs.get(db, key) if key is not None and not rows else None
            return rows, occ

    rows, occ = run(go())
    for r in rows:
        click.echo(
            f"replayed {r.idempotency_key} (next attempt {r.attempt + 1} of {r.max_attempts})"
        )
    if key is not None and not rows:
        if occ is None:
            raise click.ClickException(f"no occurrence with key {key!r}")
        if occ.state != "dead":
            raise click.ClickException(f"{key} is {occ.state}, not dead: nothing to replay")
        if occ.job_deleted_at is not None:
            raise click.ClickException(f"{key}: its job was deleted; it cannot be replayed")
        if occ.reason == "Ambiguous":
            raise click.ClickException(
                f"{key} is dead as Ambiguous (delivery AtMostOnce: its effect may have "
                "happened); pass --include-ambiguous to run it again anyway"
            )
    click.echo(f"{len(rows)} occurrence(s) replayed")


@dlq.command("discard")
@click.argument("key")
@click.pass_obj
def discard_cmd(env: Env, key: str) -> None:
    """Delete one dead occurrence KEY and its attempt history, whatever its age (as purge
    does for old ones): a dead letter decided not to be run again."""

    async def go() -> tuple[list[str], runs.Occurrence | None]:
        async with env.database() as db:
            keys = await dead.discard(db, key=key, namespace=None, name=None)
            return keys, None if keys else await runs.get(db, key)

    keys, occ = run(go())
    if not keys:
        if occ is None:
            raise click.ClickException(f"no occurrence with key {key!r}")
        raise click.ClickException(f"{key} is {occ.state}, not dead: nothing to discard")
    click.echo(f"discarded {key}")


@dlq.command("purge")
@click.option(
    "--older-than",
    "older_than",
    callback=duration_option,
    default="7d",
    show_default=True,
    help="Only occurrences dead for longer than this (90s, 15m, 12h, 7d, ...).",
)
@click.option("--job", "name", help="Only this job (NAME).")
@click.option("-n", "--namespace", default=None, help="Only this namespace.")
@click.option("--yes", is_flag=True, help="Delete for real (without it: count only).")
@click.pass_obj
def purge_cmd(
    env: Env, older_than: float, name: str | None, namespace: str | None, yes: bool
) -> None:
    """Delete dead occurrences and their attempt history (asks for --yes)."""

    async def go() -> int:
        async with env.database() as db:
            purged = await dead.purge(
                db, older_than_seconds=older_than, name=name, namespace=namespace, dry_run=not yes
            )
            return len(purged)

    n = run(go())
    if not yes:
        click.echo(
            f"would delete {n} dead occurrence(s) finished more than {older_than:g}s ago; "
            "re-run with --yes to delete them"
        )
        if n:
            raise SystemExit(1)
        return
    click.echo(f"deleted {n} dead occurrence(s)")
