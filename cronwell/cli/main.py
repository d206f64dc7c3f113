"""The `cronwell` command. Core commands live here; the worker and operator packages add
theirs through the `cronwell.cli` entry-point group, so this package imports neither."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import click
import pydantic

from cronwell import __version__, backfill, jobs, logs, partitions
from cronwell.cli.parse import duration_option, instant_option, parse_duration
from cronwell.embedded import EmbeddedPostgres
from cronwell.errors import CronwellError
from cronwell.metrics import Metrics
from cronwell.schedule import format_instant
from cronwell.scheduler import Scheduler
from cronwell.settings import DatabaseSettings, SchedulerSettings
from cronwell.store import Database, migrate, processes

T = TypeVar("T")


class Env:
    """What every command gets: where the database is and how to open it."""

    def __init__(self, database_url: str | None, data_dir: Path | None):
        overrides: dict[str, Any] = {}
        if database_url:
            overrides["database_url"] = database_url
        if data_dir:
            overrides["data_dir"] = data_dir
        self.db_settings = DatabaseSettings(**overrides)
        self.embedded: EmbeddedPostgres | None = None

    def url(self) -> str:
        s = self.db_settings
        if s.database_url_file is not None:
            if s.database_url:
                raise CronwellError(
                    "set CRONWELL_DATABASE_URL or CRONWELL_DATABASE_URL_FILE, not both"
                )
            try:
                url = s.database_url_file.read_text().strip()
            except OSError as e:
                raise CronwellError(
                    f"cannot read CRONWELL_DATABASE_URL_FILE {s.database_url_file}: {e.strerror}"
                ) from None
            if not url:
                raise CronwellError(f"CRONWELL_DATABASE_URL_FILE {s.database_url_file} is empty")
            return url
        if s.database_url:
            return s.database_url
        self.embedded = EmbeddedPostgres(self.db_settings.data_dir)
        if not self.embedded.is_running():
            click.echo(f"starting embedded PostgreSQL in {self.db_settings.data_dir}", err=True)
        return self.embedded.start()

    @contextlib.asynccontextmanager
    async def database(
        self,
        *,
        max_size: int | None = None,
        migrate_first: bool = False,
        partitions: int | None = None,
    ) -> AsyncIterator[Database]:
        """An open pool; `migrate_first` migrates (a new store gets `partitions` as its P)."""
        s = self.db_settings
        db = Database(
            self.url(),
            min_size=s.pool_min_size,
            max_size=max_size or s.pool_max_size,
            connect_timeout_seconds=s.connect_timeout_seconds,
        )
        async with db:
            if migrate_first:
                await migrate(db, partitions=partitions)
            yield db


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; CronwellErrors become one clear line, never a traceback."""
    try:
        return asyncio.run(coro)
    except CronwellError as e:
        raise click.ClickException(str(e)) from None
    except pydantic.ValidationError as e:
        raise click.ClickException(f"invalid setting: {e}") from None


def run_until_signal(
    main: Callable[[], Coroutine[Any, Any, None]], on_signal: Callable[[], None]
) -> None:
    """Run `main` with SIGTERM/SIGINT calling `on_signal` (graceful first, forceful next)."""

    async def wrapper() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await main()

    run(wrapper())


class _Group(click.Group):
    """Adds the commands other packages register under the `cronwell.cli` entry points,
    loaded on first use (so `import cronwell.cli` imports neither worker nor operator)."""

    _loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for ep in entry_points(group="cronwell.cli"):
                self.add_command(ep.load(), name=ep.name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        self._load()
        return super().get_command(ctx, name)


@click.group(
    cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--database-url",
    envvar="CRONWELL_DATABASE_URL",
    help="PostgreSQL URL. Unset: an embedded PostgreSQL in --data-dir.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    envvar="CRONWELL_DATA_DIR",
    help="Data directory of the embedded PostgreSQL.",
)
@click.option("--log-level", default="INFO", show_default=True, envvar="CRONWELL_LOG_LEVEL")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="CRONWELL_LOG_FORMAT",
)
@click.pass_context
def main(
    ctx: click.Context,
    database_url: str | None,
    data_dir: Path | None,
    log_level: str,
    log_format: str,
) -> None:
    """cronwell: scheduled jobs with exactly-once effect (at-least-once dispatch +
    idempotent execution, keyed by job uid and nominal instant)."""
    logs.setup(log_level, log_format)
    ctx.obj = Env(database_url, data_dir)


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
            applied = await migrate(db, partitions=partitions)
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


