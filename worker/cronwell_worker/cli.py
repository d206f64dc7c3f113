"""Worker commands, added to `cronwell` through the `cronwell.cli` entry points:
`worker`, `workers` and `dev` (scheduler + workers + YAML on one machine)."""

from __future__ import annotations

import asyncio
import importlib
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click

from cronwell import jobs
from cronwell.cli import Env, _fmt_time, _load_or_fail, run, run_until_signal
from cronwell.errors import CronwellError
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings, WorkerSettings
from cronwell_worker.runtime import Outcome, Worker


def _import(modules: tuple[str, ...]) -> None:
    """Import handler modules so their @cronwell.handler registrations exist."""
    sys.path.insert(0, str(Path.cwd()))
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise click.ClickException(f"cannot import handler module {m!r}: {e}") from None


_import_opt = click.option("--import", "imports", multiple=True, metavar="MODULE",
                           help="Python module defining @cronwell.handler functions.")


@click.command("worker")
@click.option("--pool", default=None, help="Pool to serve (default 'default').")
@click.option("--concurrency", type=int, default=None, help="Attempts at once (default 64).")
@click.option("--lease-seconds", type=float, default=None, help="Lease (default 60).")
@_import_opt
@click.pass_obj
def worker(env: Env, pool: str | None, concurrency: int | None, lease_seconds: float | None,
           imports: tuple[str, ...]) -> None:
    """Run a worker: claim due occurrences of a pool and execute them."""
    _import(imports)
    opts = {"pool": pool, "concurrency": concurrency, "lease_seconds": lease_seconds}
    settings = WorkerSettings(**{k: v for k, v in opts.items() if v is not None})
    holder: list[Worker] = []

    async def go() -> None:
        async with env.database(max_size=8, migrate_first=True) as db:
            w = Worker(db, settings)
            holder.append(w)
            await w.run()

    run_until_signal(go, lambda: holder[0].stop() if holder else None)


@click.command("workers")
@click.pass_obj
def workers(env: Env) -> None:
    """List live workers: pool, load and version."""

    async def go() -> list[Any]:
        async with env.database() as db:
            return await db.fetch("ProcessList", {"ttl": 15})

    rows = [r for r in run(go()) if r["role"] == "worker"]
    fmt = "{:<44} {:<12} {:>8} {:<8} {:<20} {}"
    click.echo(fmt.format("WORKER", "POOL", "RUNNING", "VERSION", "HEARTBEAT (UTC)", "LIVE"))
    for r in rows:
        click.echo(fmt.format(r["id"], r["pool"] or "-", f"{r['running']}/{r['concurrency']}",
                              r["version"] or "-", _fmt_time(r["heartbeat_at"]),
                              "yes" if r["live"] else "no"))


class LiveView:
    """The `dev` console: one line per finished attempt and a summary at the end."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.lags: list[float] = []

    def __call__(self, o: Outcome) -> None:
        c = o.claimed
        lag = (c.started_at - c.scheduled_for).total_seconds()
        self.outcomes[o.result] += 1
        if c.attempt == 1 and c.origin == "schedule":
            self.lags.append(lag)
        color = {"succeeded": "green", "retry": "yellow"}.get(o.result, "red")
        click.echo(
            f"{c.namespace}/{c.name:<24} scheduled {_fmt_time(c.scheduled_for)}  "
            f"lag {lag:7.3f}s  " + click.style(f"{o.result:<10}", fg=color)
            + f" attempt {c.attempt}" + (f"  {o.error[:80]}" if o.error else ""))

    def summary(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.outcomes.items())] or ["no attempts"]
        if self.lags:
            lags = sorted(self.lags)
            p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
            parts.append(f"start lag p50={statistics.median(lags):.3f}s p99={p99:.3f}s "
                         f"max={lags[-1]:.3f}s")
        return "summary: " + ", ".join(parts)


@click.command("dev")
@click.option("--jobs", "jobs_dir", type=click.Path(path_type=Path), default=Path("examples"),
              show_default=True, help="Folder (or file) of ScheduledJob YAML.")
@click.option("--duration", type=float, default=0, help="Stop after this many seconds "
              "(0: until Ctrl-C).")
@click.option("--workers", "n_workers", type=int, default=2, show_default=True)
@click.option("--pool", "pools", multiple=True, help="Pools to serve (default: every pool "
              "the jobs name).")
@_import_opt
@click.pass_obj
def dev(env: Env, jobs_dir: Path, duration: float, n_workers: int, pools: tuple[str, ...],
        imports: tuple[str, ...]) -> None:
    """Apply YAML and run a scheduler and workers in one process, printing each attempt."""
    _import(imports)
    loaded, n_errors = _load_or_fail((jobs_dir,))
    view = LiveView()
    stop = asyncio.Event()
    serve = sorted(set(pools) or {i.job.spec.pool for i in loaded} or {"default"})
    settings = SchedulerSettings()

    async def go() -> None:
        async with env.database(max_size=10, migrate_first=True) as db:
            for item in loaded:
                a = await jobs.apply_job(db, namespace=item.job.metadata.namespace,
                                         name=item.job.metadata.name, spec=item.job.spec,
                                         partitions=settings.partitions)
                click.echo(f"{a.namespace}/{a.name}: {a.action}, next run "
                           f"{_fmt_time(a.next_run_at)} UTC")
            if n_errors:
                click.secho(f"{n_errors} invalid document(s) skipped (see above)", fg="yellow")
            sched = Scheduler(db, settings)
            ws = [Worker(db, WorkerSettings(pool=p, concurrency=16), on_outcome=view)
                  for p in serve for _ in range(max(1, n_workers))]
            tasks = [asyncio.create_task(sched.run())] + [asyncio.create_task(w.run())
                                                            for w in ws]
            click.echo(f"running 1 scheduler and {len(ws)} worker(s) for pools "
                       f"{', '.join(serve)}" + (f" for {duration:g}s" if duration else
                                                 " (Ctrl-C to stop)"))
            try:
                await asyncio.wait_for(stop.wait(), duration or None)
            except TimeoutError:
                pass
            sched.stop()
            for w in ws:
                w.stop()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for r in results:
                if isinstance(r, CronwellError):
                    raise r
        click.echo(view.summary())

    run_until_signal(go, stop.set)
