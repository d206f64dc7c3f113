"""What the CLI prints: tables, times, JSON lines and the forecast plot. Commands (and the
worker's, the operator's and the kubectl plugin's) fetch rows and hand them here, so a
table looks the same wherever it is shown."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cronwell.schedule import format_instant

if TYPE_CHECKING:
    from cronwell.backfill import BackfillResult
    from cronwell.forecast import PoolForecast, ReplicaPlan
    from cronwell.store.dead import Dead
    from cronwell.store.fences import Durability, Epoch
    from cronwell.store.gauges import StateCount
    from cronwell.store.jobs import JobSummary
    from cronwell.store.leases import Owner
    from cronwell.store.processes import Process
    from cronwell.store.runs import Run


def fmt_time(t: datetime | None) -> str:
    """A table's time: UTC to the second, `-` when unset."""
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def fmt_secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}s"


def json_line(row: Any, **extra: Any) -> str:
    """A store row (plus `extra` fields) as one JSON object; times and UUIDs as strings."""
    return json.dumps(dataclasses.asdict(row) | extra, default=str)


def json_lines(rows: Iterable[Any]) -> None:
    """One JSON object per line (`--json`) of store rows."""
    for r in rows:
        click.echo(json_line(r))


def render_runs(rows: Sequence[Run], *, as_json: bool = False) -> None:
    """The runs table (`cronwell runs`, `kubectl cronwell runs`): one renderer for both."""
    if as_json:
        json_lines(rows)
        return
    fmt = "{:<28} {:<20} {:<10} {:<9} {:>8} {:>9} {:>9} {:>4}  {}"
    click.echo(
        fmt.format(
            "JOB",
            "SCHEDULED (UTC)",
            "STATE",
            "ORIGIN",
            "JITTER",
            "LAG",
            "DURATION",
            "TRY",
            "REASON/ERROR",
        )
    )
    for r in rows:
        click.echo(
            fmt.format(
                f"{r.namespace}/{r.name}"[:28],
                fmt_time(r.scheduled_for),
                r.state,
                r.origin,
                fmt_secs(r.jitter_seconds) if r.jitter_seconds else "-",
                fmt_secs(r.lag_seconds),
                fmt_secs(r.duration_seconds),
                r.attempt,
                (r.reason or r.last_error or "").replace("\n", " ")[:60],
            )
        )
    if not rows:
        click.echo("(no occurrences)", err=True)


def render_dead(rows: Sequence[Dead], *, as_json: bool = False) -> None:
    """The dead-letter table (`cronwell dlq list`, `kubectl cronwell dlq`)."""
    if as_json:
        json_lines(rows)
        return
    fmt = "{:<28} {:<60} {:<18} {:>5}  {:<20} {}"
    click.echo(fmt.format("JOB", "KEY", "REASON", "TRIES", "FINISHED (UTC)", "ERROR"))
    for r in rows:
        click.echo(
            fmt.format(
                f"{r.namespace}/{r.name}"[:28],
                r.idempotency_key,
                (r.reason or "-")[:18],
                f"{r.attempt}/{r.max_attempts}",
                fmt_time(r.finished_at),
                (r.last_error or "").replace("\n", " ")[:80],
            )
        )
    if not rows:
        click.echo("(no dead occurrences)", err=True)


def render_jobs(rows: Iterable[JobSummary]) -> None:
    """The jobs table (`cronwell jobs`, the standalone `kubectl get scheduledjobs`)."""
    fmt = "{:<32} {:<18} {:<16} {:<8} {:<20} {:>8} {:>7}"
    click.echo(
        fmt.format(
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "NEXT RUN (UTC)", "FAILURES", "MISSED"
        )
    )
    for r in rows:
        spec = r.spec
        click.echo(
            fmt.format(
                f"{r.namespace}/{r.name}"[:32],
                spec.get("schedule") or "runAt",
                spec.get("timeZone", "UTC")[:16],
                (r.suspended_reason or "yes") if r.suspended else "no",
                fmt_time(r.next_run_at),
                r.consecutive_failures,
                r.missed_total,
            )
        )


def render_status(
    parts: Iterable[Owner],
    procs: Iterable[Process],
    counts: Iterable[StateCount],
    durability: Durability,
    epoch: Epoch | None,
) -> None:
    """`cronwell status`: durability and fence epoch, partition owners, live processes,
    occurrences by state."""
    click.echo(f"commits: {durability.describe()}")
    if epoch is not None:
        click.echo(
            f"fences: generation {epoch.generation}, timeline {epoch.timeline} "
            f"(next fence > {epoch.base})"
        )
    parts = list(parts)
    owners: dict[str, list[int]] = {}
    for p in parts:
        owners.setdefault(p.holder if p.live and p.holder else "(unowned)", []).append(p.partition)
    click.echo(f"partitions ({len(parts)}):")
    for holder, ps in sorted(owners.items()):
        click.echo(f"  {holder}: {ps}")
    click.echo("processes:")
    for r in procs:
        click.echo(
            f"  {r.role:<9} {r.id:<44} pool={r.pool or '-'} "
            f"running={r.running} {'live' if r.live else 'silent'}"
        )
    click.echo("occurrences: " + (", ".join(f"{r.state}={r.n}" for r in counts) or "none"))


def render_backfill(res: BackfillResult) -> None:
    """What `cronwell backfill` did (or, with --dry-run, would do) to each instant."""
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


def render_forecast(
    pools: Sequence[tuple[str, PoolForecast, ReplicaPlan]], *, horizon: str, bucket_seconds: float
) -> None:
    """Per pool: a summary line, then due occurrences, concurrency and replicas per bucket."""
    from cronwell.forecast import windows  # here: every command imports this module (~20 ms)

    step = max(1, round(bucket_seconds))
    fmt = "{:<20} {:>10} {:>12} {:>9}"
    for name, pf, plan in pools:
        burst = plan.next_burst
        click.echo(
            f"pool {name}: {sum(pf.counts)} occurrences in {horizon}, backlog {pf.backlog}, "
            f"replicas now {plan.replicas}, next burst "
            + (f"{fmt_time(burst.time)} ({burst.size} due)" if burst else "none")
        )
        click.echo(fmt.format("TIME (UTC)", "DUE", "CONCURRENCY", "REPLICAS"))
        for w in windows(pf, plan.series, step):
            click.echo(fmt.format(fmt_time(w.time), w.due, w.concurrency, w.replicas))


def pyplot() -> Any:
    """matplotlib's pyplot without a display, or a one-line error saying how to get it
    (called before any work, so a missing matplotlib costs nothing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--png needs matplotlib: pip install matplotlib") from None
    return plt


def plot_forecast(
    plt: Any, pools: Sequence[tuple[str, PoolForecast, ReplicaPlan]], png: Path
) -> None:
    """One panel per pool: due occurrences and required concurrency, replicas on the right."""
    fig, axes = plt.subplots(len(pools), 1, figsize=(10, 3 * len(pools)), squeeze=False)
    for ax, (name, pf, plan) in zip(axes[:, 0], pools, strict=True):
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