metrics_port_option = click.option(
    "--metrics-port",
    type=int,
    default=0,
    envvar="CRONWELL_METRICS_PORT",
    help="Serve Prometheus /metrics on this port (0: off).",
)


@main.command("scheduler")
@click.option(
    "--partitions",
    type=int,
    help="Expected P: refuse to start if the store uses another (env CRONWELL_PARTITIONS); "
    "a new store is created with it. Default: the store's.",
)
@click.option(
    "--retention",
    "retention_seconds",
    callback=duration_option,
    help="Keep finished runs of deleted and one-shot jobs this long (e.g. 7d, 12h; "
    "default 7d, env CRONWELL_RETENTION_SECONDS in seconds).",
)
@click.option("--horizon-seconds", type=float, help="Materialise this far ahead (default 30).")
@click.option(
    "--lease-seconds",
    "partition_lease_seconds",
    type=float,
    help="Partition lease TTL (default 10).",
)
@metrics_port_option
@click.pass_obj
def scheduler_cmd(env: Env, /, metrics_port: int, **opts: Any) -> None:
    """Run a scheduler replica: partition leases, materialisation, lease reaping, and
    (the owner of partition 0) pruning history by the jobs' limits and --retention."""
    settings = SchedulerSettings(**{k: v for k, v in opts.items() if v is not None})
    metrics = Metrics()
    metrics.serve(metrics_port)
    holder: list[Scheduler] = []

    async def go() -> None:
        async with env.database(migrate_first=True, partitions=settings.partitions) as db:
            s = Scheduler(db, settings, metrics=metrics)
            holder.append(s)
            await s.run()

    run_until_signal(go, lambda: holder[0].stop() if holder else None)


def _load_or_fail(paths: tuple[Path, ...], *, standalone: bool = False) -> tuple[list[Any], int]:
    """Every document, or none: any invalid one is reported on stderr (one line each) and
    the command stops before touching the store (a multi-document file with one bad
    document applies nothing). `standalone`: also the checks the operator's webhook makes
    in a cluster that need nothing but the spec (egress policy; Secret references, which
    only the operator can resolve)."""
    from cronwell.egress import EgressDenied
    from cronwell.errors import SpecError
    from cronwell.loader import load
    from cronwell.settings import EgressSettings

    loaded, errors = load(paths)
    if standalone and not errors:
        try:
            policy = EgressSettings().policy()
        except EgressDenied as e:
            raise click.ClickException(str(e)) from None
        for item in loaded:
            http = item.job.spec.target.http
            if http is None:
                continue
            try:
                policy.check_url(http.url)
            except EgressDenied as e:
                errors.append(SpecError(f"{item.source} (ScheduledJob {item.job.metadata.name})"
                                        f": {e}", source=item.source))  # fmt: skip
            if http.secret_headers:
                errors.append(
                    SpecError(
                        f"{item.source} (ScheduledJob {item.job.metadata.name}): "
                        "spec.target.http.headers: valueFrom.secretKeyRef is resolved by the "
                        "operator in a cluster; without one, use value: with ${env:VAR} "
                        "(a variable of the workers' environment)",
                        source=item.source,
                    )
                )
    for err in errors:
        click.secho(f"error: {err}", fg="red", err=True)
    if errors:
        raise click.ClickException(
            f"{len(errors)} invalid document(s); nothing applied: fix them and apply again"
        )
    return loaded, 0


