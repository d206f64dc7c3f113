"""cronwell chaos suite: a bounded, seeded run that proves exactly-once *effect* under faults.

    .venv/bin/python -m tests.chaos.runner --seed 1 --jobs 2000 --duration 180 \\
        [--schedulers 2 --workers 3]
    .venv/bin/python -m tests.chaos.runner --seed 1 --jobs 200 --duration 65 --faults each   (short)

Starts its own embedded PostgreSQL (durability on) in a temp dir, applies a seeded mix of
6-field cron jobs (http -> a ledger server on 127.0.0.1, and handler jobs writing through
ctx.transaction() + ctx.outbox() + ctx.fenced_write()), runs `cronwell scheduler` and
`cronwell worker` processes whose database traffic goes through a TCP proxy written here,
injects faults from the seed, drains, then checks the invariants against occurrences computed
independently with croniter. Exit status 1 on any violation; JSON report in
bench/results/chaos-<seed>.json (or --out).

Fault types: kill9_scheduler, kill9_worker, sigstop_worker, pg_immediate_restart, proxy_cut,
proxy_delay, proxy_blackhole, clock_skew (faketime). The operator is out of scope.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from croniter import croniter
from psycopg.rows import dict_row

from cronwell import jobs
from cronwell.embedded import EmbeddedPostgres
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, migrate

ROOT = Path(__file__).resolve().parents[2]

HANDLERS_MODULE = "tests.chaos.chaos_handlers"
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS chaos_effects (id bigserial PRIMARY KEY, key text NOT NULL,"
    " fence bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
    " at timestamptz NOT NULL DEFAULT now())"
)
FAULT_TYPES = [
    "clock_skew",
    "kill9_worker",
    "kill9_scheduler",
    "sigstop_worker",
    "pg_immediate_restart",
    "proxy_cut",
    "proxy_delay",
    "proxy_blackhole",
]
# (period seconds, weight): a few per-second jobs, most every 10-60 s.
PERIODS = [(1, 0.0025), (2, 0.005), (5, 0.02), (10, 0.075), (15, 0.10), (30, 0.30), (60, 0.4975)]
LEASE = 3.0
PARTITION_LEASE = 3.0
LAG_OK = 5.0


def now() -> float:
    return time.time()


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the ledger ---------------------------------------------------------------------------


@dataclass
class Ledger:
    """Records every request (key, fence, arrival); rejects (409) a fence lower than one
    already accepted for the key. The first accept of a key is its effect."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    max_fence: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    rejected: int = 0
    port: int = 0
    rng: random.Random = field(default_factory=random.Random)

    async def start(self) -> asyncio.AbstractServer:
        server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await r.readline()
                if not line:
                    return
                headers: dict[str, str] = {}
                while True:
                    h = await r.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                if n:
                    await r.readexactly(n)
                status = self._record(headers)
                # A little latency: a worker can be paused/killed between send and answer.
                await asyncio.sleep(self.rng.random() * 0.05)
                body = b"ok" if status == 200 else b"stale fence"
                reason = b"OK" if status == 200 else b"Conflict"
                w.write(
                    b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s"
                    % (status, reason, len(body), body)
                )
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    def _record(self, headers: dict[str, str]) -> int:
        key = headers.get("idempotency-key", "")
        fence = int(headers.get("cronwell-fence-token", "-1"))
        t = now()
        best = self.max_fence.get(key)
        ok = best is None or fence >= best
        self.requests.append({"key": key, "fence": fence, "t": t, "ok": ok})
        if not ok:
            self.rejected += 1
            return 409
        self.max_fence[key] = fence
        self.accepted[key].append((fence, t))
        return 200


# -- the TCP proxy between cronwell processes and PostgreSQL ---------------------------


