"""Soak: the seed's day compressed 24x into an hour at 10x its size, watched for drift.

The seed runs 1M occurrences a day with 50,000-occurrence bursts; at 10x that is 10M a day,
and a day compressed 24x into an hour is 10M an hour (TARGET_PER_SECOND). One `cronwell
scheduler` (which also reaps and prunes, as in production) and `--workers` `cronwell
worker` processes run, for `--soak-minutes`:

- a steady background of per-second jobs (`* * * * * *`) and per-minute jobs (spread over
  the minute's seconds), `--soak-scale` times the 10x-seed background rate;
- a burst of `--soak-burst` occurrences every `--soak-burst-every` seconds (burst jobs
  whose next_run_at the bench sets to the burst's instant, as a cron would);
- history limits and retention shortened by the compression (HISTORY_LIMIT; retention a
  sixth of the run, history partitions half as wide: `partition_seconds`), so pruning and
  partition drops happen within the run; the pruner runs every 60 s, as in production. The
  store is created with that partition width (`python -m bench --only soak` runs alone).

Every SAMPLE_SECONDS it samples RSS (USS for PostgreSQL processes, whose RSS counts the
shared buffers they touch) and connections of every process, size, dead tuples,
autovacuum runs and rows inserted and deleted of every cronwell table, and CPU. Each
burst's start lag p99 (started_at - instant; unstarted rows count as late as the reading)
is read before the next burst is set. `evaluate` turns the series into the criteria.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    BenchError,
    cpu_seconds,
    enable_statements,
    load_average,
    per_occurrence,
    statements,
    stop_all,
    worker_argv,
)
from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database

SEED_PER_DAY = 1_000_000
SCALE_UP = 10
COMPRESSION = 24
TARGET_PER_SECOND = SEED_PER_DAY * SCALE_UP * COMPRESSION / 86400
"""10M occurrences (a 10x-seed day) in an hour: 2,778/s, bursts included."""
DEFAULT_SCALE = 0.5
"""Half the 10x-seed background: with the default bursts ~1,550/s offered. The hot path
alone allows ~7,000/s on this 2-core machine (sustained's cpu_bound_per_second), but the
soak also pays for pruning, autovacuum and each burst's peak: 0.88 cores at 1,472/s in
an 8-minute check, so the full shape would need ~1.7 of 2, too close to tell drift from
saturation."""
HISTORY_LIMIT = 4
"""successfulJobsHistoryLimit and failedJobsHistoryLimit of every soak job: the default
100 compressed 24x."""
PRUNE_INTERVAL_SECONDS = 60.0
"""The production default, not compressed: the history-limit sweep reads every job each
pass whatever was written, so a pass every 2.5 s would cost 24x what production pays."""
SAMPLE_SECONDS = 10.0
BURST_LEAD_SECONDS = 40.0
"""A burst's instant is set this long ahead: more than the scheduler's 30 s horizon, so it
is materialised ahead as a cron's would be."""
RSS_WINDOW_MINUTES = 30.0
MAX_RSS_GROWTH_PCT = 5.0
MAX_PLATEAU_GROWTH_PCT = 5.0
MAX_P99_DRIFT_PCT = 10.0
PLATEAU_MIN_BYTES = 1 << 20
"""Tables smaller than this (1 MB) are not judged for a plateau: a page more is noise."""
PRUNED_TABLES = ("cronwell_occurrences", "cronwell_attempts", "cronwell_status_changes")
NS_BURST = "soak-burst"


def check(minutes: float, warmup: float, burst: int, every: float, scale: float) -> None:
    """Settings the soak can measure (raises BenchError before anything is seeded)."""
    if warmup < 0 or minutes <= warmup:
        raise BenchError(
            f"soak judges after its warm-up: --soak-minutes ({minutes:g}) must exceed"
            f" --soak-warmup-minutes ({warmup:g})"
        )
    if every <= BURST_LEAD_SECONDS or burst < 1:
        raise BenchError(
            f"--soak-burst-every must exceed {BURST_LEAD_SECONDS:g} s (a burst is set that"
            f" long ahead) and --soak-burst must be >= 1, got {every:g} s and {burst}"
        )
    if 60 * (minutes - warmup) < 2 * every:
        raise BenchError(
            f"soak compares bursts after warm-up: {minutes - warmup:g} minutes hold fewer than"
            f" two bursts every {every:g} s"
        )
    if scale <= 0:
        raise BenchError(f"--soak-scale must be > 0, got {scale:g}")


def plan(scale: float, burst: int, every: float) -> dict[str, Any]:
    """The job mix for `scale`: half the background rate from per-second jobs, half from
    per-minute ones (spread over the minute's seconds)."""
    background = scale * (TARGET_PER_SECOND - burst / every)
    per_second = max(1, round(background / 2))
    per_minute = max(60, round(background / 2 * 60))
    offered = per_second + per_minute / 60 + burst / every
    return {
        "per_second_jobs": per_second,
        "per_minute_jobs": per_minute,
        "burst_jobs": burst,
        "offered_per_second": round(offered),
        "target_10x_seed_per_second": round(TARGET_PER_SECOND),
        "offered_over_target": round(offered / TARGET_PER_SECOND, 3),
    }


def _spec(schedule: str) -> dict[str, Any]:
    return jobs.spec_document(
        ScheduledJobSpec.model_validate(
            {
                "schedule": schedule,
                "target": {"handler": {"name": "bench.noop"}},
                "concurrencyPolicy": "Skip",
                "successfulJobsHistoryLimit": HISTORY_LIMIT,
                "failedJobsHistoryLimit": HISTORY_LIMIT,
            }
        )
    )


async def seed(db: Database, mix: dict[str, Any]) -> None:
    """The soak's jobs (bulk SQL: seeding is not measured); each schedule its own spec
    hash, since the scheduler caches a parsed schedule per hash."""
    per_min = mix["per_minute_jobs"]
    # Each job first due at its own next instant, as in a store that was already running:
    # not all at once (a catch-up of every job in the first pass is not the steady state).
    groups = [
        ("soak-second", "* * * * * *", mix["per_second_jobs"],
         "date_trunc('second', now()) + interval '2 seconds'")
    ]  # fmt: skip
    groups += [
        ("soak-minute", f"{s} * * * * *", per_min // 60 + (s < per_min % 60),
         f"date_trunc('minute', now()) + interval '1 minute {s} seconds'")
        for s in range(60)
    ]  # fmt: skip
    groups += [(NS_BURST, "0 0 1 1 *", mix["burst_jobs"], "now() + interval '1 year'")]
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_status_changes,"
            " cronwell_job_counters, cronwell_jobs CASCADE"
        )
        for ns, schedule, n, due in groups:
            doc = _spec(schedule)
            await conn.execute(
                "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool,"
                " partition, next_run_at) SELECT gen_random_uuid(), %s, %s || '-' || i,"
                " %s::jsonb, %s, 'default', i %% 16, " + due + " FROM generate_series(1, %s) i",
                (ns, schedule.split()[0], json.dumps(doc), jobs.spec_hash(doc), n),
            )
        await conn.execute("ANALYZE")


