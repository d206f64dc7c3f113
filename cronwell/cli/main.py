"""The `cronwell` group and what every command shares: the environment (`Env`: where the
database is), start-up (logging), running a command's coroutine with errors as one line
(`run`, `run_until_signal`) and shared options. The core's commands live in this
package's other modules; the worker and operator packages add theirs through the
`cronwell.cli` entry-point group, so this package imports neither."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import click
import pydantic

from cronwell import logs
from cronwell.embedded import EmbeddedPostgres
from cronwell.errors import CronwellError
from cronwell.settings import DatabaseSettings, SchedulerSettings
from cronwell.store import Database, migrate
from cronwell.store.replica import reads_from

T = TypeVar("T")


class Env:
    """What every command gets: where the database is and how to open it."""

    def __init__(
        self, database_url: str | None, data_dir: Path | None, read_url: str | None = None
    ):
        overrides: dict[str, Any] = {}
        if database_url:
            overrides["database_url"] = database_url
        if data_dir:
            overrides["data_dir"] = data_dir
        if read_url:
            overrides["database_read_url"] = read_url
        self.db_settings = DatabaseSettings(**overrides)
        self.embedded: EmbeddedPostgres | None = None

    def url(self) -> str:
        s = self.db_settings
        url = given_url(s.database_url, s.database_url_file, "CRONWELL_DATABASE_URL")
        if url is not None:
            return url
        self.embedded = EmbeddedPostgres(self.db_settings.data_dir)
        if not self.embedded.is_running():
            click.echo(f"starting embedded PostgreSQL in {self.db_settings.data_dir}", err=True)
        return self.embedded.start()

    def read_url(self) -> str | None:
        """The read replica's URL (None: every read on the primary)."""
        s = self.db_settings
        return given_url(
            s.database_read_url, s.database_read_url_file, "CRONWELL_DATABASE_READ_URL"
        )

    @contextlib.asynccontextmanager
    async def database(
        self,
        *,
        max_size: int | None = None,
        migrate_first: bool = False,
        partitions: int | None = None,
        reads: bool = False,
    ) -> AsyncIterator[Database]:
        """An open pool; `migrate_first` migrates (a new store gets `partitions` as its P).
        `reads`: the command has reads that tolerate staleness (`db.reads`): with a read
        URL configured they go to that replica."""
        s = self.db_settings
        size = pool_size(s, max_size)
        db = Database(
            self.url(),
            min_size=s.pool_min_size,
            max_size=size,
            connect_timeout_seconds=s.connect_timeout_seconds,
            deadline_seconds=s.deadline_seconds,
        )
        async with db:
            if migrate_first:
                await migrate(
                    db, partitions=partitions, history_partition_seconds=partition_width()
                )
            async with reads_from(
                db,
                self.read_url() if reads else None,
                max_lag_seconds=s.database_read_max_lag_seconds,
                check_seconds=s.database_read_check_seconds,
                max_size=size,
                deadline_seconds=s.deadline_seconds,
            ):
                yield db


def pool_size(settings: DatabaseSettings, command_default: int | None) -> int:
    """Connections of a command's pool: CRONWELL_POOL_MAX_SIZE when it is set, else the
    command's own default (the outbox relay 4, `cronwell dev` 10), else the setting's (8)."""
    if "pool_max_size" in settings.model_fields_set:
        return settings.pool_max_size
    return command_default or settings.pool_max_size


def given_url(url: str | None, url_file: Path | None, variable: str) -> str | None:
    """A URL given directly or in a file (a mounted Secret), with a clear line for a file
    that cannot be read, an empty one, or both given."""
    if url_file is None:
        return url or None
    if url:
        raise CronwellError(f"set {variable} or {variable}_FILE, not both")
    try:
        text = url_file.read_text().strip()
    except OSError as e:
        raise CronwellError(f"cannot read {variable}_FILE {url_file}: {e.strerror}") from None
    if not text:
        raise CronwellError(f"{variable}_FILE {url_file} is empty")
    return text


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; CronwellErrors become one clear line, never a traceback.
    On uvloop when it is installed (a dependency on Linux), as `kopf run` does: its event
    loop costs a worker less CPU per occurrence than asyncio's."""
    try:
        with asyncio.Runner(loop_factory=_uvloop()) as runner:
            return runner.run(coro)
    except CronwellError as e:
        raise click.ClickException(str(e)) from None
    except pydantic.ValidationError as e:
        raise invalid_setting(e) from None


def _uvloop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


S = TypeVar("S", bound=pydantic.BaseModel)


def partition_width() -> int:
    """CRONWELL_HISTORY_PARTITION_SECONDS, for the partitions a migration creates (the
    scheduler's maintenance creates the later ones with the same setting)."""
    return settings_or_fail(SchedulerSettings).history_partition_seconds


def settings_or_fail(cls: type[S], **opts: Any) -> S:
    """Settings from the given options (None: unset, so the environment or default applies);
    a bad value is one clear line, never a pydantic traceback."""
    try:
        return cls(**{k: v for k, v in opts.items() if v is not None})
    except pydantic.ValidationError as e:
        raise invalid_setting(e) from None


def invalid_setting(e: pydantic.ValidationError) -> click.ClickException:
    from cronwell.loader import format_validation_error

    return click.ClickException(f"invalid setting {format_validation_error(e)}")


COLLECTOR_THRESHOLDS = (50_000, 20, 10)
"""The garbage collector's thresholds in the long-running processes. With CPython's (700,
10, 10) a worker holding a claimed-ahead burst (tasks, contexts, rows: millions of objects
alive) ran a full collection each time the heap grew by a quarter: 1.1-1.2 s of its 3.1 s
of CPU for a 25,000-occurrence share of a 50k burst; collecting every 50,000 young objects
instead, 0.3 s and no full collection (bench/README.md, `burst`)."""


def tune_collector() -> None:
    """Leave what start-up made (modules, classes, settings: never garbage) out of every
    collection, and collect young objects less often (COLLECTOR_THRESHOLDS)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def run_until_signal(
    main: Callable[[], Coroutine[Any, Any, None]], on_signal: Callable[[], None]
) -> None:
    """Run a long-running process's `main` with SIGTERM/SIGINT calling `on_signal`
    (graceful first, forceful next), under the collector's thresholds for it."""
    tune_collector()

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
    "--database-read-url",
    envvar="CRONWELL_DATABASE_READ_URL",
    help="A streaming replica for reads that tolerate staleness (runs, jobs, status, "
    "forecast, the dashboard's pages, the pre-scaler's forecast). Unset: the primary.",
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
    database_read_url: str | None,
    data_dir: Path | None,
    log_level: str,
    log_format: str,
) -> None:
    """cronwell: scheduled jobs with exactly-once effect (at-least-once dispatch +
    idempotent execution, keyed by job uid and nominal instant)."""
    logs.setup(log_level, log_format)
    try:
        ctx.obj = Env(database_url, data_dir, database_read_url)
    except pydantic.ValidationError as e:  # a bad CRONWELL_* database setting
        raise invalid_setting(e) from None


metrics_port_option = click.option(
    "--metrics-port",
    type=int,
    default=0,
    envvar="CRONWELL_METRICS_PORT",
    help="Serve Prometheus /metrics on this port (0: off).",
)
