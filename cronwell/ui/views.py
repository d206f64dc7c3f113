"""The dashboard's pages: parse and validate the query string (a bad value is a 400, never a
traceback), read the store's read model, render a template."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlencode

import pydantic
from aiohttp import web

from cronwell import dispatch
from cronwell.forecast import windows
from cronwell.models import ScheduledJobSpec
from cronwell.prescale import plan_pool
from cronwell.schedule import JobSchedule
from cronwell.settings import SchedulerSettings
from cronwell.store import dead, fences, leases, prescales, processes, runs, ui
from cronwell.ui.app import (
    ACT_VERB,
    ALL_NAMESPACES,
    CONFIG,
    CSRF_FIELD,
    TEMPLATES,
    VIEW_VERB,
    csrf_token,
    current_user,
    database,
    permitted,
    require,
    visible_namespaces,
)
from cronwell.workerpool import WorkerPoolSpec

T = TypeVar("T")

PAGE_MAX = 100
PAGE_DEFAULT = 50
# A process silent for longer is shown as such (as `cronwell status` does).
PROCESS_TTL_SECONDS = 15
NEXT_INSTANTS = 10
JOB_RUNS = 25
LAG_WINDOWS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}
"""`?window=` of the job page's start-lag histogram."""
CHART_HEIGHT = 100
BAR_WIDTH = 40


@dataclass(frozen=True)
class Bar:
    """One bar of the start-lag chart, in SVG user units (attributes, not CSS: the CSP
    forbids style attributes)."""

    label: str
    count: int
    x: int
    y: int
    height: int


@dataclass(frozen=True)
class LagChart:
    """The job page's start-lag histogram, ready for its SVG."""

    runs: int
    p50: float | None
    p99: float | None
    bars: list[Bar]
    width: int
    height: int


def _secs(s: float) -> str:
    return f"{s * 1000:g} ms" if s < 1 else f"{s:g} s"


def lag_chart(h: ui.LagHistogram) -> LagChart:
    """Bars scaled to the fullest bucket, labelled with their lower edge."""
    top = max(h.buckets, default=0) or 1
    labels = [f"< {_secs(ui.LAG_EDGES[0])}"] + [f"≥ {_secs(e)}" for e in ui.LAG_EDGES]
    bars = []
    for i, (label, n) in enumerate(zip(labels, h.buckets, strict=True)):
        height = round(CHART_HEIGHT * n / top)
        bars.append(Bar(label, n, i * BAR_WIDTH, CHART_HEIGHT - height, height))
    return LagChart(h.runs, h.p50, h.p99, bars, BAR_WIDTH * len(bars), CHART_HEIGHT)


def render(request: web.Request, template: str, **context: Any) -> web.Response:
    user = current_user(request)
    html = (
        request.app[TEMPLATES]
        .get_template(template)
        .render(
            allow_actions=request.app[CONFIG].allow_actions,
            user=user.name if user else None,
            **context,
        )
    )
    return web.Response(text=html, content_type="text/html")


def _text(request: web.Request, key: str) -> str | None:
    value = request.query.get(key, "").strip()
    if len(value) > 253:
        raise web.HTTPBadRequest(reason=f"{key} is too long")
    return value or None


def page_size(request: web.Request) -> int:
    """`?limit=` clamped to 1..PAGE_MAX; not a number: 400."""
    raw = request.query.get("limit")
    if raw is None:
        return PAGE_DEFAULT
    try:
        return max(1, min(PAGE_MAX, int(raw)))
    except ValueError:
        raise web.HTTPBadRequest(reason="limit must be a number") from None