async def set_burst(db: Database, at: float) -> None:
    """Every burst job due at `at` (epoch seconds): the scheduler materialises them."""
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE cronwell_jobs SET next_run_at = to_timestamp(%s) WHERE namespace = %s",
            (at, NS_BURST),
        )


async def burst_lag(db: Database, at: float) -> dict[str, Any]:
    """Start lag p99 of the burst due at `at`; unstarted occurrences count as late as now."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, count(o.started_at) AS started,"
            " percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM"
            "   coalesce(o.started_at, now()) - o.scheduled_for))::float8 AS p99,"
            " percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM"
            "   coalesce(o.started_at, now()) - o.scheduled_for))::float8 AS p50"
            " FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id"
            " WHERE j.namespace = %s AND o.scheduled_for = to_timestamp(%s)",
            (NS_BURST, at),
        )
        r = await cur.fetchone()
    assert r is not None  # an aggregate: always one row
    return {
        "occurrences": r["n"],
        "started": r["started"],
        "p50_s": None if r["p50"] is None else round(r["p50"], 3),
        "p99_s": None if r["p99"] is None else round(r["p99"], 3),
    }


COUNTERS = ("autovacuum", "autoanalyze", "ins", "del")
"""Cumulative per-table counters: a dropped partition's are kept in its parent's totals."""


def partition_seconds(minutes: float) -> int:
    """History partition width for a soak of `minutes`: the widest that divides a day and
    fits twice in its retention (a sixth of the run), at least a minute, so partitions are
    dropped within the run as a day's are in production."""
    retention = 60 * minutes / 6
    return max(
        w for w in range(60, 86401, 60) if 86400 % w == 0 and (w <= retention / 2 or w == 60)
    )


