"""The dashboard's pages: parse and validate the query string (a bad value is a 400, never a
traceback), read the store's read model, render a template."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web

from cronwell.models import ScheduledJobSpec
from cronwell.schedule import JobSchedule
from cronwell.store import dead, fences, gauges, leases, processes, runs, ui
from cronwell.ui.app import (
    ACT_VERB,
    CONFIG,
    CSRF_FIELD,
    TEMPLATES,
    VIEW_VERB,
    current_user,
    require,
    visible_namespaces,
)

T = TypeVar("T")

PAGE_MAX = 100
PAGE_DEFAULT = 50
# A process silent for longer is shown as such (as `cronwell status` does).
PROCESS_TTL_SECONDS = 15
NEXT_INSTANTS = 10
JOB_RUNS = 25


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


def job_cursor(request: web.Request) -> tuple[str, str] | None:
    """`?after=<namespace>/<name>`; any other shape: 400."""
    raw = _text(request, "after")
    if raw is None:
        return None
    namespace, sep, name = raw.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise web.HTTPBadRequest(reason="after must be <namespace>/<name>")
    return namespace, name


async def jobs_page(request: web.Request) -> web.Response:
    """Live jobs, filtered by namespace, pool and text, one keyset page at a time."""
    limit = page_size(request)
    filters = {k: _text(request, k) for k in ("namespace", "pool", "text")}
    rows = await ui.job_page(
        request.app[CONFIG].db,
        namespaces=await visible_namespaces(request),
        namespace=filters["namespace"],
        pool=filters["pool"],
        text=filters["text"],
        after=job_cursor(request),
        limit=limit + 1,
    )
    rows, next_query = next_page(rows, limit, filters, lambda last: f"{last.namespace}/{last.name}")
    return render(request, "jobs.html", jobs=rows, filters=filters, next_query=next_query)


async def status_page(request: web.Request) -> web.Response:
    """What `cronwell status` prints: durability and fence epoch, partition owners, live
    processes, occurrences by state (the same store functions). Aggregates of every
    namespace: with authentication, shown to whoever may see at least one."""
    db = request.app[CONFIG].db
    if await visible_namespaces(request) == []:
        raise web.HTTPForbidden(reason="You may not list ScheduledJobs in any namespace")
    parts = await leases.list_all(db)
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
        procs=await processes.list_all(db, ttl_seconds=PROCESS_TTL_SECONDS),
        counts=await gauges.occurrence_counts(db),
    )


async def dead_page(request: web.Request) -> web.Response:
    """Dead-lettered occurrences, newest first (filtered by namespace and job name)."""
    namespace, name = _text(request, "namespace"), _text(request, "job")
    rows = await ui.dead_page(
        request.app[CONFIG].db,
        namespaces=await visible_namespaces(request),
        namespace=namespace,
        name=name,
        limit=page_size(request),
    )
    return render(
        request,
        "dead.html",
        rows=rows,
        filters={"namespace": namespace, "job": name},
        csrf_token=request.app[CONFIG].csrf_token,
        csrf_field=CSRF_FIELD,
    )


async def dead_replay(request: web.Request) -> web.Response:
    """POST (guarded by app.guard): one dead key back to pending under the same key, as
    `cronwell dead replay KEY` does. With authentication, only a key the user may see, and
    only if they may update ScheduledJobs in its namespace."""
    form = await request.post()
    key = form.get("key")
    if not isinstance(key, str) or not key or len(key) > 1024:
        raise web.HTTPBadRequest(reason="key is required")
    db = request.app[CONFIG].db
    namespace = await ui.dead_namespace(db, key=key, namespaces=await visible_namespaces(request))
    if namespace is None:
        raise web.HTTPNotFound(reason="No replayable dead occurrence with that key")
    await require(request, ACT_VERB, namespace)
    replayed = await dead.replay(
        db, key=key, namespace=namespace, name=None, include_ambiguous=False
    )
    if not replayed:
        raise web.HTTPNotFound(reason="No replayable dead occurrence with that key")
    raise web.HTTPSeeOther("/dead")


async def job_page(request: web.Request) -> web.Response:
    """One job: its spec summary, the next instants of its schedule (the scheduler's own
    engine), its recent runs. A namespace the user may not see: 403 (whether or not the job
    exists); unknown job: 404."""
    db = request.app[CONFIG].db
    namespace = request.match_info["namespace"]
    await require(request, VIEW_VERB, namespace)
    job = await ui.job_get(db, namespace=namespace, name=request.match_info["name"])
    if job is None:
        raise web.HTTPNotFound(reason="No such job")
    spec = ScheduledJobSpec.model_validate(job.spec)
    sched = JobSchedule.from_spec(job.id, spec)
    upcoming = list(itertools.islice(sched.iter_from(datetime.now(UTC)), NEXT_INSTANTS))
    return render(
        request,
        "job.html",
        job=job,
        zone=spec.time_zone or "UTC",
        upcoming=upcoming,
        runs=await runs.list_for_job(db, job_id=job.id, state=None, limit=JOB_RUNS),
    )


def run_cursor(request: web.Request) -> tuple[datetime, int] | None:
    """`?after=<scheduled_for ISO>~<id>`; any other shape: 400."""
    raw = _text(request, "after")
    if raw is None:
        return None
    at, sep, ident = raw.rpartition("~")
    try:
        when = datetime.fromisoformat(at)
        if not sep or when.tzinfo is None:
            raise ValueError(raw)
        return when, int(ident)
    except ValueError:
        raise web.HTTPBadRequest(reason="after must be <ISO instant with offset>~<id>") from None


async def _runs(request: web.Request) -> dict[str, Any]:
    limit = page_size(request)
    filters = {k: _text(request, k) for k in ("namespace", "job", "state")}
    rows = await ui.run_page(
        request.app[CONFIG].db,
        namespaces=await visible_namespaces(request),
        namespace=filters["namespace"],
        name=filters["job"],
        state=filters["state"],
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
    """Recent runs, filtered by namespace, job and state, one keyset page at a time; the
    table refreshes itself from runs_fragment every few seconds (static/app.js)."""
    return render(request, "runs.html", **await _runs(request))


async def runs_fragment(request: web.Request) -> web.Response:
    """The runs table alone, for the page's periodic refresh."""
    return render(request, "_runs_table.html", **await _runs(request))