def next_page(
    rows: list[T], limit: int, filters: dict[str, str | None], cursor: Callable[[T], str]
) -> tuple[list[T], dict[str, str] | None]:
    """The page (`rows` was read with limit + 1) and the query of the next one, if any: the
    filters plus `after` = the cursor of the page's last row."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    query = {k: v for k, v in filters.items() if v}
    return rows, query | {"after": cursor(rows[-1]), "limit": str(limit)}


def _choice(request: web.Request, key: str, allowed: Iterable[str]) -> str | None:
    """`?key=` if it is one of `allowed`; anything else: 400."""
    value = _text(request, key)
    if value is not None and value not in allowed:
        raise web.HTTPBadRequest(reason=f"{key} must be one of {', '.join(allowed)}")
    return value


_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def label_filter(request: web.Request) -> tuple[str | None, dict[str, str] | None]:
    """`?label=key=value` (a Kubernetes label key and value); any other shape: 400."""
    raw = _text(request, "label")
    if raw is None:
        return None, None
    key, sep, value = raw.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
        raise web.HTTPBadRequest(reason="label must be key=value (a Kubernetes label)")
    return raw, {key: value}


def _aware(raw: str) -> datetime:
    """An ISO 8601 instant with its offset (`Z` for UTC); ValueError otherwise: a wall
    time without a zone would mean a different instant to each viewer."""
    when = datetime.fromisoformat(raw)
    if when.tzinfo is None:
        raise ValueError(raw)
    return when


def job_cursor(request: web.Request, sort: str) -> ui.JobCursor | None:
    """`?after=<namespace>/<name>` (name order) or `<sort key>~<namespace>/<name>` (the
    key an ISO instant, `none` for no next run, `never` for never run); else 400."""
    raw = _text(request, "after")
    if raw is None:
        return None
    key: str | None = None
    if sort != "name":
        at, sep, raw = raw.partition("~")
        try:
            if not sep:
                raise ValueError(at)
            if at == ("none" if sort == "next_run" else "never"):
                key = "infinity" if sort == "next_run" else "-infinity"
            else:
                key = _aware(at).isoformat()
        except ValueError:
            raise web.HTTPBadRequest(
                reason="after must be <ISO instant with offset>~<namespace>/<name>"
            ) from None
    namespace, sep, name = raw.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise web.HTTPBadRequest(reason="after must end with <namespace>/<name>")
    return ui.JobCursor(namespace, name, key)


def _job_cursor_of(sort: str) -> Callable[[ui.JobRow], str]:
    """The `after` value of a row in the `sort` order (what job_cursor parses back)."""

    def cursor(row: ui.JobRow) -> str:
        ref = f"{row.namespace}/{row.name}"
        if sort == "next_run":
            return f"{row.next_run_at.isoformat() if row.next_run_at else 'none'}~{ref}"
        if sort == "last_run":
            return f"{row.last_run_at.isoformat() if row.last_run_at else 'never'}~{ref}"
        return ref

    return cursor


async def jobs_page(request: web.Request) -> web.Response:
    """Live jobs, filtered by namespace, pool, text, state and label, in the chosen order,
    one keyset page at a time."""
    limit = page_size(request)
    filters = {k: _text(request, k) for k in ("namespace", "pool", "text")}
    filters["state"] = _choice(request, "state", ui.JOB_STATES)
    filters["label"], labels = label_filter(request)
    sort = _choice(request, "sort", ui.JOB_SORTS) or "name"
    rows = await ui.job_page(
        database(request),
        namespaces=await visible_namespaces(request),
        namespace=filters["namespace"],
        pool=filters["pool"],
        text=filters["text"],
        state=filters["state"],
        labels=labels,
        sort=sort,
        after=job_cursor(request, sort),
        limit=limit + 1,
    )
    filters["sort"] = sort if sort != "name" else None
    rows, next_query = next_page(rows, limit, filters, _job_cursor_of(sort))
    return render(
        request,
        "jobs.html",
        jobs=rows,
        filters=filters,
        next_query=next_query,
        states=ui.JOB_STATES,
        sorts=list(ui.JOB_SORTS),
        sort=sort,
    )


async def status_page(request: web.Request) -> web.Response:
    """What `cronwell status` prints: durability and fence epoch, partition owners, live
    processes, occurrences by state (the same store functions); and the backlog per pool,
    the workers' load, the retention and the tables' sizes. Aggregates of every namespace:
    with authentication, only for a cluster-wide `list` grant."""
    await require(request, VIEW_VERB, ALL_NAMESPACES)
    db = database(request)
    # Liveness is heartbeats against now(): the primary's, not a lagging copy's.
    parts = await leases.list_all(db.primary)
    owners: dict[str, list[int]] = {}
    for p in parts:
        owners.setdefault(p.holder if p.live and p.holder else "(unowned)", []).append(p.partition)
    return render(
        request,
        "status.html",
        durability=(await fences.durability(db)).describe(),
        epoch=await fences.epoch(db),
        partition_count=len(parts),
        owners=sorted(owners.items()),
        procs=await processes.list_all(db.primary, ttl_seconds=PROCESS_TTL_SECONDS),
        counts=await ui.occurrence_counts(db),
        backlog=await ui.backlog(db),
        backlog_cap=ui.BACKLOG_CAP,
        sizes=await ui.table_sizes(db),
        retention=SchedulerSettings(),
        oldest_finished=await ui.oldest_finished(db),
    )


DEAD_DONE = ("replayed", "discarded")
"""Query parameters the dead-letter actions redirect with: how many they changed."""


def _count(raw: str | None, what: str) -> int | None:
    """A non-negative count from a query or form field; anything else: 400."""
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 9:
        raise web.HTTPBadRequest(reason=f"{what} must be a non-negative number")
    return int(raw)


def _dead_filters(request: web.Request) -> dict[str, str | None]:
    return {"namespace": _text(request, "namespace"), "job": _text(request, "job")}


async def dead_page(request: web.Request) -> web.Response:
    """Dead-lettered occurrences the viewer may see, newest first (filtered by namespace and
    job name), with Replay/Discard on those they may update; after an action, what it did
    (from the redirect's query)."""
    filters = _dead_filters(request)
    done = {k: n for k in DEAD_DONE if (n := _count(request.query.get(k), k)) is not None}
    config = request.app[CONFIG]
    rows = await ui.dead_page(
        database(request),
        namespaces=await visible_namespaces(request),
        namespace=filters["namespace"],
        name=filters["job"],
        limit=page_size(request),
    )
    return render(
        request,
        "dead.html",
        rows=rows,
        actionable=await permitted(request, ACT_VERB, (r.namespace for r in rows))
        if config.allow_actions
        else None,
        bulk_needs_namespace=current_user(request) is not None and not filters["namespace"],
        filters=filters,
        query={k: v for k, v in filters.items() if v},
        done=done,
        csrf_token=csrf_token(request),
        csrf_field=CSRF_FIELD,
    )


def _back_to_dead(form_filters: dict[str, str | None], **done: int) -> web.HTTPSeeOther:
    query = {k: v for k, v in form_filters.items() if v} | {k: str(v) for k, v in done.items()}
    return web.HTTPSeeOther("/dead" + ("?" + urlencode(query) if query else ""))


def _form_text(form: Mapping[str, object], key: str, limit: int = 253) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise web.HTTPBadRequest(reason=f"{key} is too long")
    return value.strip() or None


def _form_filters(form: Mapping[str, object]) -> dict[str, str | None]:
    """The /dead filter a form carries (to redirect back to the same view)."""
    return {"namespace": _form_text(form, "namespace"), "job": _form_text(form, "job")}


def _form_key(form: Mapping[str, object]) -> str:
    key = _form_text(form, "key", 1024)
    if key is None:
        raise web.HTTPBadRequest(reason="key is required")
    return key


async def _dead_target(request: web.Request, form: Mapping[str, object]) -> tuple[str, str]:
    """The dead key a form names and its job's namespace, where an action on it is decided:
    404 unless the user may see it, then (with authentication) 403 unless they may update
    ScheduledJobs in that namespace."""
    key = _form_key(form)
    db = database(request)
    namespace = await ui.dead_namespace(db, key=key, namespaces=await visible_namespaces(request))
    if namespace is None:
        raise web.HTTPNotFound(reason="No dead occurrence with that key")
    await require(request, ACT_VERB, namespace)
    return key, namespace


async def dead_replay(request: web.Request) -> web.Response:
    """POST (guarded by app.guard): one dead key back to pending under the same key, as
    `cronwell dlq replay KEY` does (Ambiguous ones are not replayed from here)."""
    form = await request.post()
    key, namespace = await _dead_target(request, form)
    replayed = await dispatch.replay_dead(database(request), key=key, namespace=namespace)
    if not replayed:
        raise web.HTTPNotFound(reason="No replayable dead occurrence with that key")
    raise _back_to_dead(_form_filters(form), replayed=len(replayed))


async def dead_discard(request: web.Request) -> web.Response:
    """POST (guarded): delete one dead key and its attempts, as `cronwell dlq discard KEY`."""
    form = await request.post()
    key, namespace = await _dead_target(request, form)
    gone = await dead.discard(database(request), key=key, namespace=namespace, name=None)
    if not gone:
        raise web.HTTPNotFound(reason="No dead occurrence with that key")
    raise _back_to_dead(_form_filters(form), discarded=len(gone))


BULK_ACTIONS = ("replay", "discard")


async def _bulk_allowed(request: web.Request, namespace: str | None) -> None:
    """With authentication a bulk action stays inside one namespace where the user may
    update ScheduledJobs: its filter must name it (400 without, 403 if not allowed there).
    Nothing to check without authentication."""
    if current_user(request) is None:
        return
    if namespace is None:
        raise web.HTTPBadRequest(
            reason="With --auth kubernetes, act on all matching dead letters of one namespace: "
            "filter by namespace first"
        )
    await require(request, ACT_VERB, namespace)


async def dead_confirm(request: web.Request) -> web.Response:
    """GET: how many dead letters a bulk replay or discard of the current filter would
    change, and the form that does it (carrying that count: the POST refuses if it moved)."""
    if not request.app[CONFIG].allow_actions:
        raise web.HTTPForbidden(reason="Read-only dashboard (start it with --allow-actions)")
    action = request.query.get("action")
    if action not in BULK_ACTIONS:
        raise web.HTTPBadRequest(reason="action must be replay or discard")
    filters = _dead_filters(request)
    await _bulk_allowed(request, filters["namespace"])
    counts = await dead.count(
        database(request), namespace=filters["namespace"], name=filters["job"]
    )
    return render(
        request,
        "dead_confirm.html",
        action=action,
        filters=filters,
        query={k: v for k, v in filters.items() if v},
        counts=counts,
        expect=counts.replayable if action == "replay" else counts.total,
        csrf_token=csrf_token(request),
        csrf_field=CSRF_FIELD,
    )


async def _bulk_form(request: web.Request) -> tuple[dict[str, str | None], int]:
    """The filter and confirmed count of a bulk action's form, once the user may act on it."""
    form = await request.post()
    filters = _form_filters(form)
    await _bulk_allowed(request, filters["namespace"])
    raw = form.get("expect")
    expect = _count(raw if isinstance(raw, str) else None, "expect")
    if expect is None:
        raise web.HTTPBadRequest(reason="expect (the confirmed count) is required")
    return filters, expect


def _changed(e: dead.CountChanged) -> web.HTTPConflict:
    return web.HTTPConflict(
        reason=f"{e.found} dead letter(s) match now, not the {e.expected} confirmed: "
        "nothing was changed; review and confirm again"
    )


async def dead_replay_all(request: web.Request) -> web.Response:
    """POST (guarded): every replayable dead letter of the filter back to pending, as
    `dead.replay` does per key (Ambiguous ones and deleted jobs' skipped); refused (409,
    nothing done) when their number is not the one confirmed."""
    filters, expect = await _bulk_form(request)
    try:
        rows = await dispatch.replay_dead(
            database(request),
            namespace=filters["namespace"],
            name=filters["job"],
            expect=expect,
        )
    except dead.CountChanged as e:
        raise _changed(e) from None
    raise _back_to_dead(filters, replayed=len(rows))


async def dead_discard_all(request: web.Request) -> web.Response:
    """POST (guarded): delete every dead letter of the filter with its attempts; refused
    (409, nothing deleted) when their number is not the one confirmed."""
    filters, expect = await _bulk_form(request)
    try:
        gone = await dead.discard(
            database(request),
            key=None,
            namespace=filters["namespace"],
            name=filters["job"],
            expect=expect,
        )
    except dead.CountChanged as e:
        raise _changed(e) from None
    raise _back_to_dead(filters, discarded=len(gone))


async def job_page(request: web.Request) -> web.Response:
    """One job: its spec summary, the next instants of its schedule (the scheduler's own
    engine), its recent runs, and with --allow-actions the forms of ui/actions.py. A
    namespace the user may not see: 403 (whether or not the job exists); unknown job: 404."""
    from cronwell.ui import actions  # it imports this module's helpers

    db = database(request)
    namespace = request.match_info["namespace"]
    await require(request, VIEW_VERB, namespace)
    job = await ui.job_get(db, namespace=namespace, name=request.match_info["name"])
    if job is None:
        raise web.HTTPNotFound(reason="No such job")
    window = _choice(request, "window", LAG_WINDOWS) or "24h"
    spec = ScheduledJobSpec.model_validate(job.spec)
    sched = JobSchedule.from_spec(job.id, spec)
    upcoming = list(itertools.islice(sched.iter_from(datetime.now(UTC)), NEXT_INSTANTS))
    return render(
        request,
        "job.html",
        job=job,
        zone=spec.time_zone or "UTC",
        history=(spec.successful_jobs_history_limit, spec.failed_jobs_history_limit),
        upcoming=upcoming,
        runs=await runs.list_for_job(db, job_id=job.id, state=None, limit=JOB_RUNS),
        windows=list(LAG_WINDOWS),
        window=window,
        lag=lag_chart(
            await ui.lag_histogram(db, job_id=job.id, window_seconds=LAG_WINDOWS[window])
        ),
        **await actions.page_context(request, job),
    )


def run_cursor(request: web.Request) -> tuple[datetime, int] | None:
    """`?after=<scheduled_for ISO>~<id>`; any other shape: 400."""
    raw = _text(request, "after")
    if raw is None:
        return None
    at, sep, ident = raw.rpartition("~")
    try:
        if not sep:
            raise ValueError(raw)
        return _aware(at), int(ident)
    except ValueError:
        raise web.HTTPBadRequest(reason="after must be <ISO instant with offset>~<id>") from None


def _instant(request: web.Request, key: str) -> datetime | None:
    """`?key=` as an ISO instant with an offset; anything else: 400."""
    raw = _text(request, key)
    try:
        return None if raw is None else _aware(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            reason=f"{key} must be an ISO instant with an offset, e.g. 2026-12-04T03:00:00Z"
        ) from None


def run_window(request: web.Request) -> tuple[datetime | None, datetime | None]:
    """The runs' window of nominal instants [since, until): `?window=` (1h, 24h, 7d: the
    last one, sliding with each refresh) or `?since=` / `?until=`; both kinds, or since
    not before until: 400."""
    window = _choice(request, "window", LAG_WINDOWS)
    since, until = _instant(request, "since"), _instant(request, "until")
    if window is not None:
        if since is not None or until is not None:
            raise web.HTTPBadRequest(reason="give window or since/until, not both")
        return datetime.now(UTC) - timedelta(seconds=LAG_WINDOWS[window]), None
    if since is not None and until is not None and since >= until:
        raise web.HTTPBadRequest(reason="since must be before until")
    return since, until


REFRESH_SECONDS = (0, 2, 5, 15, 60)
"""The runs view's refresh intervals (0: off); static/app.js keeps the choice."""
RUN_FILTERS = ("namespace", "job", "state", "pool", "window", "since", "until")
"""The runs view's query parameters besides the page's (what its links carry on)."""


async def _runs(request: web.Request) -> dict[str, Any]:
    limit = page_size(request)
    since, until = run_window(request)
    filters = {k: _text(request, k) for k in RUN_FILTERS}
    filters["state"] = _choice(request, "state", ui.RUN_STATES)
    rows = await ui.run_page(
        database(request),
        namespaces=await visible_namespaces(request),
        namespace=filters["namespace"],
        name=filters["job"],
        state=filters["state"],
        pool=filters["pool"],
        since=since,
        until=until,
        after=run_cursor(request),
        limit=limit + 1,
    )
    rows, next_query = next_page(
        rows, limit, filters, lambda last: f"{last.scheduled_for.isoformat()}~{last.id}"
    )
    query = {k: v for k, v in filters.items() if v}
    fragment = dict(query)
    if "after" in request.query:
        fragment["after"] = request.query["after"]
    return {"runs": rows, "filters": filters, "next_query": next_query, "fragment": fragment}


async def runs_page(request: web.Request) -> web.Response:
    """Recent runs, filtered by namespace, job, state, pool and time window, one keyset page
    at a time; the table refreshes itself from runs_fragment every few seconds (static/app.js)."""
    return render(
        request,
        "runs.html",
        windows=list(LAG_WINDOWS),
        states=ui.RUN_STATES,
        refresh_choices=REFRESH_SECONDS,
        **await _runs(request),
    )


async def runs_fragment(request: web.Request) -> web.Response:
    """The runs table alone, for the page's periodic refresh."""
    return render(request, "_runs_table.html", **await _runs(request))


FORECAST_HORIZON_SECONDS = 3600.0
"""The forecast view looks one hour ahead, per second (as the operator's pre-scaler does)."""
FORECAST_ROW_SECONDS = 60
"""The table fallback's rows: one per minute."""
BURST_ROWS = 200
"""Instants with due occurrences listed (the rest are counted, not shown)."""
PRESCALE_ROWS = 20
"""Recent pre-scales shown per pool (newest first, within the store-wide retention)."""
# query parameter -> (WorkerPool spec field, type): the settings the plan is made with.
POOL_PARAMS: dict[str, tuple[str, type[int] | type[float]]] = {
    "slo": ("startSLOSeconds", float),
    "concurrency_per_replica": ("concurrencyPerReplica", int),
    "min_replicas": ("minReplicas", int),
    "max_replicas": ("maxReplicas", int),
    "lead_time": ("leadTimeSeconds", int),
    "scale_down_delay": ("scaleDownDelaySeconds", int),
}


def pool_spec(request: web.Request) -> WorkerPoolSpec:
    """The WorkerPool settings to plan with, from the query (unset: the WorkerPool
    defaults): the dashboard reads the store, not the cluster's WorkerPools. Bad: 400."""
    doc: dict[str, Any] = {"scaleTargetRef": {"name": "-"}}
    for param, (name, kind) in POOL_PARAMS.items():
        raw = request.query.get(param, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
            if not math.isfinite(value):
                raise ValueError(raw)
        except ValueError:
            raise web.HTTPBadRequest(reason=f"{param} must be a number") from None
        doc[name] = value
    try:
        return WorkerPoolSpec.model_validate(doc)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "pool settings"
        raise web.HTTPBadRequest(reason=f"{where}: {first['msg']}") from None


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(UTC).isoformat() if t is not None else None


def _prescale(r: prescales.RecentPreScale) -> dict[str, Any]:
    """A recorded pre-scale, JSON-ready: when the pods were Ready against the burst."""
    return {
        "namespace": r.namespace,
        "workerpool": r.workerpool,
        "pool": r.pool,
        "scaled_at": _iso(r.scaled_at),
        "replicas": r.replicas,
        "burst_at": _iso(r.burst_at),
        "ready_at": _iso(r.ready_at),
        "lead_seconds": r.lead_seconds,
        "landed_before_burst": r.landed_before_burst,
    }


def _overridden(request: web.Request) -> bool:
    return any(request.query.get(p, "").strip() for p in POOL_PARAMS)


async def _cluster_pools(request: web.Request) -> dict[str, WorkerPoolSpec] | None:
    """The cluster's WorkerPools by pool, unless the query sets the plan's settings (then
    every pool is planned with those) or the dashboard has no cluster (None)."""
    found = request.app[CONFIG].workerpools
    if found is None or _overridden(request):
        return None
    return await found.get()


def _settings(spec: WorkerPoolSpec) -> dict[str, Any]:
    """The settings a plan is made with, JSON-ready (the WorkerPool's field names)."""
    return spec.model_dump(
        mode="json",
        by_alias=True,
        include={
            "start_slo_seconds",
            "concurrency_per_replica",
            "min_replicas",
            "max_replicas",
            "lead_time_seconds",
            "scale_down_delay_seconds",
        },
    )


async def forecast_data(request: web.Request) -> dict[str, Any]:
    """The next hour per pool as `cronwell forecast` and the pre-scaler compute it (the same
    Forecaster and prescale.plan_pool): due occurrences, concurrency and planned replicas
    per second, the instants with occurrences due, and the next burst; and after the fact,
    each pool's recent pre-scales as the operator recorded them. JSON-ready. Pools
    serve every namespace, so this adds them all up: with authentication, only for a
    cluster-wide `list` grant."""
    await require(request, VIEW_VERB, ALL_NAMESPACES)
    spec = pool_spec(request)
    only = _text(request, "pool")
    config = request.app[CONFIG]
    cluster = await _cluster_pools(request)
    async with config.forecast_lock:
        forecasts = await config.forecaster.forecast(
            database(request),
            FORECAST_HORIZON_SECONDS,
            pool=only,
            pools=cluster or {},
            slo_seconds=spec.start_slo_seconds,
        )
    pools: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    start: datetime | None = None
    resolution = 1.0
    for name, pf in sorted(forecasts.items()):
        start, resolution = pf.start, pf.resolution
        pool_settings = (cluster or {}).get(name)
        pp = plan_pool(pf, pool_settings or spec, 0.0)
        due, series, conc = pf.due(), pp.plan.series, pf.concurrency
        rows = [
            {
                "time": _iso(w.time),
                "due": w.due,
                "concurrency": w.concurrency,
                "replicas": w.replicas,
            }
            for w in windows(pf, series, FORECAST_ROW_SECONDS)
        ]
        bursts += [
            {
                "time": _iso(pf.bucket_time(i)),
                "pool": name,
                "due": k,
                "need": pp.plan.need[i],
                "replicas": series[i],
            }
            for i, k in enumerate(due)
            if k
        ]
        burst = pp.burst
        pools.append(
            {
                "pool": name,
                "backlog": pf.backlog,
                "due_total": sum(due),
                "replicas_now": pp.planned,
                "change_at": _iso(pp.change_at),
                "next_burst": None
                if burst is None
                else {"time": _iso(burst.time), "size": burst.size, "replicas": burst.replicas},
                "due": due,
                "concurrency": conc,
                "replicas": series,
                "rows": rows,
                "settings": None if pool_settings is None else _settings(pool_settings),
            }
        )
    bursts.sort(key=lambda b: (b["time"], b["pool"]))
    recent = await prescales.recent(
        database(request),
        within_seconds=SchedulerSettings().retention_seconds,
        per_pool=PRESCALE_ROWS,
        pool=only,
    )
    return {
        "start": _iso(start),
        "start_epoch": start.timestamp() if start is not None else None,
        "resolution": resolution,
        "horizon_seconds": FORECAST_HORIZON_SECONDS,
        "pool_settings": _settings(spec),
        "settings_from": "query"
        if _overridden(request)
        else "cluster"
        if cluster is not None
        else "defaults",
        "pools": pools,
        "bursts": bursts,
        "prescales": [_prescale(r) for r in recent],
    }


async def forecast_page(request: web.Request) -> web.Response:
    """The next hour's demand per pool: a chart (static/forecast.js draws the JSON block
    with uPlot), the instants with occurrences due, the same numbers as tables, and each
    pool's recent pre-scales (when their pods were Ready against the burst)."""
    data = await forecast_data(request)
    chart = {k: v for k, v in data.items() if k not in ("bursts", "prescales")}
    chart["pools"] = [{k: v for k, v in p.items() if k != "rows"} for p in data["pools"]]
    params = {p: request.query.get(p, "").strip() for p in ("pool", *POOL_PARAMS)}
    bursts = data["bursts"]
    return render(
        request,
        "forecast.html",
        data=data,
        chart=chart,
        params=params,
        query={k: v for k, v in params.items() if v},
        bursts=bursts[:BURST_ROWS],
        bursts_left_off=max(0, len(bursts) - BURST_ROWS),
        prescale_rows=PRESCALE_ROWS,
        retention_days=SchedulerSettings().retention_seconds / 86400,
    )


async def forecast_json(request: web.Request) -> web.Response:
    """The forecast view's numbers as JSON (same query parameters)."""
    return web.json_response(await forecast_data(request))