class Tables:
    """Statistics of every cronwell table, partitions summed into their parent; a partition
    that was dropped since the last sample keeps its counters in its parent's totals, its
    rows counted as deleted (`dropped` counts them apart)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, dict[str, int]]] = {}
        self._gone: dict[str, dict[str, int]] = {}

    async def read(self, db: Database) -> dict[str, dict[str, int]]:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT s.relname AS name, coalesce(p.relname, s.relname) AS parent,"
                " pg_total_relation_size(s.relid) AS bytes,"
                " pg_indexes_size(s.relid) AS index_bytes, n_live_tup AS live,"
                " n_dead_tup AS dead, autovacuum_count AS autovacuum,"
                " autoanalyze_count AS autoanalyze, n_tup_ins AS ins, n_tup_del AS del"
                " FROM pg_stat_user_tables s LEFT JOIN pg_inherits i ON i.inhrelid = s.relid"
                " LEFT JOIN pg_class p ON p.oid = i.inhparent"
                " WHERE s.relname LIKE 'cronwell%%'"
            )
            rows = await cur.fetchall()
        return self.fold({r["name"]: (r["parent"], r) for r in rows})

    def fold(self, now: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, dict[str, int]]:
        """Sum partitions into parents (pure: the unit test feeds it rows)."""
        for name in self._last.keys() - now.keys():
            parent, last = self._last[name]
            gone = self._gone.setdefault(parent, dict.fromkeys((*COUNTERS, "dropped"), 0))
            for k in COUNTERS:
                gone[k] += last[k]
            gone["del"] += last["ins"] - last["del"]  # every row it still had went with it
            gone["dropped"] += last["ins"] - last["del"]
        self._last = {
            n: (parent, {k: int(v) for k, v in r.items() if k not in ("name", "parent")})
            for n, (parent, r) in now.items()
        }
        out: dict[str, dict[str, int]] = {}
        for parent, r in self._last.values():
            t = out.setdefault(parent, {"partitions": 0})
            t["partitions"] += 1
            for k, v in r.items():
                t[k] = t.get(k, 0) + v
        for parent, gone in self._gone.items():
            t = out.setdefault(parent, {"partitions": 0})
            for k, v in gone.items():
                t[k] = t.get(k, 0) + v
        return out


def _memory(pid: int, private: bool) -> int | None:
    """RSS of a process, or its USS (private pages) with `private`; None once it is gone."""
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return int(p.memory_full_info().uss if private else p.memory_info().rss)
    return None


def _ports(pid: int) -> set[int]:
    """Local TCP ports of a process's connections (a backend's client_port is one)."""
    with contextlib.suppress(psutil.Error):
        return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr}
    return set()


BACKENDS = "postgres backends of "
TRANSIENT = ("postgres autovacuum and parallel workers", "postgres other backends")
"""Sampled and plotted, not judged: autovacuum and parallel workers come and go, and other
backends (the bench's own) are not the system's."""


def process_stats(
    procs: dict[str, int], activity: dict[int, dict[str, Any]], server: list[psutil.Process]
) -> dict[str, dict[str, int]]:
    """Memory and connections of each cronwell process, and of this PostgreSQL's processes
    (`server`; not another bench's on the same machine): its client backends grouped by
    the process they serve (by client port), autovacuum workers, and the rest
    (postmaster, checkpointer, writers) as `postgres server`."""
    out: dict[str, dict[str, int]] = {}
    owner_of: dict[int, str] = {}
    for name, pid in procs.items():
        ports = _ports(pid)
        out[name] = {"memory": _memory(pid, False) or 0, "connections": len(ports)}
        owner_of |= {port: f"{BACKENDS}{name}" for port in ports}
    for p in server:
        key = _postgres_role(activity.get(p.pid), owner_of)
        entry = out.setdefault(key, {"memory": 0, "connections": 0})
        entry["memory"] += _memory(p.pid, True) or 0
        entry["connections"] += key.startswith(BACKENDS)
    return out


def _postgres_role(act: dict[str, Any] | None, owner_of: dict[int, str]) -> str:
    """Which series a PostgreSQL process belongs to (see process_stats)."""
    kind = act and act["backend_type"]
    if kind in ("autovacuum worker", "parallel worker"):
        return "postgres autovacuum and parallel workers"
    if act is None or kind != "client backend":
        return "postgres server"
    return owner_of.get(act["client_port"], "postgres other backends")


async def sample(db: Database, procs: dict[str, int], t0: float, tables: Tables) -> dict[str, Any]:
    """One sample: seconds since the start, processes, tables, CPU seconds."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pid, backend_type, client_port, pid = pg_backend_pid() AS me"
            " FROM pg_stat_activity"
        )
        activity = {int(r["pid"]): r for r in await cur.fetchall()}
    me = next(pid for pid, r in activity.items() if r["me"])
    postmaster = psutil.Process(me).parent()
    assert postmaster is not None  # a backend's parent is the postmaster
    server = [postmaster, *postmaster.children()]
    return {
        "t": round(time.monotonic() - t0, 1),
        "processes": process_stats(procs, activity, server),
        "tables": await tables.read(db),
        "cpu_s": _cpu(procs, postmaster, server[1:]),
    }


def _cpu(
    procs: dict[str, int], postmaster: psutil.Process, children: list[psutil.Process]
) -> dict[str, float]:
    """CPU seconds so far of each cronwell process and of this PostgreSQL (the postmaster,
    its live children, and its exited ones as the postmaster's children times)."""
    out = {}
    for name, pid in procs.items():
        with contextlib.suppress(psutil.Error):
            out[name] = round(cpu_seconds(pid), 2)
    t = postmaster.cpu_times()
    pg = t.user + t.system + t.children_user + t.children_system
    for c in children:
        with contextlib.suppress(psutil.Error):
            pg += cpu_seconds(c.pid)
    return out | {"postgres": round(pg, 2)}


def _level(values: list[float]) -> float:
    """A level robust to one odd sample: the median of up to three."""
    return statistics.median(values[:3]) if values else 0.0


def growth_pct(series: list[tuple[float, float]], since: float) -> float | None:
    """Growth (%) of a (t, value) series from `since` to its end: the median of the last
    three samples against the median of the first three at or after `since`."""
    window = [v for t, v in series if t >= since]
    if len(window) < 2:
        return None
    first, last = _level(window), _level(window[::-1])
    return round(100 * (last - first) / first, 2) if first else None


def peak_growth_pct(series: list[tuple[float, float]], since: float) -> float | None:
    """Growth (%) of a (t, value) series's peak from `since` to its end against its peak over
    as long a window just before. A partitioned table is a sawtooth (it grows, a partition
    drop cuts it): its level at any one moment depends on the phase, its peaks do not."""
    length = series[-1][0] - since if series else 0.0
    last = [v for t, v in series if t >= since]
    before = [v for t, v in series if since - length <= t < since]
    if not last or not before or not max(before):
        return None
    return round(100 * (max(last) - max(before)) / max(before), 2)


def _judged_memory(name: str, proc: dict[str, int]) -> float:
    """The memory a series is judged on: a process's own; a group of backends' per
    connection (a pool that opens one more connection, up to its maximum, is not a leak;
    the connection counts are sampled beside it)."""
    if name.startswith(BACKENDS):
        return proc["memory"] / max(1, proc["connections"])
    return proc["memory"]


def evaluate(
    samples: list[dict[str, Any]],
    bursts: list[dict[str, Any]],
    *,
    warmup_s: float,
    expected_rows: dict[str, float],
) -> dict[str, Any]:
    """The criteria from the series (pure: the unit test feeds it made-up samples).

    - rss: each process's memory (PostgreSQL backends: per connection) grows < 5 % over
      the last 30 minutes (a run shorter than an hour: over its last half, from the
      warm-up's end at the earliest);
    - plateau: each table of 1 MB or more: its peak over the last third after warm-up is
      < 5 % above its peak over the third before (peaks: partition drops make a sawtooth);
    - p99: the last burst's start lag p99 within 10 % of the first's after warm-up;
    - pruning: rows deleted since the start >= rows inserted minus `expected_rows`, the
      rows each table is expected to hold at steady state (history limits, retention).
    """
    end = samples[-1]["t"]
    hour = 120 * RSS_WINDOW_MINUTES
    rss_from = end - hour / 2 if end >= hour else max(warmup_s, end / 2)
    third_from = end - (end - warmup_s) / 3
    names = {n for s in samples for n in s["processes"]}
    rss = {
        n: growth_pct(
            [
                (s["t"], _judged_memory(n, s["processes"][n]))
                for s in samples
                if n in s["processes"]
            ],
            rss_from,
        )
        for n in sorted(names - set(TRANSIENT))
    }
    tables = samples[-1]["tables"]
    plateau = {
        n: peak_growth_pct(
            [(s["t"], s["tables"][n]["bytes"]) for s in samples if n in s["tables"]], third_from
        )
        for n in sorted(tables)
        if tables[n]["bytes"] >= PLATEAU_MIN_BYTES
    }
    judged = [b for b in bursts if b["at_s"] >= warmup_s and b.get("p99_s") is not None]
    first, last = (judged[0], judged[-1]) if len(judged) >= 2 else (None, None)
    drift = (
        round(100 * (last["p99_s"] - first["p99_s"]) / first["p99_s"], 1)
        if first and last and first["p99_s"]
        else None
    )
    start = samples[0]["tables"]
    pruning = {}
    for n, exp in expected_rows.items():
        ins = tables.get(n, {}).get("ins", 0) - start.get(n, {}).get("ins", 0)
        dele = tables.get(n, {}).get("del", 0) - start.get(n, {}).get("del", 0)
        pruning[n] = {
            "written": ins,
            "pruned": dele,
            "expected_retained": round(exp),
            "holds": dele >= ins - exp,
        }
    worst = max((v for v in rss.values() if v is not None), default=None)
    biggest = max((v for v in plateau.values() if v is not None), default=None)
    criteria = {
        "rss": {
            "window_s": [round(rss_from, 1), end],
            "growth_pct": rss,
            "max_pct": worst,
            "holds": worst is not None and worst < MAX_RSS_GROWTH_PCT,
        },
        "plateau": {
            "window_s": [round(third_from, 1), end],
            "growth_pct": plateau,
            "max_pct": biggest,
            "holds": biggest is not None and biggest < MAX_PLATEAU_GROWTH_PCT,
        },
        "p99": {
            "first_s": first and first["p99_s"],
            "last_s": last and last["p99_s"],
            "drift_pct": drift,
            "holds": drift is not None and drift <= MAX_P99_DRIFT_PCT,
        },
        "pruning": {
            "tables": pruning,
            "holds": bool(pruning) and all(v["holds"] for v in pruning.values()),
        },
    }
    return {
        "rss_growth_window_s": criteria["rss"]["window_s"],
        "rss_growth_last_30min_pct": worst,
        "criteria": criteria,
        "holds": all(c["holds"] for c in criteria.values()),
    }


def expected_rows(mix: dict[str, Any], retention_s: float, horizon_s: float) -> dict[str, float]:
    """What each pruned table holds at steady state: HISTORY_LIMIT succeeded runs a job,
    what is materialised ahead and what two prune passes and samples leave behind; two
    status change rows an occurrence (claim, completion) over the retention. Skipped runs
    (a machine past its bound) keep up to HISTORY_LIMIT more a job: the criterion then
    fails, as it should."""
    jobs_n = mix["per_second_jobs"] + mix["per_minute_jobs"] + mix["burst_jobs"]
    rate = mix["offered_per_second"]
    lag = horizon_s + 2 * PRUNE_INTERVAL_SECONDS + 2 * SAMPLE_SECONDS
    occ = HISTORY_LIMIT * jobs_n + rate * lag
    return {
        "cronwell_occurrences": occ,
        "cronwell_attempts": occ,
        "cronwell_status_changes": 2 * rate * (retention_s + lag) + 2 * mix["burst_jobs"],
    }


def report(soak: dict[str, Any]) -> None:
    """Each criterion with its figure and pass/fail."""
    c, ok = soak["criteria"], {True: "pass", False: "FAIL"}
    print(
        f"\nsoak: offered {soak['offered_per_second']}/s vs the 10x-seed day compressed 24x"
        f" {soak['target_10x_seed_per_second']}/s (scale {soak['scale']}:"
        f" {soak['offered_over_target']:.0%} of it), {soak['duration_minutes']} min,"
        f" warm-up {soak['warmup_minutes']} min"
    )
    r = c["rss"]
    w = r["window_s"]
    print(
        f"  rss growth < {MAX_RSS_GROWTH_PCT:g} % (window {w[0]}-{w[1]} s):"
        f" {ok[r['holds']]} (max {r['max_pct']} %: {r['growth_pct']})"
    )
    p = c["plateau"]
    print(
        f"  table sizes plateau (last third's peak < {MAX_PLATEAU_GROWTH_PCT:g} % over the"
        " third before's):"
        f" {ok[p['holds']]} (max {p['max_pct']} %: {p['growth_pct']})"
    )
    q = c["p99"]
    print(
        f"  last burst p99 within {MAX_P99_DRIFT_PCT:g} % of the first after warm-up:"
        f" {ok[q['holds']]} (first {q['first_s']} s, last {q['last_s']} s,"
        f" drift {q['drift_pct']} %)"
    )
    print(
        f"  pruning keeps pace (pruned >= written - expected retained): {ok[c['pruning']['holds']]}"
    )
    for n, v in c["pruning"]["tables"].items():
        print(
            f"    {n}: written {v['written']}, pruned {v['pruned']}, expected retained"
            f" {v['expected_retained']}: {ok[v['holds']]}"
        )
    print(f"  holds: {soak['holds']}")
    st = soak.get("statements_after_warmup")
    if st:
        print(
            f"  PostgreSQL ms per occurrence after warm-up: execution"
            f" {st['exec_ms_per_occurrence_all_statements']}, planning"
            f" {st['plan_ms_per_occurrence_all_statements']}; top statements:"
        )
        for r in st["top_statements"][:8]:
            print(
                f"    exec {r['exec_ms_per_occurrence']:.4f} plan {r['plan_ms_per_occurrence']:.4f}"
                f" calls {r['calls']}: {r['query'][:100]}"
            )
    print(flush=True)


def plot(samples: list[dict[str, Any]], bursts: list[dict[str, Any]], path: Path) -> Path | None:
    """RSS per process, table sizes, start lag p99 per burst, rows written vs pruned."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))
    mins = [s["t"] / 60 for s in samples]

    def lines(a: Any, key: str, field: str, scale: float, names: list[str]) -> None:
        for n in names:
            a.plot(mins, [s[key].get(n, {}).get(field, 0) / scale for s in samples], label=n)

    procs = sorted({n for s in samples for n in s["processes"]})
    lines(ax[0][0], "processes", "memory", 2**20, procs)
    ax[0][0].set_title("memory per process (MB; RSS, USS for PostgreSQL)")
    tables = [n for n, v in samples[-1]["tables"].items() if v["bytes"] >= PLATEAU_MIN_BYTES]
    lines(ax[0][1], "tables", "bytes", 2**20, sorted(tables))
    ax[0][1].set_title("table + index size (MB)")
    read = [b for b in bursts if b["p99_s"] is not None]
    ax[1][0].plot([b["at_s"] / 60 for b in read], [b["p99_s"] for b in read], "o-")
    ax[1][0].set_title("start lag p99 per burst (s)")
    t0 = samples[0]["tables"]
    for n in PRUNED_TABLES:
        for f, style in (("ins", "-"), ("del", "--")):
            ys = [s["tables"].get(n, {}).get(f, 0) - t0.get(n, {}).get(f, 0) for s in samples]
            ax[1][1].plot(mins, ys, style, label=f"{n} {'written' if f == 'ins' else 'pruned'}")
    ax[1][1].set_title("rows written vs pruned since the start")
    for a in ax.flat:
        a.set_xlabel("minutes")
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


async def soak(
    db: Database,
    env: dict[str, str],
    *,
    workers: int,
    concurrency: int,
    minutes: float,
    warmup_minutes: float,
    burst: int,
    every: float,
    scale: float,
    out: Path,
) -> dict[str, Any]:
    check(minutes, warmup_minutes, burst, every, scale)
    mix = plan(scale, burst, every)
    retention_s = 60 * minutes / 6
    horizon_s = 30.0  # the scheduler's default
    print(
        f"soak: {mix['offered_per_second']}/s offered ({mix['per_second_jobs']} per-second,"
        f" {mix['per_minute_jobs']} per-minute jobs, {burst} every {every:g} s) vs the 10x-seed"
        f" day compressed 24x: {mix['target_10x_seed_per_second']}/s; retention"
        f" {retention_s:g} s in partitions of {partition_seconds(minutes)} s, history limit"
        f" {HISTORY_LIMIT}, prune every"
        f" {PRUNE_INTERVAL_SECONDS:g} s",
        flush=True,
    )
    await seed(db, mix)
    await enable_statements(db, planning=True)
    env = env | {
        "CRONWELL_RETENTION_SECONDS": f"{retention_s:g}",
        "CRONWELL_HISTORY_PARTITION_SECONDS": str(partition_seconds(minutes)),
    }
    named = _start(env, workers, concurrency)
    samples: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    warmup_s = 60 * warmup_minutes
    try:
        counted_from = await _run(db, named, samples, bursts, 60 * minutes, every, warmup_s)
    finally:
        stop_all(list(named.values()))
    occ = "cronwell_occurrences"
    written = samples[-1]["tables"][occ]["ins"] - counted_from["tables"][occ]["ins"]
    figs = evaluate(
        samples, bursts, warmup_s=warmup_s, expected_rows=expected_rows(mix, retention_s, horizon_s)
    )
    cpu = _cpu_rate(samples, warmup_s)
    result = {
        "duration_minutes": round(samples[-1]["t"] / 60, 1),
        "warmup_minutes": warmup_minutes,
        "scale": scale,
        **mix,
        "burst_every_s": every,
        "retention_s": retention_s,
        "history_partition_seconds": partition_seconds(minutes),
        "history_limit": HISTORY_LIMIT,
        "prune_interval_s": PRUNE_INTERVAL_SECONDS,
        "workers": workers,
        "concurrency_per_worker": concurrency,
        **cpu,
        "bursts": bursts,
        **figs,
        "statements_after_warmup": per_occurrence(await statements(db, top=20), max(written, 1)),
    }
    report(result)
    _write(out, samples, bursts)
    return result


def _write(out: Path, samples: list[dict[str, Any]], bursts: list[dict[str, Any]]) -> None:
    """The raw samples (soak_samples.json) and the plot (soak.png) beside the results."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak_samples.json").write_text(json.dumps(samples))
    png = plot(samples, bursts, out / "soak.png")
    print(f"soak samples: {out / 'soak_samples.json'}" + (f", plot: {png}" if png else ""))


