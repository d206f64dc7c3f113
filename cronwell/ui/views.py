"""The dashboard's pages: parse and validate the query string (a bad value is a 400, never a
traceback), read the store's read model, render a template."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cronwell.store import ui
from cronwell.ui.app import CONFIG, TEMPLATES

PAGE_MAX = 100
PAGE_DEFAULT = 50


def render(request: web.Request, template: str, **context: Any) -> web.Response:
    html = (
        request.app[TEMPLATES]
        .get_template(template)
        .render(allow_actions=request.app[CONFIG].allow_actions, **context)
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
        namespace=filters["namespace"],
        pool=filters["pool"],
        text=filters["text"],
        after=job_cursor(request),
        limit=limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    next_query = None
    if more:
        last = rows[-1]
        query = {k: v for k, v in filters.items() if v}
        query |= {"after": f"{last.namespace}/{last.name}", "limit": str(limit)}
        next_query = query
    return render(request, "jobs.html", jobs=rows, filters=filters, next_query=next_query)
