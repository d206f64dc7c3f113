"""The dashboard's aiohttp app: routes, and the middleware every response passes through
(security headers, CSRF and read-only guard on every non-GET request, errors as plain
pages, never a traceback)."""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources

import jinja2
from aiohttp import web

from cronwell.cronexpr import load_zone
from cronwell.errors import DatabaseUnavailable
from cronwell.store.db import Database
from cronwell.ui import words

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class UiConfig:
    """What a request handler needs: the store, the mode and the per-process CSRF token."""

    db: Database
    allow_actions: bool = False
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


CONFIG = web.AppKey("config", UiConfig)
TEMPLATES = web.AppKey("templates", jinja2.Environment)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def in_zone(t: datetime, zone: str) -> str:
    """`t` as wall-clock time in the IANA `zone` (the job's), with the zone's abbreviation."""
    return t.astimezone(load_zone(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    """A plain page for a 4xx/5xx (no detail of the failure beyond `message`)."""
    html = request.app[TEMPLATES].get_template("error.html").render(status=status, message=message)
    return web.Response(status=status, text=html, content_type="text/html")


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse every state-changing request unless actions are allowed and the form carries
    the CSRF token; turn errors into plain pages; add the security headers to everything."""
    try:
        if request.method not in _SAFE_METHODS:
            response = await _guarded(request, handler)
        else:
            response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            e.headers.update(SECURITY_HEADERS)
            raise
        response = error_page(request, e.status, e.reason)
    except DatabaseUnavailable as e:  # an outage or a failover, not a bug: no traceback
        log.warning("dashboard request %s %s: %s", request.method, request.path, e)
        response = error_page(request, 503, "The database did not answer; try again shortly")
    except Exception:
        log.exception("dashboard request %s %s failed", request.method, request.path)
        response = error_page(request, 500, "Internal error")
    response.headers.update(SECURITY_HEADERS)
    return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    if not config.allow_actions:
        raise web.HTTPForbidden(reason="Read-only dashboard (start it with --allow-actions)")
    form = await request.post()
    token = form.get(CSRF_FIELD)
    if not isinstance(token, str) or not hmac.compare_digest(token, config.csrf_token):
        raise web.HTTPForbidden(reason="Missing or invalid CSRF token")
    return await handler(request)


async def robots(request: web.Request) -> web.Response:
    """No crawler indexes the dashboard."""
    return web.Response(text="User-agent: *\nDisallow: /\n", content_type="text/plain")


async def favicon(request: web.Request) -> web.Response:
    """Browsers ask for /favicon.ico whatever the page links: send them to the static one."""
    raise web.HTTPMovedPermanently("/static/favicon.svg")


def make_app(config: UiConfig) -> web.Application:
    """The dashboard app over `config.db` (routes from views.py, static files beside it)."""
    from cronwell.ui import views

    app = web.Application(middlewares=[guard])
    app[CONFIG] = config
    app[TEMPLATES] = jinja2.Environment(
        loader=jinja2.PackageLoader("cronwell.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    app[TEMPLATES].filters["in_zone"] = in_zone
    app[TEMPLATES].filters["in_words"] = words.describe
    static = resources.files("cronwell.ui") / "static"
    app.router.add_get("/", views.jobs_page)
    app.router.add_get("/jobs/{namespace}/{name}", views.job_page)
    app.router.add_get("/runs", views.runs_page)
    app.router.add_get("/runs/fragment", views.runs_fragment)
    app.router.add_get("/dead", views.dead_page)
    app.router.add_get("/dead/confirm", views.dead_confirm)
    app.router.add_post("/dead/replay", views.dead_replay)
    app.router.add_post("/dead/discard", views.dead_discard)
    app.router.add_post("/dead/replay-all", views.dead_replay_all)
    app.router.add_post("/dead/discard-all", views.dead_discard_all)
    app.router.add_get("/status", views.status_page)
    app.router.add_get("/forecast", views.forecast_page)
    app.router.add_get("/forecast.json", views.forecast_json)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static", str(static))
    return app