def _start(
    env: dict[str, str], workers: int, concurrency: int
) -> dict[str, subprocess.Popen[bytes]]:
    """One scheduler (which reaps and prunes too, as in production) and the workers."""
    argvs = {"scheduler": [sys.executable, "-m", "cronwell", "scheduler", "--partitions", "16"]}
    argvs |= {
        f"worker-{i}": worker_argv(concurrency, "cronwell_bench_noop")
        for i in range(1, workers + 1)
    }
    return {
        name: subprocess.Popen(argv, env=env, start_new_session=True)
        for name, argv in argvs.items()
    }


def _cpu_rate(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Cores used after warm-up (every cronwell process and PostgreSQL), and the share of
    the machine's cores that is."""
    after = [s for s in samples if s["t"] >= warmup_s]
    if len(after) < 2:
        return {}
    a, b = after[0], after[-1]
    used = sum(b["cpu_s"].get(k, 0) - v for k, v in a["cpu_s"].items()) / (b["t"] - a["t"])
    return {"cores_used": round(used, 2), "cores": os.cpu_count()}


async def _run(
    db: Database,
    named: dict[str, subprocess.Popen[bytes]],
    samples: list[dict[str, Any]],
    bursts: list[dict[str, Any]],
    duration: float,
    every: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Sample every SAMPLE_SECONDS; set each burst BURST_LEAD_SECONDS ahead of its instant
    and read the previous one's lag just before (its history is still kept then). Resets
    pg_stat_statements at the warm-up's end and returns the sample taken then."""
    procs = {name: p.pid for name, p in named.items()}
    tables = Tables()
    t0, wall0 = time.monotonic(), float(int(time.time()))  # bursts on whole seconds
    due = [k * every for k in range(1, int(duration // every)) if k * every + every <= duration]
    pending: list[float] = []
    next_sample = 0.0
    counted_from: dict[str, Any] | None = None
    while True:
        now = time.monotonic() - t0
        if due and now >= due[0] - BURST_LEAD_SECONDS:
            at = due.pop(0)
            if pending:
                await _read_burst(db, pending.pop(0), wall0, bursts)
            await set_burst(db, wall0 + at)
            pending.append(at)
        if now >= next_sample:
            samples.append(await sample(db, procs, t0, tables))
            next_sample += SAMPLE_SECONDS
            if counted_from is None and now >= warmup_s:
                async with db.connection() as conn:
                    await conn.execute("SELECT pg_stat_statements_reset()")
                counted_from = samples[-1]
            if now >= duration:
                break
        for name, p in named.items():
            if p.poll() is not None:
                raise BenchError(f"soak: the {name} process exited ({p.returncode})")
        await asyncio.sleep(0.5)
    for at in pending:
        await _read_burst(db, at, wall0, bursts)
    return counted_from or samples[0]


async def _read_burst(db: Database, at: float, wall0: float, bursts: list[dict[str, Any]]) -> None:
    lag = await burst_lag(db, wall0 + at) | {"load_1min": load_average()[0]}
    bursts.append({"at_s": at} | lag)
    print(f"soak: burst at {at:g} s: {lag}", flush=True)
