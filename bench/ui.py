"""The dashboard's server time per page under a large store: `--ui-runs` runs (default 10M)
over 10k live jobs, then the same store grown to 100k jobs (`--ui-sizes`).

Seeding is bulk SQL (generate_series), triggers and foreign keys off
(`session_replication_role = replica`), in statements of `CHUNK` jobs:

- jobs: 12 namespaces (`team-0`..`team-11`), 4 pools, labels `app` (40 values) and `tier`
  (3), every spec distinct (its own log message), schedules mixed (20 % every minute, 40 %
  every 5 minutes, 5 % every 15, 25 % hourly, 10 % daily at 02:00 in Europe/Paris), 2 %
  suspended, 1 % failing (their last 3 runs dead, consecutive_failures 3), 1 % late (next
  instant 3 minutes past); their counters (cronwell_job_counters) as the triggers would
  have left them;
- runs: the first size's jobs share `--ui-runs` occurrences evenly over the last 10 days;
  the jobs added to grow the store 10 each over the last day. States: 1 % dead (3 failed
  attempts, AttemptsExhausted), 1 % skipped, 0.4 % missed, 0.2 % cancelled, 5 % succeeded
  at the second attempt, the rest succeeded at the first; the latest run of 5 % of the
  jobs running and of 5 % pending (past its run_at: late); start lags 0-500 ms, 2 % up to
  30 s; durations 1-60 s. Attempts: one row per attempt made (skipped and missed runs have
  none, a running one only its earlier failures);
- then VACUUM ANALYZE (an autovacuumed store: visibility map set, statistics current).

Measured: every dashboard view through the real aiohttp app (cronwell.ui.app.make_app, on a
loopback TestServer, actions allowed so /dead/confirm renders), `--ui-requests` requests per
page after `WARMUP` (fewer for a page that takes seconds: PAGE_SECONDS); server time = a
middleware's clock around the handler (routing, queries, rendering; not the HTTP client).
Pages whose route answers 404 (not built in this tree) and /runs filters the page has no
field for are skipped. For a page whose p99 is over `BUDGET_MS`, the plans of its
statements (auto_explain, with ANALYZE) are printed and kept in the results.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.common import load_average, timed
from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database
from cronwell.ui.app import UiConfig, make_app

BUDGET_MS = 300.0
"""Issue 29: every page <= 300 ms p99 at 100k jobs."""
WARMUP = 5
PAGE_SECONDS, MIN_REQUESTS = 20.0, 5
"""A page's requests stop after PAGE_SECONDS (at least MIN_REQUESTS; `requests` says how
many were timed): bounds the section when a page is slow."""
CHUNK = 1000
"""Jobs whose runs one seeding statement inserts (1M rows at 1,000 runs each)."""
DAYS = 10
GROWN_RUNS_PER_JOB = 10

SEED_JOBS = """
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition, next_run_at,
                           suspended, consecutive_failures, labels)
SELECT gen_random_uuid(), 'team-' || i %% 12, 'job-' || i, s.spec, md5(s.spec::text),
       (ARRAY['default', 'batch', 'reports', 'etl'])[1 + i %% 4], i %% 16,
       CASE WHEN i %% 100 = 5 THEN now() - interval '3 minutes'
            ELSE date_trunc('minute', now()) + make_interval(mins => 1 + i %% 60) END,
       i %% 50 = 0, CASE WHEN i %% 100 = 3 THEN 3 ELSE 0 END,
       jsonb_build_object('app', 'app-' || i %% 40,
                          'tier', (ARRAY['web', 'batch', 'data'])[1 + i %% 3])
FROM generate_series(%(lo)s::int, %(hi)s::int) i,
LATERAL (SELECT jsonb_set(jsonb_set(jsonb_set(%(base)s::jsonb,
            '{target,log,message}', to_jsonb('job ' || i)),
            '{schedule}', to_jsonb(CASE WHEN i %% 20 < 4 THEN '* * * * *'
                                        WHEN i %% 20 < 12 THEN '*/5 * * * *'
                                        WHEN i %% 20 < 13 THEN '*/15 * * * *'
                                        WHEN i %% 20 < 18 THEN '0 * * * *'
                                        ELSE '0 2 * * *' END)),
            '{timeZone}', to_jsonb(CASE WHEN i %% 20 >= 18 THEN 'Europe/Paris'
                                        ELSE 'UTC' END)) AS spec) s
