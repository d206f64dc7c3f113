"""The dashboard's aiohttp app: routes, and the middleware every response passes through
(authentication when enabled, security headers, CSRF and read-only guard on every non-GET
request, errors as plain pages, never a traceback), and the per-namespace access checks
the views call."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources

import jinja2
from aiohttp import web
from kubernetes import client

from cronwell.cronexpr import load_zone
from cronwell.errors import DatabaseUnavailable
from cronwell.fleet_forecast import Forecaster
from cronwell.store import ui
from cronwell.store.db import Database
from cronwell.ui import words
from cronwell.ui.auth import MAX_TOKEN_LENGTH, KubeAuth, ReviewUnavailable, User
from cronwell.ui.workerpools import ClusterPools

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_FIELD = "csrf_token"
#: The health check: served without a token (the kubelet's probes have none).
HEALTH_PATH = "/healthz"
#: Routes (by their resource's canonical path) served without a token: the health check,
#: and the package's own public files (scripts, styles, icon, robots.txt), the same in every
#: install, which browsers fetch without the page's credentials (as Argo serves its assets).
OPEN_RESOURCES = frozenset({HEALTH_PATH, "/robots.txt", "/favicon.ico", "/static"})
#: Verb on scheduledjobs that makes a namespace visible; the one that allows an action.
VIEW_VERB, ACT_VERB = "list", "update"
#: GET pages that prepare an action (their forms carry what the POST checks, e.g. the count
#: of dead letters a bulk replay changes): read on the primary, as the action will be.
PRIMARY_GETS = frozenset({"/dead/confirm", "/jobs/{namespace}/{name}/backfill"})
#: The `namespace` of `require` for a cluster-wide grant (a ClusterRoleBinding): what the
#: fleet-wide views need, since they add up every namespace.
ALL_NAMESPACES = ""


@dataclass(frozen=True)
class UiConfig:
    """What a request handler needs: the store, the mode, the CSRF token without
    authentication (random per process: `csrf_token` says what forms carry),
    with --auth kubernetes the API server's reviews (None: no authentication) and `kube`,
    the client the job actions patch ScheduledJobs with (None: no cluster, the actions
    change the store as the `cronwell` commands do)."""

    db: Database
    allow_actions: bool = False
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    auth: KubeAuth | None = None
    kube: client.ApiClient | None = None
    forecaster: Forecaster = field(default_factory=Forecaster)
    """One per process, as the operator keeps one: a forecast after the first reads only what
    changed (a new Forecaster per request fetched and derived every spec: seconds at 100k
    jobs)."""
    forecast_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """The forecaster's state is one tick's: one forecast at a time."""
    workerpools: ClusterPools | None = None
    """The cluster's WorkerPools the forecast plans with (from `kube` when not given)."""

    def __post_init__(self) -> None:
        if self.workerpools is None and self.kube is not None:
            object.__setattr__(self, "workerpools", ClusterPools(self.kube))


CONFIG = web.AppKey("config", UiConfig)
TEMPLATES = web.AppKey("templates", jinja2.Environment)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_USER = web.RequestKey("cronwell.user", User)
_CSRF = web.RequestKey("cronwell.csrf", str)
_VISIBLE = web.RequestKey("cronwell.visible", list[str])


