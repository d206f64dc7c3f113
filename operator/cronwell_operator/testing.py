"""Run the operator as a real process in tests (SIGTERM it, kill -9 it, read its log),
as kopf.testing does for in-process runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class OperatorProcess:
    """`python -m cronwell_operator` against a kubeconfig and a database URL."""

    def __init__(
        self,
        kubeconfig: Path | str,
        database_url: str,
        log: Path,
        *,
        identity: str = "op-1",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        self.kubeconfig = str(kubeconfig)
        self.database_url = database_url
        self.log = log
        self.identity = identity
        self.args = list(args)
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0
        self._terminated = False

    def start(self) -> OperatorProcess:
        self._terminated = False
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        out = self.log.open("ab")
        env = os.environ | {
            "CRONWELL_DATABASE_URL": self.database_url,
            "KUBECONFIG": self.kubeconfig,
            "CRONWELL_LOG_LEVEL": "INFO",
        }
        argv = [sys.executable, "-m", "cronwell_operator", "--kubeconfig", self.kubeconfig]
        argv += ["--identity", self.identity, *self.args]
        self.proc = subprocess.Popen(
            argv,
            env=env | self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        return self

    def output(self) -> str:
        """What this run (since start()) logged."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 60) -> None:
        wait_until(
            lambda: text in self.output(),
            timeout,
            f"{self.identity} never logged {text!r}",
            check=self._alive,
        )

    def wait_ready(self, timeout: float = 60) -> OperatorProcess:
        self.wait_for_log("operator ready", timeout)
        return self

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"operator {self.identity} exited with {self.proc.returncode}:\n"
                + self.output()[-4000:]
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (graceful: kopf stops, the Lease is released), SIGKILL after `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if not self._terminated:  # one SIGTERM, as the kubelet sends
                self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def terminate(self) -> None:
        """Send SIGTERM and return at once (see stop() to wait for the exit)."""
        if self.proc is not None and self.proc.poll() is None:
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """kill -9: no cleanup at all, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str,
    *,
    interval: float = 0.2,
    check: Callable[[], None] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy; fail with `message` after
    `timeout` seconds (`check` may raise earlier, e.g. when a process died)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} (after {timeout}s)")
        time.sleep(interval)


#: Lease timings for tests: a dead leader is replaced within ~3 s instead of ~15 s.
FAST_LEASE_ARGS = (
    "--lease-duration-seconds", "3",
    "--renew-deadline-seconds", "2",
    "--retry-period-seconds", "0.5",
)  # fmt: skip


def create_database(server_port: int, template: str | None, name: str, options: str = "") -> str:
    """A new database on a local PostgreSQL, cloned from a migrated template (empty when
    `template` is None), with CREATE DATABASE `options` (a collation, say); its URL."""
    import psycopg

    admin = f"postgresql://postgres@127.0.0.1:{server_port}/postgres"
    clone = f" TEMPLATE {template}" if template else ""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}{clone} {options}".rstrip())
    return f"postgresql://postgres@127.0.0.1:{server_port}/{name}"


def sql(
    url: str, query: str, params: dict[str, Any] | tuple[Any, ...] = ()
) -> list[dict[str, Any]]:
    """Run one statement on `url`; its rows as dicts (empty for statements without rows)."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []
