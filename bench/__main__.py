"""cronwell benchmarks: figures to compare, never assertions.

    .venv/bin/python -m bench [--jobs 50000] [--workers 2] [--only materialise,burst]

Runs against a fresh embedded PostgreSQL (durability on, as in production) on this
machine, prints a table and writes bench/results/<name>.json. This module parses the
arguments, runs the sections asked for in order and prints the figures; each section is a
module of this package that says what it measures (materialise and burst: `bench.burst`;
the rest: `bench.<section>`), and bench/README.md lists them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import psycopg

from bench import (
    anatomy,
    burst,
    ceiling,
    claim,
    forecast,
    growth,
    peer,
    pgq,
    prescale,
    profile,
    retention,
    schedule,
    soak,
    status,
    sustained,
    ui,
)
from bench.common import (
    HANDLERS,
    RESULTS,
    SETUP_DEADLINE_SECONDS,
    BenchError,
    bench_server,
    db_url,
    discard,
    enable_statements,
    load_average,
    machine_facts,
    machine_speed,
    merge_latest,
    worker_env,
)
from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, history_partitions, migrate

SECTIONS = (
    "materialise",
    "burst",
    "scaling",
    "ceiling",
    "peer",
    "pgqueuer",
    "sustained",
    "growth",
    "profile",
    "statements",
    "anatomy",
    "claim",
    "status",
    "prescale",
    "retention",
    "schedule",
    "forecast",
    "ui",
    "soak",
)
DEFAULT_SECTIONS = SECTIONS[:-1]
"""All but the soak: an hour of its own (`make soak`)."""
COMPARED = (
    "per_second",
    "handler_start_lag_p50_s",
    "handler_start_lag_p99_s",
    "handler_start_lag_max_s",
    "start_lag_p50_s",
    "start_lag_p95_s",
    "start_lag_p99_s",
    "start_lag_max_s",
    "all_succeeded_after_s",
    "worker_cpu_ms_per_occurrence",
    "postgres_cpu_ms_per_occurrence",
    "cpu_floor_s",
    "workers_ready_before_t_s",
)
GOAL_P99_S, GOAL_MAX_S, GOAL_PEER_RATIO = 1.0, 2.0, 20.0
"""Issue 18's targets: 50k burst p99 start lag <= 1 s, all started <= 2 s; cronwell's
throughput >= 20x Procrastinate's at 10k."""


def burst_key(
    handler: str, n: int, ahead: float, concurrency: int | None = None, join_after: float = 0
) -> str:
    """The results key of one burst run (`concurrency`: the --deep-concurrency run)."""
    deep = f" concurrency={concurrency}" if concurrency else ""
    joined = f" join_after={join_after:g}s" if join_after else ""
    return f"burst {handler} n={n} claim_ahead={ahead:g}s{deep}{joined}"


SCALING = (
    ("handler_start_lag_p50_s", "p50 s"),
    ("handler_start_lag_p99_s", "p99 s"),
    ("handler_start_lag_max_s", "all started s"),
    ("all_succeeded_after_s", "all done s"),
    ("worker_cpu_ms_per_occurrence", "worker ms/occ"),
    ("postgres_cpu_ms_per_occurrence", "pg ms/occ"),
    ("per_second", "occ/s"),
)
"""The scaling curve's columns (start lags at the handler)."""


def scaling_key(n: int, workers: int) -> str:
    """The results key of one point of the scaling curve."""
    return f"scaling noop n={n} workers={workers}"


def scaling_table(results: dict[str, Any]) -> None:
    """The scaling curve: one row per worker count, for sizing a cluster from it."""
    rows = [(k, f) for k, f in results.items() if k.startswith("scaling noop ")]
    if not rows:
        return
    print("\nscaling: the no-op burst with 1..N worker processes, default worker settings")
    print(
        f"{'n':>8}{'workers':>9}"
        + "".join(f"{label:>15}" for _, label in SCALING)
        + f"{'load 1 min':>14}"
    )
    for _, f in rows:
        print(
            f"{f.get('occurrences', '-')!s:>8}{f.get('workers', '-')!s:>9}"
            + "".join(f"{f.get(k, '-')!s:>15}" for k, _ in SCALING)
            + f"{_load(f):>14}"
        )


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return "-"
    return f"{a / b:.2f}x"


def _load(figs: dict[str, Any]) -> str:
    lb, la = figs.get("load_before"), figs.get("load_after")
    return f"{lb[0]}->{la[0]}" if lb and la else "-"


def _table(title: str, cols: dict[str, dict[str, Any]]) -> None:
    """Figures side by side; ratios of 'after' to every other column."""
    others = [c for c in cols if c != "after"]
    print(f"\n{title}")
    print(
        f"{'figure':<32}"
        + "".join(f"{c:>14}" for c in cols)
        + "".join(f"{'aft/' + c[:4]:>10}" for c in others)
    )
    for k in COMPARED:
        vals = {c: d.get(k, "-") for c, d in cols.items()}
        print(
            f"{k:<32}"
            + "".join(f"{v!s:>14}" for v in vals.values())
            + "".join(f"{ratio(vals['after'], vals[c]):>10}" for c in others)
        )
    loads = "".join(f"{_load(d):>14}" for d in cols.values())
    print(f"{'load avg 1 min, before->after':<32}{loads}")
    speeds = "".join(f"{d.get('machine_speed_ms', '-')!s:>14}" for d in cols.values())
    print(f"{'machine speed, ms (less: faster)':<32}{speeds}")


def at_size(results: dict[str, Any], prefix: str, n: int) -> dict[str, Any]:
    """The figures of the section whose key starts with `prefix`, run at n occurrences."""
    return next(
        (f for k, f in results.items() if k.startswith(prefix) and f.get("occurrences") == n),
        {},
    )


def report(results: dict[str, Any], aheads: list[float]) -> None:
    """The side-by-side tables (before = the first --claim-ahead value, after = the last;
    peer and ceiling at the same N), the issue's goals, then every figure."""
    before_a, after_a = aheads[0], aheads[-1]
    runs = [f for k, f in results.items() if k.startswith("burst ")]
    groups = sorted(
        {(f.get("handler"), f.get("occurrences")) for f in runs},
        key=lambda g: (g[0] != "noop", -g[1]),
    )
    peer, pgq_ = results.get("peer", {}), results.get("pgqueuer", {})
    for handler, n in groups:
        before = results.get(burst_key(handler, n, before_a), {})
        after = results.get(burst_key(handler, n, after_a), {})
        noop = handler == "noop"
        p = peer if noop and peer.get("occurrences") == n else {}
        q = pgq_ if noop and pgq_.get("occurrences") == n else {}
        c, fl, tk = (
            at_size(results, name, n) if noop else {} for name in ("ceiling ", "floor ", "tasks ")
        )
        deep_key = burst_key(handler, n, after_a) + " concurrency="
        deeper = {
            f"after c={k.removeprefix(deep_key)}": f
            for k, f in results.items()
            if k.startswith(deep_key)
        }
        _table(
            f"burst of {n} due at T, handler {handler}: before = claim ahead {before_a:g} s,"
            f" after = {after_a:g} s (peers at their own start: Procrastinate's started event,"
            " pgqueuer's handler)",
            {"before": before, "after": after}
            | deeper
            | {"procrastinate": p, "pgqueuer": q, "ceiling": c, "floor": fl, "tasks": tk},
        )
        for label, run in ({"after": after} | deeper if noop else {}).items():
            p99, mx = run.get("handler_start_lag_p99_s"), run.get("handler_start_lag_max_s")
            if isinstance(p99, int | float) and isinstance(mx, int | float):
                ok = p99 <= GOAL_P99_S and mx <= GOAL_MAX_S
                print(
                    f"goal p99 <= {GOAL_P99_S:g} s, all started <= {GOAL_MAX_S:g} s (at the"
                    f" handler, {label}): {'meets' if ok else 'MISSES'} (p99 {p99} s, max {mx} s)"
                )
            for name, d in (("Procrastinate", p), ("pgqueuer", q)):
                if not d.get("per_second"):
                    continue
                r = run.get("per_second", 0) / d["per_second"]
                print(
                    f"goal cronwell/{name} throughput >= {GOAL_PEER_RATIO:g}x ({label}):"
                    f" {'meets' if r >= GOAL_PEER_RATIO else 'MISSES'} ({r:.1f}x; cronwell p99"
                    f" {run.get('handler_start_lag_p99_s')} s at the handler,"
                    f" {run.get('start_lag_p99_s')} s started_at; {name} p99"
                    f" {d.get('start_lag_p99_s', d.get('handler_start_lag_p99_s'))} s)"
                )
    scaling_table(results)
    print(f"\n{'figure':<72} value")
    for section, figs in results.items():
        for k, v in figs.items():
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    print(f"{section + '.' + k + '.' + k2:<72} {v2}")
            else:
                print(f"{section + '.' + k:<72} {v}")


