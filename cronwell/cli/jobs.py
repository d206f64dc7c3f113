"""Commands on jobs and their runs in the store: apply, delete, trigger, suspend, resume,
pause, jobs (list) and runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cronwell import jobs
from cronwell.cli import render
from cronwell.cli.main import Env, main, run
from cronwell.store import jobs as store_jobs
from cronwell.store import runs


def load_or_fail(paths: tuple[Path, ...], *, standalone: bool = False) -> list[Any]:
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
            if item.job.spec.target.job is not None:
                errors.append(SpecError(f"{item.source} (ScheduledJob {item.job.metadata.name})"
                                        ": spec.target.job runs a Kubernetes Job, and standalone "
                                        "mode has no cluster: kubectl apply it to a cluster "
                                        "running cronwell's operator",
                                        source=item.source))  # fmt: skip
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
    return loaded


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
    loaded = load_or_fail(paths, standalone=True)

    async def go() -> list[jobs.Applied]:
        async with env.database(migrate_first=True) as db:
            return [
                await jobs.apply_job(
                    db,
                    namespace=item.job.metadata.namespace,
                    name=item.job.metadata.name,
                    spec=item.job.spec,
                    labels=item.job.metadata.labels,
                )
                for item in loaded
            ]

    for a in run(go()):
        click.echo(
            f"scheduledjob.cronwell.dev/{a.name} {a.action} (namespace {a.namespace}, "
            f"next {a.next_run_at.isoformat() if a.next_run_at else '-'})"
        )


@main.command("delete")
@click.option("-f", "--filename", "paths", multiple=True, type=click.Path(path_type=Path))
@click.option("-n", "--namespace", default="default", show_default=True)
@click.argument("names", nargs=-1)
@click.pass_obj
def delete_cmd(env: Env, paths: tuple[Path, ...], namespace: str, names: tuple[str, ...]) -> None:
    """Delete ScheduledJobs (by file or by name); their history is kept."""
    loaded = load_or_fail(paths) if paths else []
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


@main.command("jobs")
@click.option("-n", "--namespace", default=None)
@click.pass_obj
def jobs_cmd(env: Env, namespace: str | None) -> None:
    """List jobs in the store (the standalone `kubectl get scheduledjobs`)."""

    async def go() -> list[store_jobs.JobSummary]:
        async with env.database(reads=True) as db:
            return await store_jobs.list_live(db.reads, namespace=namespace)

    render.render_jobs(run(go()))


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

    async def go() -> list[runs.Run]:
        async with env.database(reads=True) as db:
            return await runs.list_runs(
                db.reads, name=name, namespace=namespace, state=state, limit=limit
            )

    render.render_runs(run(go()), as_json=as_json)
