"""`cronwell forecast`: each pool's demand ahead and the replicas to plan for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pydantic

from cronwell.cli import render
from cronwell.cli.main import Env, main, run
from cronwell.cli.parse import parse_duration


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
    from cronwell import fleet_forecast, forecast
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
    plt: Any = None if png is None else render.pyplot()

    async def go() -> dict[str, forecast.PoolForecast]:
        async with env.database(reads=True) as db:
            return await fleet_forecast.Forecaster().forecast(
                db.reads, horizon_s, pool=pool, slo_seconds=spec.start_slo_seconds
            )

    pools = run(go())
    if not pools:
        click.echo("no live jobs" + (f" in pool {pool}" if pool else "") + " and no backlog")
    planned = [
        (name, pf, forecast.plan_replicas(pf, spec, pf.start)) for name, pf in sorted(pools.items())
    ]
    render.render_forecast(planned, horizon=horizon, bucket_seconds=bucket_s)
    if png is not None and planned:
        render.plot_forecast(plt, planned, png)