def in_zone(t: datetime, zone: str) -> str:
    """`t` as wall-clock time in the IANA `zone` (the job's), with the zone's abbreviation."""
    return t.astimezone(load_zone(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    """A plain page for a 4xx/5xx (no detail of the failure beyond `message`)."""
    html = request.app[TEMPLATES].get_template("error.html").render(status=status, message=message)
    return web.Response(status=status, text=html, content_type="text/html")


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate every request but the health check (when enabled); refuse every
    state-changing request unless actions are allowed and the form carries the CSRF token;
    turn errors into plain pages; add the security headers to everything."""
    try:
        auth = request.app[CONFIG].auth
        if auth is not None and not is_open(request):
            request[_USER], request[_CSRF] = await _authenticate(request, auth)
        if request.method not in _SAFE_METHODS:
            response = await _guarded(request, handler)
        else:
            response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            e.headers.update(SECURITY_HEADERS)
            raise
        response = error_page(request, e.status, e.reason)
        if "WWW-Authenticate" in e.headers:
            response.headers["WWW-Authenticate"] = e.headers["WWW-Authenticate"]
    except DatabaseUnavailable as e:  # an outage or a failover, not a bug: no traceback
        log.warning("dashboard request %s %s: %s", request.method, request.path, e)
        response = error_page(request, 503, "The database did not answer; try again shortly")
    except ReviewUnavailable as e:
        log.warning("dashboard request %s %s: %s", request.method, request.path, e)
        response = error_page(request, 503, "The Kubernetes API server cannot check access now")
    except Exception:
        log.exception("dashboard request %s %s failed", request.method, request.path)
        response = error_page(request, 500, "Internal error")
    response.headers.update(SECURITY_HEADERS)
    return response


def _unauthorized(reason: str, error: str | None = None) -> web.HTTPUnauthorized:
    challenge = f'Bearer realm="cronwell", error="{error}"' if error else 'Bearer realm="cronwell"'
    return web.HTTPUnauthorized(reason=reason, headers={"WWW-Authenticate": challenge})


async def _authenticate(request: web.Request, auth: KubeAuth) -> tuple[User, str]:
    """The user of the request's bearer token (a TokenReview) and the CSRF token of its
    forms; 401 without a valid one."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("A Kubernetes bearer token is required (Authorization: Bearer)")
    if len(token) > MAX_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
        raise _unauthorized("Invalid bearer token", "invalid_token")
    user = await auth.authenticate(token)
    if user is None:
        raise _unauthorized("Invalid or expired bearer token", "invalid_token")
    return user, csrf_of(token)


def csrf_of(bearer: str) -> str:
    """With --auth kubernetes, a form's CSRF token is derived from the bearer token (a
    labelled SHA-256; the bearer token never appears in a page): every replica behind a
    Service accepts a form another rendered (a random token per process refused them), and
    a token is good only with the bearer token it came from."""
    return hashlib.sha256(b"cronwell-ui-csrf\0" + bearer.encode()).hexdigest()


def csrf_token(request: web.Request) -> str:
    """The CSRF token the request's forms carry and its POST must send back: derived from
    the bearer token with authentication, random per process without."""
    return request.get(_CSRF) or request.app[CONFIG].csrf_token


def is_open(request: web.Request) -> bool:
    """Whether the request's route is one of OPEN_RESOURCES (decided by the route it
    matched, not by its path's text, so no spelling of a path reaches another route)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in OPEN_RESOURCES


def current_user(request: web.Request) -> User | None:
    """The authenticated user (None without authentication)."""
    return request.get(_USER)


def database(request: web.Request) -> Database:
    """The Database a request uses: a page (GET) reads `db.reads`, the read replica when
    one is configured (a page is a few seconds old anyway); an action (POST) and the pages
    that prepare one (PRIMARY_GETS), the primary."""
    db = request.app[CONFIG].db
    resource = request.match_info.route.resource
    prepares = resource is not None and resource.canonical in PRIMARY_GETS
    return db.reads if request.method in _SAFE_METHODS and not prepares else db


async def visible_namespaces(request: web.Request) -> list[str] | None:
    """The namespaces whose jobs, runs and dead letters the request may see, for the store's
    queries (None: all, without authentication). Asked once per request."""
    auth, user = request.app[CONFIG].auth, current_user(request)
    if auth is None or user is None:
        return None
    if _VISIBLE not in request:
        candidates = await ui.namespaces(database(request))
        request[_VISIBLE] = await auth.namespaces(user, candidates, VIEW_VERB)
    return request[_VISIBLE]


async def permitted(request: web.Request, verb: str, namespaces: Iterable[str]) -> set[str] | None:
    """Which of `namespaces` the request's user may `verb` scheduledjobs in (None: all,
    without authentication): to offer only the actions `require` would allow."""
    auth, user = request.app[CONFIG].auth, current_user(request)
    if auth is None or user is None:
        return None
    return set(await auth.namespaces(user, sorted(set(namespaces)), verb))


async def require(request: web.Request, verb: str, namespace: str) -> None:
    """403 unless the request's user may `verb` scheduledjobs in `namespace` (ALL_NAMESPACES:
    in every namespace, a cluster-wide grant); no-op without authentication."""
    auth, user = request.app[CONFIG].auth, current_user(request)
    if auth is None or user is None:
        return
    if not await auth.allowed(user, verb, namespace):
        where = f"namespace {namespace}" if namespace else "every namespace (a cluster-wide grant)"
        raise web.HTTPForbidden(reason=f"You may not {verb} ScheduledJobs in {where}")


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    if not config.allow_actions:
        raise web.HTTPForbidden(reason="Read-only dashboard (start it with --allow-actions)")
    form = await request.post()
    token = form.get(CSRF_FIELD)
    if not isinstance(token, str) or not hmac.compare_digest(token, csrf_token(request)):
        raise web.HTTPForbidden(reason="Missing or invalid CSRF token")
    return await handler(request)


async def healthz(request: web.Request) -> web.Response:
    """Liveness/readiness: the process serves (no token, no database)."""
    return web.Response(text="ok", content_type="text/plain")


async def robots(request: web.Request) -> web.Response:
    """No crawler indexes the dashboard."""
    return web.Response(text="User-agent: *\nDisallow: /\n", content_type="text/plain")


async def favicon(request: web.Request) -> web.Response:
    """Browsers ask for /favicon.ico whatever the page links: send them to the static one."""
    raise web.HTTPMovedPermanently("/static/favicon.svg")


def make_app(config: UiConfig) -> web.Application:
    """The dashboard app over `config.db` (routes from views.py, static files beside it)."""
    from cronwell.ui import actions, views

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
    app.router.add_post("/jobs/{namespace}/{name}/trigger", actions.trigger)
    app.router.add_post("/jobs/{namespace}/{name}/suspend", actions.suspend)
    app.router.add_post("/jobs/{namespace}/{name}/resume", actions.resume)
    app.router.add_get("/jobs/{namespace}/{name}/backfill", actions.backfill_confirm)
    app.router.add_post("/jobs/{namespace}/{name}/backfill", actions.backfill)
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
    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static", str(static))
    return app