@main.command("apply")
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path),
    help="A YAML file or a folder of them.",
)
@click.pass_obj
def apply_cmd(env: Env, paths: tuple[Path, ...]) -> None:
    """Create or update ScheduledJobs from YAML in the store (standalone `kubectl apply`).
    All or nothing: any invalid document is reported and nothing is applied."""
    loaded, n_errors = _load_or_fail(paths, standalone=True)

    async def go() -> list[jobs.Applied]:
        async with env.database(migrate_first=True) as db:
            return [
                await jobs.apply_job(
                    db,
                    namespace=item.job.metadata.namespace,
                    name=item.job.metadata.name,
                    spec=item.job.spec,
                )
                for item in loaded
            ]

    for a in run(go()):
        click.echo(
            f"scheduledjob.cronwell.dev/{a.name} {a.action} (namespace {a.namespace}, "
            f"next {a.next_run_at.isoformat() if a.next_run_at else '-'})"
        )
    if n_errors:
        sys.exit(1)


@main.command("delete")
@click.option("-f", "--filename", "paths", multiple=True, type=click.Path(path_type=Path))
@click.option("-n", "--namespace", default="default", show_default=True)
@click.argument("names", nargs=-1)
@click.pass_obj
def delete_cmd(env: Env, paths: tuple[Path, ...], namespace: str, names: tuple[str, ...]) -> None:
    """Delete ScheduledJobs (by file or by name); their history is kept."""
    loaded = _load_or_fail(paths)[0] if paths else []
    targets = [(i.job.metadata.namespace, i.job.metadata.name) for i in loaded]
    targets += [(namespace, n) for n in names]
    if not targets:
        raise click.UsageError("give -f FILE or job NAMES")

    async def go() -> None:
        async with env.database() as db:
            for ns, name in targets:
                await jobs.delete_job(db, namespace=ns, name=name)
                click.echo(f"scheduledjob.cronwell.dev/{name} deleted (namespace {ns})")

    run(go())


@main.command("trigger")
@click.argument("name")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--id", "trigger_id", help="Trigger id: the same id never runs twice.")
@click.pass_obj
def trigger_cmd(env: Env, name: str, namespace: str, trigger_id: str | None) -> None:
    """Run a job now (once per trigger id)."""

    async def go() -> tuple[str, bool]:
        async with env.database() as db:
            return await jobs.trigger_job(db, namespace=namespace, name=name, trigger_id=trigger_id)

    key, created = run(go())
    click.echo(f"triggered {key}" if created else f"already triggered: {key} (no-op)")


@main.command("suspend")
@click.argument("name")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.pass_obj
def suspend_cmd(env: Env, name: str, namespace: str) -> None:
    """Suspend a job (instants due meanwhile are handled by its misfire policy on resume)."""
    _set_suspend(env, namespace, name, True)


@main.command("resume")
@click.argument("name", required=False)
@click.option("-n", "--namespace", default=None, help="Namespace of NAME (default: default).")
@click.option("--all", "all_", is_flag=True, help="Every job `cronwell pause` paused in -n.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every job paused, all namespaces.")
@click.option("--yes", is_flag=True, help="Confirm --all / --all-namespaces.")
@click.pass_obj
def resume_cmd(
    env: Env, name: str | None, namespace: str | None, all_: bool, all_namespaces: bool, yes: bool
) -> None:
    """Resume a suspended job (NAME), or what `cronwell pause` paused (--all, -A).

    Instants due meanwhile follow the job's misfire policy (the rest are recorded missed;
    `cronwell backfill` runs them later). The mass forms resume only jobs paused by
    `cronwell pause`; jobs suspended by spec, `cronwell suspend` or after failures stay."""
    name, ns = _selection(name, namespace, all_, all_namespaces, yes, "resume")
    if name is not None:
        _set_suspend(env, ns or "default", name, False)
        return

    async def go() -> jobs.Paused:
        async with env.database() as db:
            return await jobs.resume_paused(db, namespace=ns)

    _report_pause(run(go()), "resumed")