"""
SEED_COUNTERS = """
INSERT INTO cronwell_job_counters (job_id, succeeded_total, failed_total, dead_total,
                                   skipped_total, last_successful_at, last_failure_at, last_error)
SELECT j.id, %(per_job)s::int, %(per_job)s::int / 20, %(per_job)s::int / 100,
       %(per_job)s::int / 100,
       now() - make_interval(secs => 60 + (n * 7919) %% 86400),
       CASE WHEN n %% 100 = 3 THEN now() - make_interval(secs => n %% 600) END,
       CASE WHEN n %% 100 = 3 THEN 'boom' END
FROM cronwell_jobs j, LATERAL (SELECT substr(j.name, 5)::int AS n) x
WHERE x.n BETWEEN %(lo)s::int AND %(hi)s::int
"""
# One statement per chunk of jobs: the occurrences and, from their RETURNING, the attempts.
SEED_RUNS = """
WITH o AS (
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, overlap, delivery, max_attempts, timeout_seconds, attempt, fence, worker_id,
    lease_expires_at, started_at, finished_at, last_error, claimed_at)
SELECT j.id || ':' || k, j.id, j.pool, r.ts, r.ts, r.state,
       CASE r.state WHEN 'dead' THEN 'AttemptsExhausted' WHEN 'skipped' THEN 'Overlap'
                    WHEN 'missed' THEN 'Downtime' WHEN 'cancelled' THEN 'Cancelled' END,
       'Skip', 'AtLeastOnce', 3, 3600, r.attempt,
       CASE WHEN r.attempt > 0 THEN x.n::bigint * 100000 + k END,
       CASE WHEN r.attempt > 0 THEN 'worker-' || n %% 8 END,
       CASE WHEN r.state = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN r.state IN ('succeeded', 'dead', 'running', 'cancelled') THEN r.ts + r.lag END,
       CASE WHEN r.state IN ('succeeded', 'dead', 'cancelled')
            THEN r.ts + r.lag + make_interval(secs => 1 + n %% 60)
            WHEN r.state IN ('skipped', 'missed') THEN r.ts END,
       CASE WHEN r.state = 'dead' THEN 'ConnectionError: connection refused' END,
       CASE WHEN r.state IN ('succeeded', 'dead', 'running', 'cancelled') THEN r.ts + r.lag END
FROM cronwell_jobs j, LATERAL (SELECT substr(j.name, 5)::int AS n) x,
     generate_series(1, %(per_job)s::int) k,
     LATERAL (SELECT now() - make_interval(secs => %(span)s::float8)
                     + make_interval(secs => (k - 1) * %(span)s::float8 / %(per_job)s
                                             + x.n %% 300) AS ts,
                     make_interval(secs => ((x.n * 7919 + k * 104729) %% 1000) / 2000.0
                         * CASE WHEN k %% 50 = 7 THEN 60 ELSE 1 END) AS lag) t,
     LATERAL (SELECT CASE
                 WHEN k = %(per_job)s AND x.n %% 20 = 1 THEN 'running'
                 WHEN k = %(per_job)s AND x.n %% 20 = 2 THEN 'pending'
                 WHEN x.n %% 100 = 3 AND k > %(per_job)s - 3 THEN 'dead'
                 WHEN k %% 100 = 0 THEN 'dead'
                 WHEN k %% 100 = 1 THEN 'skipped'
                 WHEN k %% 250 = 2 THEN 'missed'
                 WHEN k %% 500 = 3 THEN 'cancelled'
                 ELSE 'succeeded' END AS state) s,
     LATERAL (SELECT t.ts, t.lag, s.state, CASE
                 WHEN s.state = 'dead' THEN 3
                 WHEN s.state IN ('skipped', 'missed', 'pending') THEN 0
                 WHEN k %% 20 = 5 THEN 2 ELSE 1 END AS attempt) r
