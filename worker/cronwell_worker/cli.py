"""Worker commands, added to `cronwell` through the `cronwell.cli` entry points:
`worker`, `workers`, `outbox-relay` and `dev` (scheduler + workers + YAML on one
machine); `dlq` lives in cronwell_worker.dlq."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cronwell import jobs
from cronwell.cli import (
    Env,
    fmt_time,
    load_or_fail,
    metrics_port_option,
    run,
    run_until_signal,
    settings_or_fail,
)
from cronwell.errors import CronwellError
from cronwell.metrics import Metrics
from cronwell.scheduler import Scheduler
from cronwell.settings import SchedulerSettings, WorkerSettings
from cronwell.store import processes
from cronwell.store.db import Database
from cronwell.supervise import wait_event
from cronwell_worker.kubejob import KubeJobs
from cronwell_worker.outbox import HttpPublisher, Relay, RelaySettings, load_hook
from cronwell_worker.runtime import Outcome, Worker

if TYPE_CHECKING:
    from aiohttp import web


def _import(modules: tuple[str, ...]) -> None:
    """Import handler modules so their @cronwell.handler registrations exist."""
    sys.path.insert(0, str(Path.cwd()))
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise click.ClickException(f"cannot import handler module {m!r}: {e}") from None


_import_opt = click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Python module defining @cronwell.handler functions.",
)


@click.command("worker")
@click.option("--pool", default=None, help="Pool to serve (default 'default').")
@click.option("--concurrency", type=int, default=None, help="Attempts at once (default 64).")
@click.option("--lease-seconds", type=float, default=None, help="Lease (default 60).")
@click.option(
    "--claim-ahead-seconds",
    type=float,
    default=None,
    help="The least claim-ahead window: claim occurrences due within it and start each at its"
    " instant (default 2); a coming burst widens it (CRONWELL_CLAIM_AHEAD_MAX_SECONDS).",
)
@click.option(
    "--shutdown-grace-seconds",
    type=float,
    default=None,
    help="On SIGTERM, how long running attempts may finish (default 30).",
)
@click.option(
    "--outbox-url",
    default=None,
    metavar="URL",
    help="Also run the outbox relay in this process, publishing to URL.",
)
@_import_opt
@metrics_port_option
@click.pass_obj
def worker(
    env: Env,
    metrics_port: int,
    pool: str | None,
    concurrency: int | None,
    lease_seconds: float | None,
    claim_ahead_seconds: float | None,
    shutdown_grace_seconds: float | None,
    outbox_url: str | None,
    imports: tuple[str, ...],
) -> None:
    """Run a worker: claim due occurrences of a pool and execute them.

    SIGTERM stops claiming and lets running attempts finish within the grace period; a
    second SIGTERM cancels them (each is recorded, and retried unless AtMostOnce)."""
    _import(imports)
    opts: dict[str, Any] = {
        "pool": pool,
        "concurrency": concurrency,
        "lease_seconds": lease_seconds,
        "claim_ahead_seconds": claim_ahead_seconds,
        "shutdown_grace_seconds": shutdown_grace_seconds,
    }
    settings = settings_or_fail(WorkerSettings, **opts)
    stoppers: list[Callable[[], None]] = []

    async def go() -> None:
        async with env.database(migrate_first=True) as db:
            metrics = Metrics()
            w = Worker(db, settings, metrics=metrics, kube=KubeJobs(settings.pool, db=db))
            metrics.serve(metrics_port, stalled=w.live.stalled)
            stoppers.append(w.stop)
            if outbox_url is None:
                await w.run()
                return
            publisher = HttpPublisher(outbox_url)
            relay = Relay(db, publisher)
            stoppers.append(relay.stop)
            try:
                relay_task = asyncio.create_task(relay.run())
                try:
                    await w.run()
                finally:
                    relay.stop()
                    # Cancelled mid-batch, its transaction rolls back: those messages are
                    # published again later (at least once).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(15.0):
                            await relay_task
            finally:
                await publisher.aclose()

    def on_signal() -> None:
        for stop in stoppers:
            stop()

    run_until_signal(go, on_signal)


@click.command("outbox-relay")
@click.option("--url", default=None, metavar="URL", help="POST each message as JSON to URL.")
@click.option(
    "--hook",
    default=None,
    metavar="MODULE:FUNCTION",
    help="Or call this Python function with each OutboxMessage (sync or async).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Extra HTTP header (repeatable).",
)
@click.option("--batch-size", type=int, default=None, help="Messages per pass (default 100).")
@click.option("--poll-seconds", type=float, default=None, help="Idle pause (default 1).")
@click.option(
    "--drain",
    is_flag=True,
    help="Publish what is waiting, then exit (status 1 if some could not be published).",
)
@click.option("--drain-timeout", type=float, default=60.0, show_default=True, help="With --drain.")
@click.pass_obj
def outbox_relay(
    env: Env,
    url: str | None,
    hook: str | None,
    headers: tuple[str, ...],
    batch_size: int | None,
    poll_seconds: float | None,
    drain: bool,
    drain_timeout: float,
) -> None:
    """Publish transactional-outbox messages at least once (Idempotency-Key:
    <occurrence key>:outbox:<id>, the same on every re-publication)."""
    if (url is None) == (hook is None):
        raise click.UsageError("give exactly one of --url or --hook")
    extra: dict[str, str] = {}
    for h in headers:
        k, sep, v = h.partition(":")
        if not sep or not k.strip():
            raise click.UsageError(f"--header {h!r}: expected NAME:VALUE")
        extra[k.strip()] = v.strip()
    opts: dict[str, Any] = {"batch_size": batch_size, "poll_seconds": poll_seconds}
    settings = settings_or_fail(RelaySettings, **opts)
    if hook is not None:
        sys.path.insert(0, str(Path.cwd()))
        try:
            publish = load_hook(hook)
        except CronwellError as e:
            raise click.ClickException(str(e)) from None
    holder: list[Relay] = []
    left: list[int] = []

    async def go() -> None:
        http = HttpPublisher(url, headers=extra) if url is not None else None
        async with env.database(max_size=4) as db:
            relay = Relay(db, http or publish, settings)
            holder.append(relay)
            try:
                if drain:
                    n = await relay.drain(drain_timeout)
                    click.echo(f"published {n} message(s)")
                    left.append(relay.backing_off)
                else:
                    await relay.run()
            finally:
                if http is not None:
                    await http.aclose()

    if drain:
        run(go())  # bounded by --drain-timeout; Ctrl-C interrupts it
    else:
        run_until_signal(go, lambda: holder[0].stop() if holder else None)
    if left and left[0]:
        click.echo(f"{left[0]} message(s) could not be published yet; see the log", err=True)
        sys.exit(1)


@click.command("workers")
@click.pass_obj
def workers(env: Env) -> None:
    """List live workers: pool, load and version."""

    async def go() -> list[Any]:
        async with env.database() as db:
            return await processes.list_all(db, ttl_seconds=15)

    rows = [r for r in run(go()) if r.role == "worker"]
    fmt = "{:<44} {:<12} {:>8} {:<8} {:<20} {}"
    click.echo(fmt.format("WORKER", "POOL", "RUNNING", "VERSION", "HEARTBEAT (UTC)", "LIVE"))
    for r in rows:
        click.echo(
            fmt.format(
                r.id,
                r.pool or "-",
                f"{r.running}/{r.concurrency}",
                r.version or "-",
                fmt_time(r.heartbeat_at),
                "yes" if r.live else "no",
            )
        )


DEV_UI_PORT = 8480
"""The dashboard's port in `cronwell dev` (as `cronwell ui`'s default)."""


def _quiet_unless_asked() -> None:
    """`dev` prints one line per attempt itself: the processes' info logs (a job's own log
    line, each process's start, the durability notice per process) would repeat or bury
    them, so they show only when --log-level or CRONWELL_LOG_LEVEL asks for them."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    if root.get_parameter_source("log_level") is click.core.ParameterSource.DEFAULT:
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))