@main.command("pause")
@click.argument("name", required=False)
@click.option("-n", "--namespace", default=None, help="Namespace of NAME / of --all.")
@click.option("--all", "all_", is_flag=True, help="Every job of the namespace (-n).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every job of every namespace.")
@click.option("--yes", is_flag=True, help="Confirm --all / --all-namespaces.")
@click.pass_obj
def pause_cmd(
    env: Env, name: str | None, namespace: str | None, all_: bool, all_namespaces: bool, yes: bool
) -> None:
    """The incident button: suspend NAME, every job of a namespace (--all -n NS) or every
    job (--all-namespaces), with reason Paused. Undo with `cronwell resume` (same selectors).

    Nothing new is materialised; occurrences already materialised (the horizon ahead) and
    running attempts still run. Jobs already suspended keep their reason. For a ScheduledJob
    CR, its spec.suspend wins again at the CR's next spec change."""
    name, ns = _selection(name, namespace, all_, all_namespaces, yes, "pause")

    async def go() -> jobs.Paused:
        async with env.database() as db:
            return await jobs.pause(db, namespace=ns, name=name)

    _report_pause(run(go()), "paused")


def _selection(
    name: str | None,
    namespace: str | None,
    all_: bool,
    all_namespaces: bool,
    yes: bool,
    verb: str,
) -> tuple[str | None, str | None]:
    """(NAME, its namespace), or (None, the namespace of --all / None for every one)."""
    if (name is not None) + all_ + all_namespaces != 1:
        raise click.UsageError(
            f"give exactly one of NAME, --all -n NAMESPACE or --all-namespaces "
            f"(e.g. cronwell {verb} nightly -n reports)"
        )
    if all_ and namespace is None:
        raise click.UsageError("--all needs -n NAMESPACE (or use --all-namespaces)")
    if name is None and not yes:
        where = "every namespace" if all_namespaces else f"namespace {namespace}"
        raise click.UsageError(f"{verb} every job of {where}? Re-run with --yes to confirm")
    if name is not None:
        return name, namespace or "default"
    return None, namespace if all_ else None


def _report_pause(done: jobs.Paused, verb: str) -> None:
    for ns, name in done.changed:
        click.echo(f"{ns}/{name} {verb}")
    for ns, name, why in done.untouched:
        if verb == "paused":
            click.echo(f"{ns}/{name} already suspended ({why})")
        else:
            click.echo(f"{ns}/{name} stays suspended ({why}): `cronwell resume {name} -n {ns}`")
    click.echo(f"{len(done.changed)} job(s) {verb}")


def _set_suspend(env: Env, namespace: str, name: str, suspended: bool) -> None:
    async def go() -> None:
        async with env.database() as db:
            await jobs.set_suspended(
                db,
                namespace=namespace,
                name=name,
                suspended=suspended,
                reason="Manual" if suspended else None,
            )

    run(go())
    click.echo(f"{namespace}/{name} {'suspended' if suspended else 'resumed'}")


def _fmt_time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _fmt_secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}s"


@main.command("runs")
@click.option("--job", "name", help="Only this job (NAME).")
@click.option("-n", "--namespace", default=None)
@click.option("--state", default=None, help="Only this state (succeeded, dead, missed, ...).")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def runs_cmd(
    env: Env, name: str | None, namespace: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """Recent occurrences with state, start lag and attempts (newest first)."""

    async def go() -> list[dict[str, Any]]:
        async with env.database() as db:
            return [
                dict(r)
                for r in await db.fetch(
                    "RunsList",
                    {"name": name, "namespace": namespace, "state": state, "limit": limit},
                )
            ]

    render_runs(run(go()), as_json=as_json)


def render_runs(rows: list[dict[str, Any]], *, as_json: bool = False) -> None:
    """The runs table (`cronwell runs`, `kubectl cronwell runs`): one renderer for both."""
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, default=str))
        return
    fmt = "{:<28} {:<20} {:<10} {:<9} {:>9} {:>9} {:>4}  {}"
    click.echo(
        fmt.format(
            "JOB", "SCHEDULED (UTC)", "STATE", "ORIGIN", "LAG", "DURATION", "TRY", "REASON/ERROR"
        )
    )
    for r in rows:
        click.echo(
            fmt.format(
                f"{r['namespace']}/{r['name']}"[:28],
                _fmt_time(r["scheduled_for"]),
                r["state"],
                r["origin"],
                _fmt_secs(r["lag_seconds"]),
                _fmt_secs(r["duration_seconds"]),
                r["attempt"],
                (r["reason"] or r["last_error"] or "").replace("\n", " ")[:60],
            )
        )
    if not rows:
        click.echo("(no occurrences)", err=True)