def plot(curves: dict[int, dict[str, list[float]]], path: Path) -> Path | None:
    """One start-lag CDF panel per burst size: {n: {label: lags}}."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = sorted(curves, reverse=True)
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.5), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        for name, xs in curves[n].items():
            if xs:
                xs = sorted(xs)
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
        ax.axvline(GOAL_P99_S, color="grey", linestyle=":", label=f"goal: p99 <= {GOAL_P99_S:g} s")
        ax.axhline(0.99, color="lightgrey", linestyle=":")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("start lag (s, database clock; symlog)")
        ax.set_ylabel("fraction of occurrences started")
        ax.set_title(f"Start-lag CDF, {n} due at T (no-op handler)")
        ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x]
    except ValueError:
        raise BenchError(f"{what}: comma-separated numbers expected, got {text!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise BenchError(f"{what}: one or more numbers >= 0 expected, got {text!r}")
    return vals


async def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--scaling-workers",
        default="1,2,4",
        help="scaling: the no-op burst at --scaling-jobs once per worker process count",
    )
    ap.add_argument("--scaling-jobs", type=int, default=0, help="scaling: burst size (0: --jobs)")
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--lead", type=float, default=40.0, help="burst T = now + lead seconds")
    ap.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"any of {','.join(SECTIONS)} (default: all but soak)",
    )
    ap.add_argument(
        "--claim-ahead",
        default="0,2",
        help="burst: run each burst once per worker claim_ahead_seconds value; the first is"
        " reported as 'before', the last as 'after' (0: claimed once due, the old behaviour)",
    )
    ap.add_argument(
        "--handler",
        default=",".join(HANDLERS),
        help=f"burst: handler variants (any of {','.join(HANDLERS)}); noop runs at --jobs,"
        " the others at --handler-jobs",
    )
    ap.add_argument("--handler-jobs", type=int, default=10_000)
    ap.add_argument(
        "--join-after",
        type=float,
        default=0.0,
        help="burst: start the workers but the first this many seconds after the first"
        " registered (a pool's workers joining while one claims a burst ahead)",
    )
    ap.add_argument(
        "--deep-concurrency",
        type=int,
        default=0,
        help="burst: each no-op burst (at --jobs and at --peer-jobs) once more, claim ahead"
        " as 'after', with enough worker concurrency to claim all of it ahead, at most this"
        " (a worker claims ahead at most its concurrency: how much a deeper claim ahead"
        " gives)",
    )
    ap.add_argument(
        "--handler-lead", type=float, default=15.0, help="T = now + this for the variants"
    )
    ap.add_argument(
        "--peer-jobs",
        type=int,
        default=10_000,
        help="burst size for the peer (0: same as --jobs); when it differs, cronwell's burst"
        " and the ceiling are also run at this size so the ratios compare like with like",
    )
    ap.add_argument("--peer-lead", type=float, default=15.0)
    ap.add_argument(
        "--peer-poll", type=float, default=1.0, help="procrastinate fetch polling interval"
    )
    ap.add_argument(
        "--pgqueuer-batch", type=int, default=100, help="pgqueuer: pgq run --batch-size"
    )
    ap.add_argument("--ceiling-batch", type=int, default=500)
    ap.add_argument("--sustained-jobs", default="5000,10000", help="per-second jobs, per run")
    ap.add_argument(
        "--sustained-policies",
        default=",".join(sustained.POLICIES),
        help="sustained: the jobs' concurrencyPolicy, one run each (Skip: cronwell's default)",
    )
    ap.add_argument("--sustained-seconds", type=float, default=60.0)
    ap.add_argument("--sustained-warmup", type=float, default=10.0)
    ap.add_argument(
        "--sustained-horizon",
        type=float,
        default=5.0,
        help="the scheduler's --horizon-seconds in sustained (cronwell's default: 30)",
    )
    ap.add_argument("--growth-sizes", default="10000,100000,1000000")
    ap.add_argument("--growth-history", type=int, default=1, help="succeeded occurrences per job")
    ap.add_argument("--growth-reps", type=int, default=7)
    ap.add_argument("--profile-jobs", type=int, default=20_000)
    ap.add_argument(
        "--statements-jobs", type=int, default=10_000, help="statements: no-op burst size"
    )
    ap.add_argument(
        "--anatomy-rounds",
        type=int,
        default=400,
        help="anatomy: batches of 250 occurrences measured per schema variant",
    )
    ap.add_argument(
        "--claim-jobs",
        type=int,
        default=50_000,
        help="claim: occurrences claimed in this process (due in --peer-lead seconds)",
    )
    ap.add_argument("--prescale-n", type=int, default=50_000, help="prescale: burst size")
    ap.add_argument(
        "--prescale-duration", type=float, default=0.2, help="prescale: handler seconds"
    )
    ap.add_argument("--prescale-concurrency", type=int, default=64)
    ap.add_argument("--prescale-max-workers", type=int, default=4)
    ap.add_argument("--status-jobs", type=int, default=10_000, help="CRs of the status bench")
    ap.add_argument("--status-qps", default="20,100", help="operator --status-qps settings")
    ap.add_argument("--retention-days", type=int, default=10, help="retention: simulated days")
    ap.add_argument(
        "--retention-per-day", type=int, default=100_000, help="retention: occurrences a day"
    )
    ap.add_argument("--retention-jobs", type=int, default=1000, help="retention: recurring jobs")
    ap.add_argument(
        "--retention-burst",
        type=int,
        default=10_000,
        help="retention: the no-op burst run with and without the last retention pass at T",
    )
    ap.add_argument(
        "--retention-full",
        action="store_true",
        help="retention: 30 days of 1,000,000 occurrences over 10,000 jobs (about an hour)",
    )
    ap.add_argument("--schedule-calls", type=int, default=10_000, help="schedule: calls per case")
    ap.add_argument(
        "--forecast-sizes",
        default="10000,100000",
        help="forecast: live jobs per size (1000000 works: minutes of seeding and old path)",
    )
    ap.add_argument(
        "--ui-sizes", default="10000,100000", help="ui: live jobs, the store grown to each"
    )
    ap.add_argument("--ui-runs", type=int, default=10_000_000, help="ui: runs over the first size")
    ap.add_argument("--ui-requests", type=int, default=50, help="ui: measured requests per page")
    ap.add_argument("--soak-minutes", type=float, default=60.0, help="soak: run length")
    ap.add_argument(
        "--soak-warmup-minutes",
        type=float,
        default=5.0,
        help="soak: judged after this (default 5; at most a third of --soak-minutes is sane)",
    )
    ap.add_argument("--soak-burst", type=int, default=50_000, help="soak: occurrences a burst")
    ap.add_argument(
        "--soak-burst-every", type=float, default=150.0, help="soak: seconds between bursts"
    )
    ap.add_argument(
        "--soak-scale",
        type=float,
        default=soak.DEFAULT_SCALE,
        help="soak: background rate as a fraction of the 10x-seed day compressed 24x"
        f" (default {soak.DEFAULT_SCALE:g}: under this 2-core machine's CPU bound)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    full = args.retention_full
    growth_sizes = [int(x) for x in args.growth_sizes.split(",") if x]
    retention_jobs = 10_000 if full else args.retention_jobs
    try:  # sizes a section cannot measure: say so before PostgreSQL starts
        aheads = _floats(args.claim_ahead, "--claim-ahead")
        counts = _floats(args.scaling_workers, "--scaling-workers")
        scaling_workers = [int(x) for x in counts]
        if any(x < 1 or x % 1 for x in counts):
            raise BenchError(f"--scaling-workers: whole numbers >= 1, got {args.scaling_workers!r}")
        handlers = [h for h in args.handler.split(",") if h]
        bad = set(handlers) - set(HANDLERS)
        if bad or not handlers:
            raise BenchError(
                f"--handler: unknown {', '.join(sorted(bad)) or '(none)'}; any of"
                f" {','.join(HANDLERS)}"
            )
        sustained_jobs = [int(x) for x in _floats(args.sustained_jobs, "--sustained-jobs")]
        sustained_policies = [p for p in args.sustained_policies.split(",") if p]
        if "growth" in only:
            growth.check(growth_sizes)
        if "retention" in only:
            retention.check(
                retention_jobs,
                1_000_000 if full else args.retention_per_day,
                30 if full else args.retention_days,
            )
        if "prescale" in only:
            prescale.check(args.prescale_max_workers)
        if "sustained" in only:
            sustained.check(args.sustained_seconds, args.sustained_warmup, sustained_policies)
        if "soak" in only and len(only) > 1:
            raise BenchError(
                "the soak runs alone (its store has partitions of minutes): --only soak"
            )
        if "soak" in only:
            soak.check(
                args.soak_minutes,
                args.soak_warmup_minutes,
                args.soak_burst,
                args.soak_burst_every,
                args.soak_scale,
            )
        if "profile" in only and not burst.PY_SPY.exists():
            raise BenchError(f"profile needs py-spy ({burst.PY_SPY}): pip install -e '.[bench]'")
    except BenchError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")  # one line, no usage block
    # pg_stat_statements only where PostgreSQL's time per statement is reported.
    server = bench_server(statements=bool({"profile", "statements", "soak", "sustained"} & only))
    url = server.start()
    started = time.time()
    results: dict[str, Any] = {
        "run": {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "load_before": load_average(),
            "machine_speed_ms": machine_speed(),
        },
        "machine": {"cpus": os.cpu_count()},
    }
    lags: dict[str, dict[str, list[float]]] = {}
    args.out.mkdir(parents=True, exist_ok=True)

    async def section(name: str, aw: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """Run one section, keep its figures with the load average around it."""
        speed = machine_speed()
        lb, t0 = load_average(), time.perf_counter()
        figs = await aw
        figs |= {
            "section_seconds": round(time.perf_counter() - t0, 1),
            "machine_speed_ms": speed,
            "load_before": lb,
            "load_after": load_average(),
        }
        # _lags, _handler_lags: raw lists, kept for start_lags.json and the plot
        kept = {
            k.strip("_").removesuffix("_lags"): figs.pop(k)
            for k in [k for k in figs if k.startswith("_")]
        }
        if kept:
            lags[name] = kept
        results[name] = figs
        print(f"{name}:", json.dumps(figs), flush=True)
        return figs

    async def bursts(handler: str, n: int, lead: float, deep: bool = False) -> None:
        """One run per claim ahead; with `deep`, one more at the last claim ahead with
        enough concurrency to claim all n ahead (at most --deep-concurrency)."""
        deepest = min(args.deep_concurrency, -(-n // args.workers))
        runs = [(a, args.concurrency) for a in aheads]
        runs += [(aheads[-1], deepest)] if deep and deepest > args.concurrency else []
        for a, conc in runs:
            await section(
                burst_key(
                    handler, n, a, conc if conc != args.concurrency else None, args.join_after
                ),
                burst.burst(
                    db,
                    url,
                    n,
                    args.workers,
                    conc,
                    lead,
                    handler=handler,
                    claim_ahead=a,
                    join_after=args.join_after,
                ),
            )

    t_all = time.perf_counter()
    peer_n = args.peer_jobs or args.jobs
    try:
        async with Database(url, max_size=4, deadline_seconds=SETUP_DEADLINE_SECONDS) as db:
            await migrate(
                db,
                history_partition_seconds=soak.partition_seconds(args.soak_minutes)
                if "soak" in only
                else history_partitions.DAY,
            )
            results["machine"] = await machine_facts(db, sys.argv)
            results["machine"]["args"] = {k: str(v) for k, v in vars(args).items()}
            if "materialise" in only:
                await section("materialise", burst.materialise(db, args.jobs))
            if "burst" in only:
                for h in handlers:
                    noop = h == "noop"
                    await bursts(
                        h,
                        args.jobs if noop else args.handler_jobs,
                        args.lead if noop else args.handler_lead,
                        noop,
                    )
            if "scaling" in only:
                for w in scaling_workers:
                    n = args.scaling_jobs or args.jobs
                    await section(
                        scaling_key(n, w),
                        burst.burst(db, url, n, w, args.concurrency, args.lead),
                    )
            if "ceiling" in only:
                peers = {"peer", "pgqueuer"} & only
                for n in dict.fromkeys([args.jobs, peer_n] if peers else [args.jobs]):
                    lead = args.lead if n == args.jobs else args.peer_lead
                    await burst.prepare_burst(db, n, lead)
                    await section(
                        f"ceiling n={n}",
                        ceiling.ceiling(db, url, n, args.workers, args.ceiling_batch),
                    )
                    await section(
                        f"floor n={n}",
                        ceiling.floor(db, url, n, args.workers, args.ceiling_batch),
                    )
                    await burst.prepare_burst(db, n, lead)
                    await section(
                        f"tasks n={n}",
                        ceiling.tasks(db, url, n, args.workers, args.ceiling_batch),
                    )
            if ("peer" in only or "pgqueuer" in only) and (
                peer_n != args.jobs or "burst" not in only
            ):
                await bursts("noop", peer_n, args.peer_lead, deep=True)
            if "pgqueuer" in only:
                await section(
                    "pgqueuer",
                    pgq.pgqueuer_burst(
                        url,
                        peer_n,
                        args.workers,
                        args.concurrency,
                        args.peer_lead,
                        args.pgqueuer_batch,
                    ),
                )
            if "peer" in only:
                await section(
                    "peer",
                    peer.peer_burst(
                        url,
                        peer_n,
                        args.workers,
                        args.concurrency,
                        args.peer_lead,
                        args.peer_poll,
                    ),
                )
            if "sustained" in only:
                for n in sustained_jobs:
                    for policy in sustained_policies:
                        # Skip keeps the section's name of earlier runs (comparable figures).
                        suffix = "" if policy == sustained.POLICIES[0] else f" policy={policy}"
                        await section(
                            f"sustained n={n}{suffix}",
                            sustained.sustained(
                                db,
                                worker_env(url),
                                n,
                                args.workers,
                                args.concurrency,
                                args.sustained_seconds,
                                args.sustained_warmup,
                                args.sustained_horizon,
                                policy,
                            ),
                        )
            if "growth" in only:
                spec = jobs.spec_document(
                    ScheduledJobSpec.model_validate(
                        {"schedule": "* * * * *", "target": {"handler": {"name": "bench.noop"}}}
                    )
                )
                await section(
                    "growth",
                    growth.growth(db, spec, growth_sizes, args.growth_history, args.growth_reps),
                )
            if "profile" in only:
                pdir = args.out / "profile"

                async def profiled() -> dict[str, Any]:
                    await profile.prepare(db, pdir)
                    figs = await burst.burst(
                        db,
                        url,
                        args.profile_jobs,
                        args.workers,
                        args.concurrency,
                        args.lead,
                        profile=pdir,
                    )
                    return await profile.summary(db, figs, pdir)

                await section("profile", profiled())
            if "statements" in only:

                async def counted() -> dict[str, Any]:
                    await enable_statements(db, track_nested=True)
                    n = args.statements_jobs
                    figs = await burst.burst(
                        db, url, n, args.workers, args.concurrency, args.lead, statements=True
                    )
                    counts = await profile.per_query(db, n)
                    await enable_statements(db)
                    print(profile.table(counts), flush=True)
                    keep = ("succeeded", "all_succeeded_after_s")
                    cpu = ("worker_cpu_ms_per_occurrence", "postgres_cpu_ms_per_occurrence")
                    return counts | {k: figs.get(k) for k in keep + cpu}

                await section("statements", counted())
            if "anatomy" in only:
                await section("anatomy", anatomy.anatomy(args.anatomy_rounds))
            if "claim" in only:
                await section("claim", claim.claim_cpu(db, args.claim_jobs, args.peer_lead))
            if "schedule" in only:
                await section("schedule", _now(schedule.schedule_bench(args.schedule_calls)))
            if "status" in only:
                # Its own database (the operator migrates it), a local control plane.
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DROP DATABASE IF EXISTS cronwell_status_bench")
                    conn.execute("CREATE DATABASE cronwell_status_bench")
                qps = [float(q) for q in args.status_qps.split(",") if q]

                async def status_run() -> dict[str, Any]:
                    settings = await asyncio.to_thread(
                        status.run, db_url(url, "cronwell_status_bench"), args.status_jobs, qps
                    )
                    return {"settings": settings}

                await section("status", status_run())
            if "prescale" in only:
                figs = await section(
                    "prescale",
                    prescale.prescale(
                        db,
                        url,
                        args.prescale_n,
                        args.prescale_concurrency,
                        args.prescale_duration,
                        args.prescale_max_workers,
                        args.lead,
                    ),
                )
                prescale.report(figs)
            if "retention" in only:
                await section(
                    "retention",
                    retention.retention(
                        url,
                        days=30 if full else args.retention_days,
                        per_day=1_000_000 if full else args.retention_per_day,
                        n_jobs=retention_jobs,
                        burst=args.retention_burst,
                        workers=args.workers,
                        concurrency=args.concurrency,
                        lead=args.lead,
                        run_burst=burst.burst,
                    ),
                )
            if "forecast" in only:
                sizes = [int(x) for x in args.forecast_sizes.split(",") if x]
                await section("forecast", forecast.forecast_bench(db, sizes))
            if "ui" in only:
                sizes = [int(x) for x in _floats(args.ui_sizes, "--ui-sizes")]
                await section("ui", ui.ui_bench(db, url, sizes, args.ui_runs, args.ui_requests))
            if "soak" in only:
                await section(
                    "soak",
                    soak.soak(
                        db,
                        worker_env(url),
                        workers=args.workers,
                        concurrency=args.concurrency,
                        minutes=args.soak_minutes,
                        warmup_minutes=args.soak_warmup_minutes,
                        burst=args.soak_burst,
                        every=args.soak_burst_every,
                        scale=args.soak_scale,
                        out=args.out,
                    ),
                )
    except BaseException as e:
        results["run"]["error"] = f"{type(e).__name__}: {e}"[:500]
        raise
    finally:
        discard(server)
        results["run"] |= {
            "total_seconds": round(time.perf_counter() - t_all, 1),
            "load_after": load_average(),
        }
        write_results(results, lags, aheads, args.out, started)
    report(results, aheads)


async def _now(figs: dict[str, Any]) -> dict[str, Any]:
    """A section computed without awaiting anything, as an awaitable for `section`."""
    return figs


def write_results(
    results: dict[str, Any],
    lags: dict[str, dict[str, list[float]]],
    aheads: list[float],
    out: Path,
    started: float,
) -> None:
    """One results file per run (run-<UTC start>.json), latest.json = this run merged over
    the previous one (the one to commit), the raw lags and the CDF plot."""
    text = json.dumps(results, indent=2)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    (out / f"run-{stamp}.json").write_text(text)
    (out / "latest.json").write_text(
        json.dumps(merge_latest(out / "latest.json", results), indent=2)
    )
    print(f"results: {out / f'run-{stamp}.json'} (= {out / 'latest.json'})")
    if not lags:
        return
    (out / "start_lags.json").write_text(json.dumps(lags))
    curves: dict[int, dict[str, list[float]]] = {}
    for name, kept in lags.items():
        figs = results[name]
        n = figs.get("occurrences")
        if name.startswith("burst noop "):
            a = figs.get("claim_ahead_s")
            tag = "before" if a == aheads[0] else "after" if a == aheads[-1] else "ahead"
            if "concurrency=" in name:
                tag += f", concurrency {figs.get('concurrency_per_worker')}"
            curves.setdefault(n, {})[f"cronwell {tag} (claim ahead {a:g} s), at the handler"] = (
                kept.get("handler", [])
            )
            curves[n][f"cronwell {tag} (claim ahead {a:g} s), started_at"] = kept.get("lags", [])
        elif name == "peer":
            curves.setdefault(n, {})[f"{figs.get('system')}, started event"] = kept.get("lags", [])
        elif name == "pgqueuer":
            curves.setdefault(n, {})[f"{figs.get('system')}, at the handler"] = kept.get(
                "handler", []
            )
    png = plot(curves, out / "start_lag_cdf.png") if curves else None
    if png:
        print(f"plot: {png}")


if __name__ == "__main__":
    # SIGTERM (a timeout, a kill) unwinds like Ctrl-C: the server and workers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        asyncio.run(main())
    except BenchError as e:  # found mid-run (the server is stopped by then)
        sys.exit(f"error: {e}")
