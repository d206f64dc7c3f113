"""The job page's actions: trigger now, suspend/resume, backfill a window.

Every one is a plain POST, so app.guard refuses it read-only or without the CSRF token, and
each asks `require(ACT_VERB)` in the job's namespace before anything else. Where the
change lands: with a Kubernetes client (`UiConfig.kube`, set by `--auth kubernetes`) a
trigger and spec.suspend are patched into the ScheduledJob, so the CR (GitOps, RBAC) stays
the source of truth and the operator reconciles it into the store; without one, the store
changes as `cronwell trigger/suspend/resume` change it. A backfill is a store operation in
both (as `cronwell backfill` is: the CR has no field for it)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cronwell import backfill as backfills
from cronwell import jobs, kubejson
from cronwell.cli.parse import parse_instant
from cronwell.errors import JobNotFound
from cronwell.models import GROUP, VERSION
from cronwell.store import ui
from cronwell.ui.app import ACT_VERB, CONFIG, CSRF_FIELD, csrf_token, database, require
from cronwell.ui.views import _count, _form_text, render

TRIGGER_ANNOTATION = f"{GROUP}/trigger"
"""The annotation the operator turns into one run per value (kopf_handlers.py)."""
MANUAL_REASON = "Manual"
"""suspended_reason of `cronwell suspend` (cli/jobs.py), and of a suspend from here."""
_TRIGGER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

SUSPENDED_BY = {
    None: "by its spec (spec.suspend: true)",
    MANUAL_REASON: "in the store by cronwell suspend or this dashboard (Manual)",
    jobs.PAUSE_REASON: "in the store by cronwell pause (Paused)",
    "SuspendedAfterFailures": "in the store after consecutive failures (SuspendedAfterFailures)",
}
DONE = {
    "triggered": "Triggered: one run is due now.",
    "already-triggered": "Already triggered by this form: nothing new was run.",
    "trigger-requested": "Trigger requested: the cronwell.dev/trigger annotation is set; "
    "the operator creates the run.",
    "suspended": "Suspended in the store (reason Manual, as cronwell suspend).",
    "resumed": "Resumed in the store (as cronwell resume).",
    "suspend-requested": "spec.suspend: true is written to the ScheduledJob; the operator "
    "suspends the job.",
    "resume-requested": "spec.suspend: false is written to the ScheduledJob; the operator "
    "resumes the job.",
}
"""`?done=` of the job page after an action: what it did."""


def suspended_by(reason: str | None) -> str:
    """Who suspended a job, from its stored reason (NULL: its spec)."""
    return SUSPENDED_BY.get(reason, f"in the store ({reason})")


def resume_path(request: web.Request, job: ui.JobDetail) -> str:
    """Where a resume must land: `spec` when the CR's spec.suspend holds the job (in a
    cluster), else `store` (standalone, or a suspension the store holds: Manual, Paused,
    after failures, which the CR's spec does not say and a spec patch would not lift)."""
    in_cluster = request.app[CONFIG].kube is not None
    return "spec" if in_cluster and job.suspended_reason is None else "store"


async def may_act(request: web.Request, namespace: str) -> bool:
    """Whether the action forms are worth rendering: actions allowed and, with
    authentication, the user may update ScheduledJobs in `namespace`."""
    if not request.app[CONFIG].allow_actions:
        return False
    try:
        await require(request, ACT_VERB, namespace)
    except web.HTTPForbidden:
        return False
    return True


async def page_context(request: web.Request, job: ui.JobDetail) -> dict[str, Any]:
    """What job.html needs for its action forms and the last action's message; a fresh
    trigger id per render, so submitting the same form twice runs the job once."""
    return {
        "may_act": await may_act(request, job.namespace),
        "suspended_by": suspended_by(job.suspended_reason) if job.suspended else None,
        "in_cluster": request.app[CONFIG].kube is not None,
        "resume_path": resume_path(request, job),
        "done": _done(request),
        "trigger_id": f"ui-{uuid.uuid4().hex}",
        "csrf_token": csrf_token(request),
        "csrf_field": CSRF_FIELD,
    }


def _done(request: web.Request) -> str | None:
    done = request.query.get("done")
    if done is not None and done not in DONE:
        raise web.HTTPBadRequest(reason=f"done must be one of {', '.join(DONE)}")
    backfilled = _count(request.query.get("backfilled"), "backfilled")
    if backfilled is not None:
        return f"Backfilled: {backfilled} instant(s) of the window run now."
    return DONE[done] if done else None


async def _job(request: web.Request) -> ui.JobDetail:
    """The job of the URL, once the user may act in its namespace (403 before 404, so a
    namespace the user may not touch does not tell which jobs it has)."""
    namespace = request.match_info["namespace"]
    await require(request, ACT_VERB, namespace)
    job = await ui.job_get(database(request), namespace=namespace, name=request.match_info["name"])
    if job is None:
        raise web.HTTPNotFound(reason="No such job")
    return job


def _back(job: ui.JobDetail, **query: str | int) -> web.HTTPSeeOther:
    path = f"/jobs/{job.namespace}/{job.name}"
    return web.HTTPSeeOther(path + "?" + urlencode(query))


async def _patch_cr(request: web.Request, job: ui.JobDetail, patch: dict[str, Any]) -> None:
    """Merge-patch the job's ScheduledJob with the dashboard's own credentials (the user's
    right to do so was checked by `require`). The API server's refusals are 4xx/5xx pages."""
    api = request.app[CONFIG].kube
    assert api is not None
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{job.namespace}/scheduledjobs/{job.name}"

    def call() -> dict[str, Any]:
        return kubejson.request(
            api,
            "PATCH",
            path,
            body=patch,
            content_type="application/merge-patch+json",
        )

    try:
        await asyncio.to_thread(call)
    except ApiException as e:
        if e.status == 404:
            raise web.HTTPNotFound(
                reason=f"No ScheduledJob {job.namespace}/{job.name} in the cluster "
                "(the job is only in the store)"
            ) from None
        message = kubejson.api_message(e) or e.reason
        raise web.HTTPBadGateway(
            reason=f"The Kubernetes API server refused the change: HTTP {e.status} {message}"
        ) from None
    except (HTTPError, OSError):
        raise web.HTTPServiceUnavailable(
            reason="The Kubernetes API server cannot be reached now; try again shortly"
        ) from None


async def trigger(request: web.Request) -> web.Response:
    """POST (guarded): run the job now, once per the form's trigger id: in a cluster by
    setting the cronwell.dev/trigger annotation (as `kubectl cronwell trigger`), else
    `jobs.trigger_job` (as `cronwell trigger --id`)."""
    job = await _job(request)
    form = await request.post()
    trigger_id = _form_text(form, "trigger_id")
    if trigger_id is None or not _TRIGGER_ID.match(trigger_id):
        raise web.HTTPBadRequest(reason="trigger_id must be 1-63 letters, digits, '.', '_', '-'")
    if request.app[CONFIG].kube is not None:
        await _patch_cr(
            request, job, {"metadata": {"annotations": {TRIGGER_ANNOTATION: trigger_id}}}
        )
        raise _back(job, done="trigger-requested")
    try:
        _, created = await jobs.trigger_job(
            database(request), namespace=job.namespace, name=job.name, trigger_id=trigger_id
        )
    except JobNotFound:
        raise web.HTTPNotFound(reason="No such job") from None
    raise _back(job, done="triggered" if created else "already-triggered")


async def _set_suspended(request: web.Request, suspended: bool) -> web.Response:
    job = await _job(request)
    # A suspend goes to the CR in a cluster; a resume to where the suspension is held.
    on_spec = request.app[CONFIG].kube is not None and (
        suspended or resume_path(request, job) == "spec"
    )
    if on_spec:
        await _patch_cr(request, job, {"spec": {"suspend": suspended}})
        raise _back(job, done="suspend-requested" if suspended else "resume-requested")
    try:
        await jobs.set_suspended(
            database(request),
            namespace=job.namespace,
            name=job.name,
            suspended=suspended,
            reason=MANUAL_REASON if suspended else None,
        )
    except JobNotFound:
        raise web.HTTPNotFound(reason="No such job") from None
    raise _back(job, done="suspended" if suspended else "resumed")


async def suspend(request: web.Request) -> web.Response:
    """POST (guarded): in a cluster spec.suspend: true on the CR (as `kubectl cronwell
    suspend`), else suspended in the store with reason Manual (as `cronwell suspend`)."""
    return await _set_suspended(request, True)


async def resume(request: web.Request) -> web.Response:
    """POST (guarded): lift the suspension where it is held (`resume_path`): spec.suspend:
    false on the CR, or in the store as `cronwell resume NAME`."""
    return await _set_suspended(request, False)


def _window(values: Mapping[str, object]) -> tuple[datetime, datetime]:
    """`from` and `until`: ISO-8601 instants (no offset: UTC, as `cronwell backfill`), or
    `now`; missing or malformed: 400."""
    out = []
    for key in ("from", "until"):
        raw = _form_text(values, key, 64)
        if raw is None:
            raise web.HTTPBadRequest(reason=f"{key} is required (an ISO-8601 instant)")
        try:
            out.append(parse_instant(raw))
        except ValueError as e:
            raise web.HTTPBadRequest(reason=f"{key}: {e}") from None
    return out[0], out[1]


async def _backfill(
    request: web.Request, job: ui.JobDetail, values: Mapping[str, object], **kw: Any
) -> backfills.BackfillResult:
    """`cronwell backfill`'s function over the window of `values`; its refusals (window too
    large, in the future, reversed, job suspended) are 400, a changed count 409."""
    start, end = _window(values)
    try:
        return await backfills.backfill(
            database(request),
            namespace=job.namespace,
            name=job.name,
            start=start,
            end=end,
            **kw,
        )
    except backfills.BackfillCountChanged as e:
        raise web.HTTPConflict(reason=f"Backfill refused: {e}") from None
    except backfills.BackfillError as e:
        raise web.HTTPBadRequest(reason=f"Backfill refused: {e}") from None
    except JobNotFound:
        raise web.HTTPNotFound(reason="No such job") from None


async def backfill_confirm(request: web.Request) -> web.Response:
    """GET: what backfilling the window would do (a dry run of the same function, bounded
    by its limit), and the form that does it carrying that count."""
    if not request.app[CONFIG].allow_actions:
        raise web.HTTPForbidden(reason="Read-only dashboard (start it with --allow-actions)")
    job = await _job(request)
    result = await _backfill(
        request, job, request.query, dry_run=True, max_instants=backfills.DEFAULT_MAX_INSTANTS
    )
    return render(
        request,
        "backfill_confirm.html",
        job=job,
        result=result,
        window={k: request.query[k] for k in ("from", "until")},
        expect=len(result.created) + len(result.reopened),
        csrf_token=csrf_token(request),
        csrf_field=CSRF_FIELD,
    )


async def backfill(request: web.Request) -> web.Response:
    """POST (guarded): backfill the window, refused (409, nothing written) unless it
    creates or reopens exactly the confirmed number of instants."""
    job = await _job(request)
    form = await request.post()
    raw = form.get("expect")
    expect = _count(raw if isinstance(raw, str) else None, "expect")
    if expect is None:
        raise web.HTTPBadRequest(reason="expect (the confirmed count) is required")
    result = await _backfill(
        request, job, form, expect=expect, max_instants=backfills.DEFAULT_MAX_INSTANTS
    )
    raise _back(job, backfilled=len(result.created) + len(result.reopened))