def render_dead(rows: list[dict[str, Any]], *, as_json: bool = False) -> None:
    """The dead-letter table (`cronwell dlq list`, `kubectl cronwell dlq`)."""
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, default=str))
        return
    fmt = "{:<28} {:<60} {:<18} {:>5}  {:<20} {}"
    click.echo(fmt.format("JOB", "KEY", "REASON", "TRIES", "FINISHED (UTC)", "ERROR"))
    for r in rows:
        click.echo(
            fmt.format(
                f"{r['namespace']}/{r['name']}"[:28],
                r["idempotency_key"],
                (r["reason"] or "-")[:18],
                f"{r['attempt']}/{r['max_attempts']}",
                _fmt_time(r["finished_at"]),
                (r["last_error"] or "").replace("\n", " ")[:80],
            )
        )
    if not rows:
        click.echo("(no dead occurrences)", err=True)


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

    res = run(go())
    would = "would be " if res.dry_run else ""
    click.echo(
        f"backfill {res.namespace}/{res.name} {format_instant(res.start)} .. "
        f"{format_instant(res.end)}: {len(res.instants)} instant(s) in the window"
        + (" (dry run: nothing written)" if res.dry_run else "")
    )
    if res.instants:
        click.echo(
            f"  first {format_instant(res.instants[0])}, last {format_instant(res.instants[-1])}"
        )
    click.echo(f"  {would}created:   {len(res.created)} (origin backfill, runnable now)")
    click.echo(f"  {would}re-opened: {len(res.reopened)} (were missed)")
    present = ", ".join(f"{k}={v}" for k, v in sorted(res.present.items())) or "none"
    click.echo(f"  already present, left alone: {present}")


@main.command("jobs")
@click.option("-n", "--namespace", default=None)
@click.pass_obj
def jobs_cmd(env: Env, namespace: str | None) -> None:
    """List jobs in the store (the standalone `kubectl get scheduledjobs`)."""

    async def go() -> list[Any]:
        async with env.database() as db:
            return await db.fetch("JobList", {"namespace": namespace})

    fmt = "{:<32} {:<18} {:<16} {:<8} {:<20} {:>8} {:>7}"
    click.echo(
        fmt.format(
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "NEXT RUN (UTC)", "FAILURES", "MISSED"
        )
    )
    for r in run(go()):
        spec = r["spec"]
        click.echo(
            fmt.format(
                f"{r['namespace']}/{r['name']}"[:32],
                spec.get("schedule") or "runAt",
                spec.get("timeZone", "UTC")[:16],
                (r["suspended_reason"] or "yes") if r["suspended"] else "no",
                _fmt_time(r["next_run_at"]),
                r["consecutive_failures"],
                r["missed_total"],
            )
        )


@main.command("status")
@click.pass_obj
def status_cmd(env: Env) -> None:
    """Partitions and their owners, live processes, occurrences by state."""

    async def go() -> tuple[list[Any], list[Any], list[Any]]:
        async with env.database() as db:
            return (
                await db.fetch("PartitionList"),
                await processes.list_all(db, ttl_seconds=15),
                await db.fetch("OccurrenceCounts"),
            )

    parts, procs, counts = run(go())
    owners: dict[str, list[int]] = {}
    for p in parts:
        owners.setdefault(p["holder"] if p["live"] else "(unowned)", []).append(p["partition"])
    click.echo(f"partitions ({len(parts)}):")
    for holder, ps in sorted(owners.items()):
        click.echo(f"  {holder}: {ps}")
    click.echo("processes:")
    for r in procs:
        click.echo(
            f"  {r.role:<9} {r.id:<44} pool={r.pool or '-'} "
            f"running={r.running} {'live' if r.live else 'silent'}"
        )
    click.echo("occurrences: " + (", ".join(f"{r['state']}={r['n']}" for r in counts) or "none"))


@main.command("forecast")
@click.option("--pool", default=None, help="Only this pool.")
@click.option("--horizon", default="1h", show_default=True, help="How far ahead (e.g. 5m, 1h).")
@click.option("--bucket", default="1m", show_default=True, help="Rows of the table (e.g. 10s).")
@click.option("--slo", "slo_seconds", type=float, default=5.0, show_default=True,
              help="Start SLO in seconds (WorkerPool startSLOSeconds).")  # fmt: skip