WHERE x.n BETWEEN %(lo)s::int AND %(hi)s::int
RETURNING id, idempotency_key, scheduled_for, state, attempt, fence, worker_id, started_at,
          finished_at
)
INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                               worker_id, outcome, error, started_at, finished_at)
SELECT o.id, o.idempotency_key, o.scheduled_for, g, o.fence, o.worker_id,
       CASE WHEN g < o.attempt OR o.state = 'dead' THEN 'failed'
            WHEN o.state = 'cancelled' THEN 'cancelled' ELSE 'succeeded' END,
       CASE WHEN g < o.attempt OR o.state = 'dead' THEN 'ConnectionError: connection refused' END,
       o.started_at, coalesce(o.finished_at, o.started_at)
FROM o, generate_series(1, o.attempt) g
WHERE o.state <> 'running' OR g < o.attempt
"""


def _base_spec() -> dict[str, Any]:
    return jobs.spec_document(
        ScheduledJobSpec.model_validate({"schedule": "* * * * *", "target": {"log": {}}})
    )


async def seed(db: Database, lo: int, hi: int, per_job: int, span_s: float) -> float:
    """Jobs lo..hi (`job-<i>`) with `per_job` runs each over the last `span_s` seconds and
    their counters; seconds taken (VACUUM ANALYZE included)."""
    t0 = time.perf_counter()
    async with db.connection() as conn:
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(SEED_JOBS, {"lo": lo, "hi": hi, "base": json.dumps(_base_spec())})
        await conn.execute(SEED_COUNTERS, {"lo": lo, "hi": hi, "per_job": per_job})
        for start in range(lo, hi + 1, CHUNK):
            await conn.execute(
                SEED_RUNS,
                {"lo": start, "hi": min(hi, start + CHUNK - 1), "per_job": per_job, "span": span_s},
            )
        await conn.execute("RESET session_replication_role")
        await conn.execute(
            "SELECT setval('cronwell_fence', (SELECT max(fence) FROM cronwell_occurrences))"
        )
        await conn.execute("VACUUM ANALYZE cronwell_jobs")
        await conn.execute("VACUUM ANALYZE cronwell_job_counters")
        await conn.execute("VACUUM ANALYZE cronwell_occurrences")
        await conn.execute("VACUUM ANALYZE cronwell_attempts")
    return time.perf_counter() - t0


def _pages(after: dict[str, str]) -> list[tuple[str, str]]:
    """(label, path) of every view; `after` holds the cursors found on the first pages."""
    job = "/jobs/team-7/job-7"
    since = (datetime.now(UTC) - timedelta(days=2)).strftime("%Y-%m-%dT%H:%MZ")
    pages = [
        ("jobs", "/"),
        ("jobs sort=next_run", "/?sort=next_run"),
        ("jobs sort=last_run", "/?sort=last_run"),
        ("jobs state=failing", "/?state=failing"),
        ("jobs state=late", "/?state=late"),
        ("jobs state=suspended", "/?state=suspended"),
        ("jobs state=active", "/?state=active"),
        ("jobs label=app=app-7", "/?label=app%3Dapp-7"),
        ("jobs page 2", after.get("jobs", "")),
        ("jobs sort=next_run page 2", after.get("jobs sort=next_run", "")),
        ("jobs sort=last_run page 2", after.get("jobs sort=last_run", "")),
        ("job window=24h", job + "?window=24h"),
        ("job window=7d", job + "?window=7d"),
        ("runs", "/runs"),
        ("runs job=", "/runs?namespace=team-7&job=job-7"),
        ("runs state=dead", "/runs?state=dead"),
        ("runs state=running", "/runs?state=running"),
        ("runs state=cancelled", "/runs?state=cancelled"),
        ("runs pool=batch", "/runs?pool=batch"),
        ("runs window=1h", "/runs?window=1h"),
        ("runs pool=batch window=24h", "/runs?pool=batch&window=24h"),
        ("runs since=2 days ago", "/runs?since=" + quote(since)),
        ("runs page 3", after.get("runs page 2", "")),
        ("runs/fragment", "/runs/fragment"),
        ("dead", "/dead"),
        ("dead/confirm replay", "/dead/confirm?action=replay"),
        ("status", "/status"),
        ("forecast.json", "/forecast.json"),
        ("forecast", "/forecast"),
    ]
    return [(label, path) for label, path in pages if path]


def _unsupported(runs_html: str) -> set[str]:
    """Labels of the /runs filters this tree's page has no field for (an unknown query
    parameter is ignored, so those rows would time the unfiltered page)."""
    return {
        label
        for label, field in (
            ("runs pool=batch", "pool"),
            ("runs window=1h", "window"),
            ("runs pool=batch window=24h", "window"),
            ("runs since=2 days ago", "since"),
        )
        if f'name="{field}"' not in runs_html
    }


NEXT = re.compile(r'<a rel="next" href="([^"]+)"')


async def _next_link(client: TestClient[web.Request, web.Application], path: str) -> str | None:
    resp = await client.get(path)
    m = NEXT.search(await resp.text())
    return html.unescape(m.group(1)) if m else None


async def _cursors(client: TestClient[web.Request, web.Application]) -> dict[str, str]:
    """The second page of each jobs order and the third page of runs, by following the
    pages' own "next" links (the cursors the dashboard hands out)."""
    found: dict[str, str] = {}
    for label, path in (("jobs", "/"), ("jobs sort=next_run", "/?sort=next_run"),
                        ("jobs sort=last_run", "/?sort=last_run"), ("runs", "/runs")):  # fmt: skip
        nxt = await _next_link(client, path)
        if nxt:
            found[label] = nxt
    if "runs" in found and (third := await _next_link(client, found["runs"])):
        found["runs page 2"] = third
    return found


def _timer(times: list[float]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def timer(request: web.Request, handler: Any) -> web.StreamResponse:
        t0 = time.perf_counter()
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            times.append(1000 * (time.perf_counter() - t0))

    return timer


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 1)


async def _client(db: Database, times: list[float]) -> TestClient[web.Request, web.Application]:
    app = make_app(UiConfig(db=db, allow_actions=True))
    app.middlewares.insert(0, _timer(times))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def _short(note: str) -> str:
    """auto_explain's note without the statement's text: its duration, the first line of
    its comment (which query) and the plan."""
    lines = note.splitlines()
    start = next((i for i, line in enumerate(lines) if "(cost=" in line), len(lines))
    what = next((line for line in lines if line.startswith("Query Text:")), "")
    return "\n".join([lines[0] if lines else "", what[:120], *lines[start:]])


async def plans(url: str, path: str) -> list[str]:
    """The plans (EXPLAIN ANALYZE, auto_explain as notices) of every statement one request
    of `path` sends, on a connection of its own."""
    notices: list[str] = []
    opts = "-c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0"
    opts += " -c auto_explain.log_analyze=on -c auto_explain.log_level=notice"
    sep = "&" if "?" in url else "?"
    async with Database(f"{url}{sep}options={quote(opts, safe='')}", max_size=1) as db:
        async with db.connection() as conn:
            conn.add_notice_handler(lambda d: notices.append(_short(d.message_primary or "")))
        client = await _client(db, [])
        try:
            await client.get(path)
        finally:
            await client.close()
    return notices


async def _repeat(client: TestClient[web.Request, web.Application], path: str, n: int) -> None:
    """`n` requests of `path`, fewer if they take over PAGE_SECONDS (at least MIN_REQUESTS):
    a page of seconds would otherwise hold the section for minutes."""
    t0 = time.perf_counter()
    for i in range(n):
        if i >= MIN_REQUESTS and time.perf_counter() - t0 > PAGE_SECONDS:
            return
        await (await client.get(path)).read()


async def measure(db: Database, requests: int) -> dict[str, dict[str, Any]]:
    """p50/p99/max server time of every page (`requests` each after WARMUP)."""
    times: list[float] = []
    client = await _client(db, times)
    out: dict[str, dict[str, Any]] = {}
    try:
        after = await _cursors(client)
        skip = _unsupported(await (await client.get("/runs")).text())
        for label, path in _pages(after):
            if label in skip:
                continue
            resp = await client.get(path)
            if resp.status == 404:
                continue  # a view this tree does not have
            if resp.status != 200:
                out[label] = {"path": path, "status": resp.status}
                continue
            await _repeat(client, path, WARMUP)
            times.clear()
            await _repeat(client, path, requests)
            out[label] = {
                "path": path,
                "requests": len(times),
                "p50_ms": _pct(times, 0.5),
                "p99_ms": _pct(times, 0.99),
                "max_ms": round(max(times), 1),
            }
    finally:
        await client.close()
    return out


async def ui_bench(
    db: Database, url: str, sizes: list[int], runs: int, requests: int
) -> dict[str, Any]:
    async with db.connection() as conn:
        await conn.execute(
            "TRUNCATE cronwell_attempts, cronwell_occurrences, cronwell_status_changes,"
            " cronwell_job_counters, cronwell_jobs CASCADE"
        )
    out: dict[str, Any] = {"runs": runs, "requests_per_page": requests, "budget_ms": BUDGET_MS}
    seeded = 0
    for n in sorted(sizes):
        first = seeded == 0
        per_job = max(1, runs // n) if first else GROWN_RUNS_PER_JOB
        secs = await seed(db, seeded + 1, n, per_job, DAYS * 86400 if first else 86400)
        seeded = n
        _ms, sizes_row = await timed(_store_size(db))
        print(f"ui: {n} jobs seeded in {secs:.0f} s: {sizes_row}", flush=True)
        load = load_average()
        pages = await measure(db, requests)
        over = {k: v for k, v in pages.items() if v.get("p99_ms", 0) > BUDGET_MS}
        explained = {k: await plans(url, v["path"]) for k, v in over.items()}
        out[str(n)] = {
            "seed_s": round(secs, 1),
            **sizes_row,
            "load_before": load,
            "load_after": load_average(),
            "pages": pages,
            "over_budget": sorted(over),
            "plans_over_budget": explained,
        }
        print(f"ui {n} jobs:", json.dumps(out[str(n)]), flush=True)  # kept if a later size fails
    report(out, sizes)
    return out


async def _store_size(db: Database) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM cronwell_jobs) AS jobs,"
            " (SELECT reltuples::bigint FROM pg_class WHERE oid = 'cronwell_occurrences'::regclass)"
            " AS occurrences,"
            " (SELECT reltuples::bigint FROM pg_class WHERE oid = 'cronwell_attempts'::regclass)"
            " AS attempts,"
            " pg_database_size(current_database()) / 1048576 AS db_mb"
        )
        row = await cur.fetchone()
    return dict(row or {})


def report(out: dict[str, Any], sizes: list[int]) -> None:
    """One table: page | p50/p99 per size; then the plans of pages over budget."""
    keys = [str(n) for n in sorted(sizes)]
    labels = list(dict.fromkeys(k for n in keys for k in out[n]["pages"]))
    head = f"{'page':<28}" + "".join(f"{f'{n} jobs p50/p99 ms':>26}" for n in keys)
    print(head)
    for label in labels:
        cells = []
        for n in keys:
            p = out[n]["pages"].get(label, {})
            cell = f"{p['p50_ms']}/{p['p99_ms']}" if "p99_ms" in p else str(p.get("status", "-"))
            cells.append(f"{cell + (' !' if p.get('p99_ms', 0) > BUDGET_MS else ''):>26}")
        print(f"{label:<28}" + "".join(cells))
    for n in keys:
        f = out[n]
        print(
            f"{n} jobs: {f['occurrences']} runs, {f['attempts']} attempts, {f['db_mb']} MB,"
            f" seeded in {f['seed_s']} s, load {f['load_before']} -> {f['load_after']};"
            f" over {BUDGET_MS:g} ms p99: {', '.join(f['over_budget']) or 'none'}"
        )
        for label, notes in f["plans_over_budget"].items():
            print(f"--- plans of {label} ({n} jobs) ---")
            for note in notes:
                print(note)