def _dashboard_socket(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port`, or on a free port if that one is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


async def _serve_dashboard(db: Database, sock: socket.socket) -> web.AppRunner:
    """The read-only dashboard over `db` on the bound socket (the same app as `cronwell ui`)."""
    from aiohttp import web

    from cronwell.ui.app import UiConfig, make_app

    runner = web.AppRunner(make_app(UiConfig(db=db)), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


class LiveView:
    """The `dev` console: one line per finished attempt and a summary at the end."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.lags: list[float] = []

    def __call__(self, o: Outcome) -> None:
        """Lag is measured from the jittered instant (run_at); jitter is shown apart."""
        c = o.claimed
        lag = o.start_lag
        self.outcomes[o.result] += 1
        if c.attempt == 1 and c.origin == "schedule" and lag is not None:
            self.lags.append(lag)
        jitter = (c.run_at - c.scheduled_for).total_seconds() if c.attempt == 1 else 0.0
        color = {"succeeded": "green", "retry": "yellow"}.get(o.result, "red")
        click.echo(
            f"{c.namespace}/{c.name:<24} scheduled {fmt_time(c.scheduled_for)}  "
            + (f"jitter {jitter:6.1f}s  " if jitter else "")
            + (f"lag {lag:7.3f}s  " if lag is not None else "not started  ")
            + click.style(f"{o.result:<10}", fg=color)
            + f" attempt {c.attempt}"
            + (f"  {o.error[:80]}" if o.error else "")
        )

    def summary(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.outcomes.items())] or ["no attempts"]
        if self.lags:
            lags = sorted(self.lags)
            p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
            parts.append(
                f"start lag p50={statistics.median(lags):.3f}s p99={p99:.3f}s max={lags[-1]:.3f}s"
            )
        return "summary: " + ", ".join(parts)


@click.command("dev")
@click.option(
    "--jobs",
    "jobs_dir",
    type=click.Path(path_type=Path),
    default=Path("examples"),
    show_default=True,
    help="Folder (or file) of ScheduledJob YAML.",
)
@click.option(
    "--duration", type=float, default=0, help="Stop after this many seconds (0: until Ctrl-C)."
)
@click.option("--workers", "n_workers", type=int, default=2, show_default=True)
@click.option(
    "--pool", "pools", multiple=True, help="Pools to serve (default: every pool the jobs name)."
)
@click.option(
    "--ui-port",
    type=click.IntRange(0, 65535),
    default=DEV_UI_PORT,
    show_default=True,
    help="Serve the read-only dashboard on 127.0.0.1 at this port (another free one if it "
    "is taken); 0: no dashboard.",
)
@_import_opt
@click.pass_obj
def dev(
    env: Env,
    jobs_dir: Path,
    duration: float,
    n_workers: int,
    pools: tuple[str, ...],
    ui_port: int,
    imports: tuple[str, ...],
) -> None:
    """Apply YAML and run a scheduler and workers in one process, printing each attempt
    (and serving the dashboard)."""
    _quiet_unless_asked()
    _import(imports)
    loaded = load_or_fail((jobs_dir,), standalone=True)
    # Bound before the database starts, so its URL is the first line a newcomer sees.
    ui_sock = _dashboard_socket(ui_port) if ui_port else None
    if ui_sock is not None:
        click.echo(f"dashboard: http://127.0.0.1:{ui_sock.getsockname()[1]}/")
    view = LiveView()
    stop = asyncio.Event()
    serve = sorted(set(pools) or {i.job.spec.pool for i in loaded} or {"default"})
    settings = SchedulerSettings()

    async def go() -> None:
        async with env.database(max_size=10, migrate_first=True) as db:
            for item in loaded:
                a = await jobs.apply_job(
                    db,
                    namespace=item.job.metadata.namespace,
                    name=item.job.metadata.name,
                    spec=item.job.spec,
                    labels=item.job.metadata.labels,
                )
                click.echo(
                    f"{a.namespace}/{a.name}: {a.action}, next run {fmt_time(a.next_run_at)} UTC"
                )
            ui = await _serve_dashboard(db, ui_sock) if ui_sock is not None else None
            sched = Scheduler(db, settings)
            ws = [
                Worker(db, WorkerSettings(pool=p, concurrency=16), on_outcome=view)
                for p in serve
                for _ in range(max(1, n_workers))
            ]
            tasks = [asyncio.create_task(sched.run())] + [asyncio.create_task(w.run()) for w in ws]
            click.echo(
                f"running 1 scheduler and {len(ws)} worker(s) for pools "
                f"{', '.join(serve)}" + (f" for {duration:g}s" if duration else " (Ctrl-C to stop)")
            )
            await wait_event(stop, duration or None)
            sched.stop()
            for w in ws:
                w.stop()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            if ui is not None:
                await ui.cleanup()
            for r in results:
                if isinstance(r, CronwellError):
                    raise r
        click.echo(view.summary())

    run_until_signal(go, stop.set)