@click.option("--concurrency-per-replica", type=int, default=64, show_default=True)
@click.option("--min-replicas", type=int, default=1, show_default=True)
@click.option("--max-replicas", type=int, default=10, show_default=True)
@click.option("--png", type=click.Path(path_type=Path), help="Also plot it to this PNG file.")
@click.pass_obj
def forecast_cmd(
    env: Env,
    pool: str | None,
    horizon: str,
    bucket: str,
    slo_seconds: float,
    concurrency_per_replica: int,
    min_replicas: int,
    max_replicas: int,
    png: Path | None,
) -> None:
    """Forecast each pool's due occurrences, the concurrency that starts them within the
    SLO, and the worker replicas to plan (from the schedules, durations and backlog)."""
    from cronwell import forecast
    from cronwell.workerpool import WorkerPoolSpec

    try:
        horizon_s, bucket_s = parse_duration(horizon), parse_duration(bucket)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if horizon_s <= 0 or bucket_s <= 0:
        raise click.BadParameter("--horizon and --bucket must be positive")
    try:
        spec = WorkerPoolSpec.model_validate(
            {
                "scaleTargetRef": {"name": "-"},
                "startSLOSeconds": slo_seconds,
                "concurrencyPerReplica": concurrency_per_replica,
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
            }
        )
    except pydantic.ValidationError as e:
        raise click.UsageError(str(e)) from None
    plt: Any = None
    if png is not None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise click.ClickException("--png needs matplotlib: pip install matplotlib") from None

    async def go() -> dict[str, forecast.PoolForecast]:
        async with env.database() as db:
            return await forecast.forecast_pools(
                db, horizon_s, pool=pool, slo_seconds=spec.start_slo_seconds
            )

    pools = run(go())
    if not pools:
        click.echo("no live jobs" + (f" in pool {pool}" if pool else "") + " and no backlog")
    step = max(1, round(bucket_s))
    fmt = "{:<20} {:>10} {:>12} {:>9}"
    for name, pf in sorted(pools.items()):
        plan = forecast.plan_replicas(pf, spec, pf.start)
        burst = plan.next_burst
        click.echo(
            f"pool {name}: {sum(pf.counts)} occurrences in {horizon}, backlog {pf.backlog}, "
            f"replicas now {plan.replicas}, next burst "
            + (f"{_fmt_time(burst.time)} ({burst.size} due)" if burst else "none")
        )
        click.echo(fmt.format("TIME (UTC)", "DUE", "CONCURRENCY", "REPLICAS"))
        for i in range(0, len(pf.counts), step):
            j = i + step
            click.echo(
                fmt.format(
                    _fmt_time(pf.bucket_time(i)),
                    sum(pf.counts[i:j]) + (pf.backlog if i == 0 else 0),
                    max(pf.concurrency[i:j]),
                    max(plan.series[i:j]),
                )
            )
    if png is not None and pools:
        fig, axes = plt.subplots(len(pools), 1, figsize=(10, 3 * len(pools)), squeeze=False)
        for ax, (name, pf) in zip(axes[:, 0], sorted(pools.items()), strict=True):
            plan = forecast.plan_replicas(pf, spec, pf.start)
            times = [pf.bucket_time(i) for i in range(len(pf.counts))]
            ax.step(times, pf.counts, where="post", label="due occurrences / s")
            ax.step(times, pf.concurrency, where="post", label="required concurrency")
            ax.set_title(f"pool {name}")
            ax.set_ylabel("occurrences")
            right = ax.twinx()
            right.step(times, plan.series, where="post", color="tab:red", label="replicas")
            right.set_ylabel("replicas")
            ax.legend(loc="upper left")
            right.legend(loc="upper right")
        fig.tight_layout()
        fig.savefig(png)
        click.echo(f"wrote {png}")


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


@db_group.command("stop")
@click.pass_obj
def db_stop(env: Env) -> None:
    """Stop the embedded PostgreSQL."""
    EmbeddedPostgres(env.db_settings.data_dir).stop()
    click.echo("embedded PostgreSQL stopped")
