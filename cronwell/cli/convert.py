"""`cronwell convert`: CronJob YAML to ScheduledJob YAML (cronwell/convert.py does the work;
this prints it: YAML to stdout, warnings and errors to stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cronwell.cli.main import main


@main.command("convert")
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path),
    help="A CronJob YAML file, a folder of them, or - for stdin (e.g. the output of "
    "`kubectl get cronjobs -A -o yaml`).",
)
def convert_cmd(paths: tuple[Path, ...]) -> None:
    """Convert CronJobs to ScheduledJobs with a job target, keeping the CronJob's behaviour.

    Prints the ScheduledJobs as YAML; every field that is not carried as it was is a warning
    on stderr. Any CronJob that cannot be converted is an error: nothing is printed and the
    exit status is 1 (so a pipe into `kubectl apply -f -` applies all or nothing)."""
    from cronwell import convert

    stdin = sys.stdin.read() if any(str(p) == "-" for p in paths) else None
    converted, errors = convert.convert_paths(paths, stdin)
    for c in converted:
        for w in c.warnings:
            click.secho(f"warning: {c.source}: {w}", fg="yellow", err=True)
    for e in errors:
        click.secho(f"error: {e}", fg="red", err=True)
    if errors:
        raise click.ClickException(
            f"{len(errors)} document(s) not converted; nothing printed: fix them and convert again"
        )
    if not converted:
        raise click.ClickException("no CronJob found in " + ", ".join(map(str, paths)))
    click.echo(convert.dump(converted), nl=False)
    click.echo(f"converted {len(converted)} CronJob(s)", err=True)
