"""`cronwell scheduler`: a scheduler replica (the worker and operator packages add the
other long-running processes)."""

from __future__ import annotations

from typing import Any

import click

from cronwell.cli.main import Env, main, metrics_port_option, run_until_signal, settings_or_fail
from cronwell.cli.parse import duration_option
from cronwell.metrics import Metrics
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings


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
    settings = settings_or_fail(SchedulerSettings, **opts)
    metrics = Metrics()
    holder: list[Scheduler] = []
    metrics.serve(metrics_port, stalled=lambda: holder[0].live.stalled() if holder else [])

    async def go() -> None:
        async with env.database(migrate_first=True, partitions=settings.partitions) as db:
            s = Scheduler(db, settings, metrics=metrics)
            holder.append(s)
            await s.run()

    run_until_signal(go, lambda: holder[0].stop() if holder else None)