class Proxy:
    """Modes: normal; delay (latency per chunk); blackhole (nothing forwarded, bytes held as
    a partitioned TCP path would retransmit them later); cut() resets every connection."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.port = 0
        self.delay = 0.0
        self.open = asyncio.Event()
        self.open.set()
        self.conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.n_conns = 0

    async def start(self) -> asyncio.AbstractServer:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.n_conns += 1
        await self.open.wait()
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.upstream), 10)
        except (OSError, TimeoutError):
            cw.close()
            return
        pair = (cw, uw)
        self.conns.add(pair)
        try:
            await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        finally:
            self.conns.discard(pair)
            for w in pair:
                with contextlib.suppress(Exception):
                    w.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self.open.wait()
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    def cut(self) -> int:
        n = 0
        for pair in list(self.conns):
            for w in pair:
                with contextlib.suppress(Exception):
                    w.transport.abort()
            n += 1
        return n


# -- processes ------------------------------------------------------------------------------


def signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group (a `faketime` wrapper's child too), never a broad name."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


@dataclass
class Slot:
    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
    skew: str | None = None
    starts: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


class Fleet:
    def __init__(self, db_url: str, logs: Path, partitions: int):
        self.db_url = db_url
        self.logs = logs
        self.partitions = partitions
        self.slots: list[Slot] = []

    def env(self) -> dict[str, str]:
        return os.environ | {
            "CRONWELL_DATABASE_URL": self.db_url,
            # The ledger listens on 127.0.0.1, denied to http targets by default.
            "CRONWELL_EGRESS_ALLOW_CIDRS": "127.0.0.1/32",
            "CRONWELL_PARTITIONS": str(self.partitions),
            "CRONWELL_PARTITION_LEASE_SECONDS": str(PARTITION_LEASE),
            "CRONWELL_HORIZON_SECONDS": "10",
            "CRONWELL_TICK_SECONDS": "0.5",
            "CRONWELL_LEASE_SECONDS": str(LEASE),
            "CRONWELL_POLL_SECONDS": "1",
            "CRONWELL_SHUTDOWN_GRACE_SECONDS": "5",
            "CRONWELL_CONNECT_TIMEOUT_SECONDS": "5",
            "CRONWELL_LOG_LEVEL": "INFO",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "worker")]),
        }

    def start(self, slot: Slot) -> None:
        args = [sys.executable, "-m", "cronwell", "--database-url", self.db_url, slot.role]
        if slot.role == "worker":
            args += ["--import", HANDLERS_MODULE, "--concurrency", "64"]
        env = self.env()
        if slot.skew:
            args = ["faketime", "-f", slot.skew, *args]
            env |= {"DONT_FAKE_MONOTONIC": "1"}
        out = open(self.logs / f"{slot.name}.log", "ab")  # noqa: SIM115
        out.write(f"\n==== start {slot.starts} skew={slot.skew} at {time.time():.3f}\n".encode())
        out.flush()
        slot.proc = subprocess.Popen(
            args,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
        )
        out.close()
        slot.starts += 1

    def add(self, role: str, n: int) -> None:
        for i in range(n):
            s = Slot(role, i)
            self.slots.append(s)
            self.start(s)

    def of(self, role: str) -> list[Slot]:
        return [s for s in self.slots if s.role == role]

    def stop_all(self) -> dict[str, int | None]:
        for s in self.slots:
            if s.proc and s.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s.proc.pid, signal.SIGCONT)
                signal_group(s.proc, signal.SIGTERM)
        rcs: dict[str, int | None] = {}
        for s in self.slots:
            if s.proc:
                try:
                    s.proc.wait(20)
                except subprocess.TimeoutExpired:
                    signal_group(s.proc, signal.SIGKILL)
                    s.proc.wait()
                rcs[s.name] = s.proc.returncode
        return rcs

    def crashed(self) -> list[str]:
        """Processes that exited on their own (not killed by us)."""
        return [
            f"{s.name} rc={s.proc.returncode}"
            for s in self.slots
            if s.proc is not None and s.proc.poll() is not None and s.proc.returncode != -9
        ]


# -- the run --------------------------------------------------------------------------------


@dataclass
class JobDef:
    name: str
    expr: str
    kind: str  # http | handler
    overlap: str
    id: str = ""


def make_jobs(rng: random.Random, n: int) -> list[JobDef]:
    out = []
    periods = [p for p, _ in PERIODS]
    weights = [w for _, w in PERIODS]
    for i in range(n):
        p = rng.choices(periods, weights)[0]
        if i < 2:
            p = 1  # at least a couple of per-second jobs whatever the size
        off = rng.randrange(p)
        expr = (
            "* * * * * *" if p == 1 else (f"{off} * * * * *" if p == 60 else f"{off}/{p} * * * * *")
        )
        kind = "http" if rng.random() < 0.5 else "handler"
        overlap = "Skip" if rng.random() < 0.1 else "Allow"
        out.append(JobDef(f"chaos-{i:05d}", expr, kind, overlap))
    return out


def spec_for(j: JobDef, ledger_port: int) -> ScheduledJobSpec:
    target: dict[str, Any]
    if j.kind == "http":
        target = {
            "http": {
                "url": f"http://127.0.0.1:{ledger_port}/effect",
                "method": "POST",
                "connectTimeoutSeconds": 2,
            }
        }
    else:
        target = {"handler": {"name": "chaos.effect", "payload": {"max_sleep": 0.2}}}
    return ScheduledJobSpec.model_validate(
        {
            "schedule": j.expr,
            "timeZone": "UTC",
            "concurrencyPolicy": j.overlap,
            "misfirePolicy": "RunAll",
            "retry": {
                "maxAttempts": 25,
                "initialDelaySeconds": 0.5,
                "factor": 2,
                "maxDelaySeconds": 3,
            },
            "timeoutSeconds": 10,
            "successfulJobsHistoryLimit": 100000,
            "failedJobsHistoryLimit": 100000,
            "target": target,
        }
    )


def expected_instants(expr: str, lo: datetime, hi: datetime) -> list[datetime]:
    """Independent of cronwell: croniter directly, UTC, instants in [lo, hi]."""
    it = croniter(expr, lo - timedelta(seconds=1), second_at_beginning=True)
    out = []
    while True:
        t = it.get_next(datetime)
        if t > hi:
            return out
        if t >= lo:
            out.append(t.replace(tzinfo=UTC))


async def q(url: str, sql: str, args: Any = None) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=3, row_factory=dict_row
    ) as c:
        cur = await c.execute(sql, args)
        return await cur.fetchall() if cur.description else []


class Monitor:
    """Samples health every second (directly to PostgreSQL, not through the proxy):
    healthy = no job whose next instant is more than LAG_OK s overdue for materialisation and
    no never-started occurrence more than LAG_OK s past its run_at."""

    def __init__(self, url: str):
        self.url = url
        self.samples: list[tuple[float, bool, int, int]] = []  # t, healthy, succeeded, overdue

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = now()
            try:
                rows = await asyncio.wait_for(
                    q(
                        self.url,
                        f"""
    SELECT (SELECT count(*) FROM cronwell_jobs WHERE deleted_at IS NULL AND NOT suspended
              AND next_run_at < now() - interval '{LAG_OK} s') AS late_jobs,
           (SELECT count(*) FROM cronwell_occurrences WHERE state = 'pending'
              AND attempt = 0 AND run_at < now() - interval '{LAG_OK} s') AS late_occ,
           (SELECT count(*) FROM cronwell_occurrences WHERE state = 'succeeded') AS ok
                """,
                    ),
                    2.0,
                )
                r = rows[0]
                overdue = int(r["late_jobs"]) + int(r["late_occ"])
                self.samples.append((t, overdue == 0, int(r["ok"]), overdue))
            except Exception:
                self.samples.append((t, False, -1, -1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.1, 1.0 - (now() - t)))

    def recovery_after(self, t_end: float) -> float | None:
        for t, healthy, _, _ in self.samples:
            if t >= t_end and healthy:
                return round(t - t_end, 2)
        return None

    def unhealthy_between(self, a: float, b: float) -> bool:
        return any(not h for t, h, _, _ in self.samples if a <= t <= b)


class Chaos:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.faults: list[dict[str, Any]] = []
        self.log_lines: list[str] = []

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        self.log_lines.append(line)
        print(line, flush=True)

    # -- fault schedule --
    def plan(self, t0: float) -> list[tuple[float, str]]:
        a = self.args
        types = [t for t in FAULT_TYPES if t not in a.skip_faults]
        if a.faults == "each":
            gap = (a.duration - a.warmup - 7) / max(1, len(types))
            return [(t0 + a.warmup + i * gap, t) for i, t in enumerate(types)]
        plan = []
        t = t0 + a.warmup
        order = types[:]
        self.rng.shuffle(order)
        while t < t0 + a.duration - 15 and len(plan) < 40:
            kind = order.pop(0) if order else self.rng.choice(types)
            plan.append((t, kind))
            t += self.rng.uniform(8, 16)
        return plan

    async def inject(
        self, kind: str, fleet: Fleet, pg: EmbeddedPostgres, proxy: Proxy
    ) -> dict[str, Any]:
        rng = self.rng
        f: dict[str, Any] = {"type": kind, "start": now()}
        if kind in ("kill9_worker", "kill9_scheduler"):
            slot = rng.choice(fleet.of(kind.split("_")[1]))
            assert slot.proc is not None
            os.killpg(slot.proc.pid, signal.SIGKILL)
            slot.proc.wait()
            down = rng.uniform(0.5, 2.0)
            await asyncio.sleep(down)
            fleet.start(slot)
            f |= {"target": slot.name, "down_s": round(down, 2)}
        elif kind == "sigstop_worker":
            slot = rng.choice(fleet.of("worker"))
            assert slot.proc is not None
            os.killpg(slot.proc.pid, signal.SIGSTOP)
            paused = LEASE + rng.uniform(1.5, 3.5)
            await asyncio.sleep(paused)
            os.killpg(slot.proc.pid, signal.SIGCONT)
            f |= {"target": slot.name, "paused_s": round(paused, 2)}
        elif kind == "pg_immediate_restart":
            await asyncio.to_thread(pg.stop, "immediate")
            down = rng.uniform(1.0, 3.0)
            await asyncio.sleep(down)
            await asyncio.to_thread(pg._launch, pg.port)  # same port, as restart() does
            f |= {"down_s": round(down, 2)}
        elif kind == "proxy_cut":
            f["connections_cut"] = proxy.cut()
        elif kind == "proxy_delay":
            proxy.delay = rng.uniform(0.1, 0.4)
            span = rng.uniform(3, 6)
            await asyncio.sleep(span)
            f |= {"delay_s": round(proxy.delay, 3), "span_s": round(span, 2)}
            proxy.delay = 0.0
        elif kind == "proxy_blackhole":
            proxy.open.clear()
            span = LEASE + rng.uniform(1.0, 3.0)
            await asyncio.sleep(span)
            proxy.open.set()
            f |= {"span_s": round(span, 2)}
        elif kind == "clock_skew":
            if shutil.which("faketime") is None:
                f["inconclusive"] = "faketime unavailable"
            else:
                role = (
                    "scheduler"
                    if self.args.faults == "each"
                    else rng.choice(["scheduler", "worker"])
                )
                slot = rng.choice(fleet.of(role))
                skew = rng.choice(["+", "-"]) + str(rng.randint(120, 900)) + "s"
                assert slot.proc is not None
                signal_group(slot.proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(slot.proc.wait, 15)
                if slot.proc.poll() is None:
                    # Evidence for the report: where the process is stuck after SIGTERM.
                    dump = await asyncio.to_thread(
                        subprocess.run,
                        [
                            str(Path(sys.executable).parent / "py-spy"),
                            "dump",
                            "--pid",
                            str(slot.proc.pid),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=30,
                        check=False,
                    )
                    (fleet.logs / f"{slot.name}-sigterm-stuck.txt").write_text(
                        dump.stdout + dump.stderr
                    )
                    f["sigterm_ignored"] = True
                    signal_group(slot.proc, signal.SIGKILL)
                    slot.proc.wait()
                slot.skew = skew
                fleet.start(slot)
                f |= {
                    "target": slot.name,
                    "skew": skew,
                    "stop_s": round(now() - f["start"], 2),
                    "measured_skew_s": await measure_skew(skew),
                }
        f["end"] = now()
        self.say(
            f"fault {kind}: "
            + json.dumps({k: v for k, v in f.items() if k not in ("start", "end")})
        )
        return f

    async def main(self) -> int:
        a = self.args
        tmp = Path(tempfile.mkdtemp(prefix=f"cronwell-chaos-{a.seed}-"))
        logs = tmp / "logs"
        logs.mkdir()
        self.say(
            f"seed {a.seed}: {a.jobs} jobs, {a.duration}s, {a.schedulers} schedulers, "
            f"{a.workers} workers, faults={a.faults}; work dir {tmp}"
        )
        pg = EmbeddedPostgres(tmp / "pg", settings={"fsync": "on", "synchronous_commit": "on"})
        fleet: Fleet | None = None
        servers: list[asyncio.AbstractServer] = []
        violations: list[str] = []
        report: dict[str, Any] = {}
        try:
            direct = await asyncio.to_thread(pg.start)
            async with Database(direct, max_size=4) as db:
                await migrate(db, partitions=a.partitions)
                async with db.connection() as conn:
                    await conn.execute(EFFECTS_DDL)
                ledger = Ledger(rng=random.Random(a.seed + 1))
                servers.append(await ledger.start())
                proxy = Proxy(pg.port)
                servers.append(await proxy.start())
                defs = make_jobs(self.rng, a.jobs)
                t_apply = now()
                for j in defs:
                    applied = await jobs.apply_job(
                        db,
                        namespace="default",
                        name=j.name,
                        spec=spec_for(j, ledger.port),
                    )
                    j.id = str(applied.job_id) if hasattr(applied, "job_id") else ""
                rows = await db_fetch(direct, "SELECT id, name FROM cronwell_jobs")
                ids = {r["name"]: str(r["id"]) for r in rows}
                for j in defs:
                    j.id = ids[j.name]
                self.say(
                    f"applied {len(defs)} jobs in {now() - t_apply:.1f}s "
                    f"({Counter(j.kind for j in defs)})"
                )
            proxied = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
            fleet = Fleet(proxied, logs, a.partitions)
            fleet.add("scheduler", a.schedulers)
            fleet.add("worker", a.workers)
            t0 = now()
            monitor = Monitor(direct)
            stop_mon = asyncio.Event()
            mon_task = asyncio.create_task(monitor.run(stop_mon))
            plan = self.plan(t0)
            self.say(f"fault plan: {[(round(t - t0, 1), k) for t, k in plan]}")
            for at, kind in plan:
                await asyncio.sleep(max(0.0, at - now()))
                try:
                    self.faults.append(await self.inject(kind, fleet, pg, proxy))
                except Exception as e:  # a fault that could not be injected is reported
                    self.faults.append(
                        {
                            "type": kind,
                            "start": at,
                            "end": now(),
                            "error": f"{type(e).__name__}: {e}",
                        }
                    )
                    self.say(f"fault {kind} FAILED to inject: {e}")
            await asyncio.sleep(max(0.0, t0 + a.duration - now()))
            t_stop = now()
            self.say("fault window over; draining")
            lo = datetime.fromtimestamp(t0 + a.margin, UTC).replace(microsecond=0) + timedelta(
                seconds=1
            )
            hi = datetime.fromtimestamp(t_stop - a.margin, UTC).replace(microsecond=0)
            expected: dict[str, tuple[JobDef, datetime]] = {}
            for j in defs:
                for t in expected_instants(j.expr, lo, hi):
                    expected[f"{j.id}:{iso(t)}"] = (j, t)
            # Drain: until every expected instant has a terminal occurrence, or timeout.
            deadline = now() + a.drain
            while now() < deadline:
                rows = await db_fetch(
                    direct,
                    """
                    SELECT count(*) AS n FROM cronwell_occurrences
                    WHERE idempotency_key = ANY(%s)
                      AND state IN ('succeeded', 'dead', 'skipped', 'missed', 'cancelled')""",
                    (list(expected),),
                )
                if rows[0]["n"] >= len(expected):
                    break
                await asyncio.sleep(1.0)
            t_drained = now()
            self.say(f"drained in {t_drained - t_stop:.1f}s")
            crashed = fleet.crashed()
            stop_mon.set()
            await mon_task
            rcs = await asyncio.to_thread(fleet.stop_all)  # the proxy must keep serving meanwhile
            fleet = None
            await asyncio.sleep(0.5)
            report = await self.check(direct, defs, expected, ledger, monitor, lo, hi, violations)
            report["process_exit_codes"] = rcs
            if crashed:
                violations.append(f"processes exited on their own during the run: {crashed}")
            report["timing"] = {
                "run_s": round(t_stop - t0, 1),
                "drain_s": round(t_drained - t_stop, 1),
                "window": [lo.isoformat(), hi.isoformat()],
            }
        finally:
            if fleet is not None:
                await asyncio.to_thread(fleet.stop_all)
            for s in servers:
                s.close()
            await asyncio.to_thread(pg.stop, "fast")
        report["violations"] = violations
        report["seed"] = a.seed
        report["config"] = {
            "jobs": a.jobs,
            "duration": a.duration,
            "schedulers": a.schedulers,
            "workers": a.workers,
            "partitions": a.partitions,
            "faults": a.faults,
            "lease_s": LEASE,
            "partition_lease_s": PARTITION_LEASE,
        }
        report["work_dir"] = str(tmp)
        out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"chaos-{a.seed}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
        self.print_summary(report)
        print(f"report: {out}")
        if violations:
            print(f"VIOLATIONS ({len(violations)}); logs kept in {logs}")
            return 1
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        print("OK: no violations")
        return 0

    async def check(
        self,
        url: str,
        defs: list[JobDef],
        expected: dict[str, tuple[JobDef, datetime]],
        ledger: Ledger,
        monitor: Monitor,
        lo: datetime,
        hi: datetime,
        violations: list[str],
    ) -> dict[str, Any]:
        def bad(msg: str, examples: list[Any]) -> None:
            violations.append(f"{msg}: {len(examples)} (e.g. {examples[:3]})")

        kind_of = {j.id: j.kind for j in defs}
        occ = {
            r["idempotency_key"]: r
            for r in await db_fetch(
                url,
                """
            SELECT idempotency_key, job_id::text, scheduled_for, state, reason, fence, attempt,
                   origin, started_at, finished_at FROM cronwell_occurrences""",
            )
        }
        atts: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in await db_fetch(
            url,
            "SELECT idempotency_key, attempt, fence, outcome, worker_id, started_at,"
            " finished_at FROM cronwell_attempts ORDER BY id",
        ):
            atts[r["idempotency_key"]].append(r)
        effects: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in await db_fetch(
            url, "SELECT key, fence, attempt, pid FROM chaos_effects ORDER BY id"
        ):
            effects[r["key"]].append(r)
        outbox = Counter(
            r["idempotency_key"]
            for r in await db_fetch(
                url, "SELECT idempotency_key FROM cronwell_outbox WHERE topic = 'chaos.effect'"
            )
        )
        fences = {
            r["resource"]: r["fence"]
            for r in await db_fetch(url, "SELECT resource, fence FROM cronwell_fences")
        }

        states = Counter()
        lost, missed_noreason, skipped_noreason = [], [], []
        for key in expected:
            o = occ.get(key)
            if o is None:
                lost.append(key)
                continue
            states[o["state"]] += 1
            if o["state"] in ("pending", "waiting", "running"):
                lost.append(f"{key} ({o['state']})")
            if o["state"] == "missed" and not o["reason"]:
                missed_noreason.append(key)
            if o["state"] == "skipped" and not o["reason"]:
                skipped_noreason.append(key)
        if lost:
            bad("expected instants with no terminal occurrence (lost)", lost)
        if missed_noreason:
            bad("missed occurrences without a reason", missed_noreason)
        if skipped_noreason:
            bad("skipped occurrences without a reason", skipped_noreason)
        # Identity: no schedule occurrence in the window at an instant the cron does not have.
        exp_keys = set(expected)
        wrong = [
            k
            for k, o in occ.items()
            if o["origin"] in ("schedule", "catchup")
            and lo <= o["scheduled_for"] <= hi
            and k not in exp_keys
        ]
        if wrong:
            bad("occurrences at instants the cron does not produce", wrong)

        # Invariant 1 and 4 over every key (window or not).
        multi_success, fence_order, success_state = [], [], []
        for key, rows in atts.items():
            succ = [r for r in rows if r["outcome"] == "succeeded"]
            if len(succ) > 1:
                multi_success.append(key)
            # Rows in the order they were written (each is fenced, so a stale attempt cannot
            # write one late): fences strictly increasing, attempt numbers never going back.
            fs = [r["fence"] for r in rows]
            ns = [r["attempt"] for r in rows]
            if any(b <= a_ for a_, b in itertools.pairwise(fs)) or any(
                b < a_ for a_, b in itertools.pairwise(ns)
            ):
                fence_order.append((key, [(r["attempt"], r["fence"], r["outcome"]) for r in rows]))
            o = occ.get(key)
            if succ and (o is None or o["state"] != "succeeded" or o["fence"] != succ[0]["fence"]):
                success_state.append(key)
        for key, o in occ.items():
            if o["state"] == "succeeded" and not any(
                r["outcome"] == "succeeded" for r in atts.get(key, [])
            ):
                success_state.append(key)
        if multi_success:
            bad("keys with more than one successful completion", multi_success)
        if fence_order:
            bad("keys whose fence tokens are not strictly increasing by attempt", fence_order)
        if success_state:
            bad("succeeded attempt rows and occurrence state disagree", success_state)

        # Effects.
        succeeded = {k for k, o in occ.items() if o["state"] == "succeeded"}
        http_lost, http_after, http_unissued, http_on_unsucceeded = [], [], [], []
        dup_accepts = 0
        for key in succeeded:
            if kind_of.get(occ[key]["job_id"]) != "http":
                continue
            acc = ledger.accepted.get(key, [])
            if not acc:
                http_lost.append(key)
                continue
            dup_accepts += len(acc) - 1
            sfence = next(r["fence"] for r in atts[key] if r["outcome"] == "succeeded")
            if max(f for f, _ in acc) > sfence:
                http_after.append((key, [f for f, _ in acc], sfence))
        for key, acc in ledger.accepted.items():
            issued = {r["fence"] for r in atts.get(key, [])} | (
                {occ[key]["fence"]} if key in occ else set()
            )
            if any(f not in issued for f, _ in acc):
                http_unissued.append((key, [f for f, _ in acc]))
            if key not in succeeded:
                http_on_unsucceeded.append((key, occ[key]["state"] if key in occ else None))
        if http_lost:
            bad("succeeded http occurrences with no accepted effect in the ledger", http_lost)
        if http_after:
            bad(
                "ledger accepted a fence above the succeeding one (effect after success)",
                http_after,
            )
        if http_unissued:
            bad("ledger accepted a fence cronwell never issued for the key", http_unissued)
        # Only instants inside the window were drained; later ones may still be in flight.
        not_terminal_effects = [
            x
            for x in http_on_unsucceeded
            if x[1] in ("pending", "running", "waiting", None) and x[0] in expected
        ]
        if not_terminal_effects:
            bad("ledger effects for occurrences not finished after drain", not_terminal_effects)
        h_count, h_fence, h_outbox, h_fw = [], [], [], []
        for key, o in occ.items():
            if kind_of.get(o["job_id"]) != "handler":
                continue
            n = len(effects.get(key, []))
            want = 1 if o["state"] == "succeeded" else 0
            if n != want:
                h_count.append((key, o["state"], n))
                continue
            if want:
                sfence = o["fence"]
                if effects[key][0]["fence"] != sfence:
                    h_fence.append((key, effects[key][0]["fence"], sfence))
                if outbox.get(key, 0) != 1:
                    h_outbox.append((key, outbox.get(key, 0)))
                if fences.get(f"chaos:{key}") != sfence:
                    h_fw.append((key, fences.get(f"chaos:{key}"), sfence))
        if h_count:
            bad("handler effects per key != 1 per succeeded occurrence (0 otherwise)", h_count)
        if h_fence:
            bad("handler effect written under a fence other than the succeeding one", h_fence)
        if h_outbox:
            bad("outbox messages per succeeded handler key != 1", h_outbox)
        if h_fw:
            bad("fenced-write resource fence != succeeding fence", h_fw)

        # Duplicate dispatch: requests beyond the first per key (http), attempts beyond the
        # first per key (all), over expected occurrences.
        reqs = Counter(r["key"] for r in ledger.requests)
        http_keys_win = [k for k, (j, _) in expected.items() if j.kind == "http"]
        extra_reqs = sum(max(0, reqs.get(k, 0) - 1) for k in http_keys_win)
        extra_attempts = sum(max(0, len(atts.get(k, [])) - 1) for k in expected)
        win_states = Counter(occ[k]["state"] for k in expected if k in occ)
        reasons = Counter(
            (occ[k]["state"], occ[k]["reason"])
            for k in expected
            if k in occ and occ[k]["state"] in ("missed", "skipped", "dead", "cancelled")
        )

        # Faults: recovery and coverage.
        fault_out = []
        for f in self.faults:
            rec = monitor.recovery_after(f["end"])
            fault_out.append(
                {k: v for k, v in f.items() if k not in ("start", "end")}
                | {
                    "at_s": round(f["start"] - monitor.samples[0][0], 1)
                    if monitor.samples
                    else None,
                    "duration_s": round(f["end"] - f["start"], 2),
                    "lag_exceeded": monitor.unhealthy_between(f["start"], f["end"] + (rec or 0)),
                    "recovery_s": rec,
                }
            )
        fired = {f["type"] for f in self.faults if "error" not in f and "inconclusive" not in f}
        coverage = {
            t: (
                "fired"
                if t in fired
                else "inconclusive: "
                + next(
                    (
                        f.get("inconclusive") or f.get("error")
                        for f in self.faults
                        if f["type"] == t
                    ),
                    "never fired",
                )
            )
            for t in FAULT_TYPES
        }
        coverage["operator"] = "inconclusive: out of scope (no operator in this run)"
        for f in self.faults:
            if "error" in f:
                violations.append(f"fault {f['type']} could not be injected: {f['error']}")
        for f in fault_out:
            if f["recovery_s"] is None:
                violations.append(f"no recovery after fault {f['type']} at {f['at_s']}s")

        return {
            "occurrences": {
                "expected": len(expected),
                "expected_http": len(http_keys_win),
                "expected_handler": len(expected) - len(http_keys_win),
                "by_state": dict(win_states),
                "succeeded": win_states.get("succeeded", 0),
                "skipped": win_states.get("skipped", 0),
                "missed": win_states.get("missed", 0),
                "dead": win_states.get("dead", 0),
                "lost": len(lost),
                "reasons": {f"{s}:{r}": n for (s, r), n in reasons.items()},
            },
            "all_keys": {
                "occurrences": len(occ),
                "succeeded": len(succeeded),
                "keys_with_multiple_successes": len(multi_success),
            },
            "ledger": {
                "requests": len(ledger.requests),
                "rejected_409_stale": ledger.rejected,
                "keys_with_effect": len(ledger.accepted),
                "accepted_after_first (duplicate effects, higher fence)": dup_accepts,
                "effects_on_not_succeeded_keys (dead, or after the window)": [
                    x for x in http_on_unsucceeded if x not in not_terminal_effects
                ][:20],
            },
            "duplicate_dispatch": {
                "extra_http_requests": extra_reqs,
                "extra_http_requests_per_occurrence": round(
                    extra_reqs / max(1, len(http_keys_win)), 5
                ),
                "extra_attempts": extra_attempts,
                "extra_attempts_per_occurrence": round(extra_attempts / max(1, len(expected)), 5),
            },
            "handler_effects": {
                "keys": len(effects),
                "rows": sum(len(v) for v in effects.values()),
            },
            "faults": fault_out,
            "fault_coverage": coverage,
            "throughput_samples": [
                (round(t - monitor.samples[0][0], 1), h, ok, od) for t, h, ok, od in monitor.samples
            ],
        }

    def print_summary(self, r: dict[str, Any]) -> None:
        print(f"\n==== cronwell chaos report (seed {self.args.seed}) ====")
        if "occurrences" in r:
            o = r["occurrences"]
            print(
                f"occurrences in window: expected {o['expected']} (http {o['expected_http']}, "
                f"handler {o['expected_handler']}) | succeeded {o['succeeded']} | skipped "
                f"{o['skipped']} | missed {o['missed']} | dead {o['dead']} | lost {o['lost']}"
            )
            if o["reasons"]:
                print(f"  reasons: {o['reasons']}")
            print(
                "successful completions: keys with >1 success: "
                f"{r['all_keys']['keys_with_multiple_successes']}"
                f" (over {r['all_keys']['occurrences']} occurrences)"
            )
            print(f"ledger: {json.dumps(r['ledger'])}")
            print(f"duplicate dispatch: {json.dumps(r['duplicate_dispatch'])}")
            print(f"handler effects: {json.dumps(r['handler_effects'])}")
            print("faults:")
            for f in r["faults"]:
                print("  " + json.dumps(f))
            print("coverage: " + json.dumps(r["fault_coverage"]))
        for v in r.get("violations", []):
            print("VIOLATION: " + v)


async def measure_skew(skew: str) -> float | None:
    """What time.time() says under `faketime -f SKEW`, minus ours: proof the skew applies."""
    proc = await asyncio.create_subprocess_exec(
        "faketime",
        "-f",
        skew,
        sys.executable,
        "-c",
        "import time; print(time.time())",
        env=os.environ | {"DONT_FAKE_MONOTONIC": "1"},
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    with contextlib.suppress(ValueError):
        return round(float(out) - now(), 1)
    return None


async def db_fetch(url: str, sql: str, args: Any = None) -> list[dict[str, Any]]:
    for i in range(20):
        try:
            return await q(url, sql, args)
        except psycopg.OperationalError:
            if i == 19:
                raise
            await asyncio.sleep(0.5)
    return []


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--duration", type=float, default=180)
    p.add_argument("--schedulers", type=int, default=2)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument(
        "--faults",
        choices=["random", "each"],
        default="random",
        help="random: seeded random faults; each: one of each type, evenly spaced",
    )
    p.add_argument("--skip-faults", nargs="*", default=[], choices=FAULT_TYPES)
    p.add_argument("--margin", type=float, default=5.0, help="seconds cut from each window edge")
    p.add_argument(
        "--drain", type=float, default=60.0, help="max seconds to wait for terminal states"
    )
    p.add_argument(
        "--warmup", type=float, help="seconds before the first fault (default 20; 'each': 5)"
    )
    p.add_argument("--out", help="report path (default bench/results/chaos-<seed>.json)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs) even when OK")
    args = p.parse_args()
    if args.warmup is None:
        args.warmup = 5.0 if args.faults == "each" else 20.0
    return asyncio.run(Chaos(args).main())


if __name__ == "__main__":
    sys.exit(main())
