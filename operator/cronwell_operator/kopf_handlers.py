"""kopf handlers for ScheduledJob: the CR into the store, with the CR uid as the job's id.

What the operator writes to a ScheduledJob, and nothing else (GitOps tools see no drift):

- its finalizer `cronwell.dev/finalizer`, so that a delete tombstones the job first;
- `status` (the status subresource): the writer's fields, and kopf's own bookkeeping under
  `status.kopf` — handler progress and the last handled configuration (the diff base) are
  configured to live there instead of kopf's default annotations.

Never `spec`, labels or annotations. The trigger annotation `cronwell.dev/trigger` is the
user's: each distinct value requests one run (the occurrence key carries the value).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic

from cronwell import jobs
from cronwell.errors import (
    CronwellError,
    DatabaseError,
    DatabaseUnavailable,
    JobNotFound,
    SpecError,
)
from cronwell.loader import format_validation_error
from cronwell.metrics import Metrics
from cronwell.models import GROUP, VERSION, ScheduledJob
from cronwell.secretbox import SecretBox
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell_operator import tenancy_sync, webhook
from cronwell_operator.kube import PLURAL, CRef, Kube, KubeError
from cronwell_operator.settings import OperatorSettings
from cronwell_operator.status import StatusWriter

log = logging.getLogger(__name__)

FINALIZER = f"{GROUP}/finalizer"
TRIGGER_ANNOTATION = f"{GROUP}/trigger"


@dataclass
class HandlerDeps:
    """What the handlers need, passed explicitly (no module globals)."""

    db: Database
    kube: Kube
    settings: OperatorSettings
    writer: StatusWriter | None = None
    metrics: Metrics | None = None
    secrets: SecretBox | None = None
    secret_warnings: dict[str, str] = field(default_factory=dict)
    """The unresolved-Secret message last posted per CR uid: one Warning per transition."""

    def __post_init__(self) -> None:
        # The served Metrics object: given, else the writer's (the same one in the leader).
        if self.metrics is None:
            self.metrics = self.writer.metrics if self.writer is not None else Metrics()
        # kopf runs one handler per object at once: a restart with 10,000 CRs started 10,000
        # reconciles against an 8-connection pool, most timed out waiting for a connection
        # (DatabaseUnavailable), each failure posted an Event and was retried: an API storm.
        # Reconciles wait for a slot instead, leaving two connections to the status writer
        # and the webhook.
        self.slots = asyncio.Semaphore(max(1, self.db.pool.max_size - 2))

    @property
    def m(self) -> Metrics:
        assert self.metrics is not None
        return self.metrics


def connection_info(config: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from a `kubernetes` client Configuration (as kopf's
    login_via_client does, but for this configuration rather than the global default)."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


async def _warn_unresolved(
    ctx: HandlerDeps, ref: CRef, unresolved: tenancy_sync.SecretUnresolved | None
) -> None:
    """A Warning Event naming a missing Secret (or key), once per transition: kopf's retries
    of the reconcile do not post it again, a resolution re-arms it."""
    if unresolved is None:
        ctx.secret_warnings.pop(ref.uid, None)
        return
    message = f"ScheduledJob {ref.name}: {unresolved}"
    if ctx.secret_warnings.get(ref.uid) == message:
        return
    try:
        await ctx.kube.post_event(
            ref,
            type_="Warning",
            reason="SecretUnresolved",
            message=message,
            instance=ctx.settings.identity,
        )
    except KubeError as e:
        log.warning(f"could not post the Warning Event: {e}", extra={"action": "event_failed"})
        return
    ctx.secret_warnings[ref.uid] = message


def kopf_error(e: CronwellError) -> kopf.TemporaryError | kopf.PermanentError:
    """cronwell's errors, mapped explicitly: retry what time can fix, fail what it cannot."""
    if isinstance(e, DatabaseUnavailable):
        return kopf.TemporaryError(f"database unavailable: {e}", delay=10)
    if isinstance(e, DatabaseError):
        return kopf.TemporaryError(f"database error: {e}", delay=30)
    if isinstance(e, JobNotFound):
        return kopf.TemporaryError(str(e), delay=5)
    if isinstance(e, SpecError):
        return kopf.PermanentError(str(e))
    if isinstance(e, tenancy_sync.SecretUnresolved):
        return kopf.TemporaryError(str(e), delay=30)
    return kopf.TemporaryError(f"{type(e).__name__}: {e}", delay=60)


def configure(
    settings: kopf.OperatorSettings, cfg: OperatorSettings, *, manage_webhook: bool = True
) -> None:
    """kopf settings: where it keeps its state, what it posts, which webhook it serves.
    `manage_webhook`: keep the ValidatingWebhookConfiguration pointing at this replica (the
    leader does, when --webhook-host is set; standbys only serve)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
        field="status.kopf.lastHandledConfiguration"
    )
    # kopf's log-to-Event bridge is off: it posted "Error Logging: Handler ... failed" on
    # every retry and edit. The status writer posts Warning Events with specific reasons
    # (InvalidSpec, UnknownTimeZone, MissedRun, DeadLettered, ...) once per transition.
    settings.posting.enabled = False
    settings.posting.loggers = False
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "cronwell-operator"
    settings.posting.reporting_instance = cfg.identity
    settings.posting.event_name_prefix = "cronwell-"
    # The CRD is installed before the operator starts (Helm, make install): no re-scanning
    # of the cluster's APIs at runtime (it also leaves requests hanging at shutdown).
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    if cfg.webhook.port is not None:
        settings.admission.server = webhook.server(cfg)
        if cfg.webhook.host is not None and manage_webhook:
            settings.admission.managed = f"{GROUP}"


def _ref(body: kopf.Body) -> CRef:
    meta = body.metadata
    return CRef(str(meta.uid), str(meta.namespace), str(meta.name))


def register(
    registry: kopf.OperatorRegistry, ctx: HandlerDeps, *, webhook_only: bool = False
) -> None:
    """Register the handlers into `registry` (one per kopf instance); `webhook_only` for a
    standby, which serves admission but reconciles nothing."""

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # The same cluster and identity as the operator's own client (--kubeconfig, else
        # KUBECONFIG, else the in-cluster service account).
        return connection_info(ctx.kube.api.configuration)

    if not webhook_only:
        _register_resource_handlers(registry, ctx)

    if ctx.settings.webhook.port is not None:
        admission = webhook.Admission(ctx.db, ctx.kube, ctx.settings, ctx.m)

        @kopf.on.validate(
            GROUP,
            VERSION,
            PLURAL,
            id="validate-scheduledjob",
            operations=["CREATE", "UPDATE"],
            registry=registry,
        )
        async def validate(body: kopf.Body, warnings: list[str], old: Any = None, **_: Any) -> None:
            verdict = await admission.review(dict(body), dict(old) if old else None)
            warnings.extend(verdict.warnings)
            if verdict.denial:
                raise kopf.AdmissionError(verdict.denial, code=422)


def _register_resource_handlers(registry: kopf.OperatorRegistry, ctx: HandlerDeps) -> None:
    """create/update/resume/delete of ScheduledJobs: the reconciliation proper."""

    async def reconcile(body: kopf.Body, *, trigger: bool) -> None:
        async with ctx.slots:
            await _reconcile(body, trigger=trigger)

    async def _reconcile(body: kopf.Body, *, trigger: bool) -> None:
        ref = _ref(body)
        generation = int(body.metadata.get("generation") or 1)
        if ctx.writer is not None:
            ctx.writer.seen(ref, body.get("status"))
        try:
            # The whole document, so errors read `spec.schedule: ...` as in `cronwell apply`.
            spec = ScheduledJob.model_validate(
                {"metadata": dict(body.metadata), "spec": dict(body.spec)}
            ).spec
        except pydantic.ValidationError as e:
            # Reported in status (Ready=False InvalidSpec) and as one Warning Event by the
            # status writer; not retried: the next change of the CR reconciles it again.
            message = f"ScheduledJob {ref.name}: {format_validation_error(e)}"
            if ctx.writer is not None:
                ctx.writer.set_spec_error(ref, generation, message)
            ctx.m.operator_reconciles.labels(outcome="invalid").inc()
            log.warning(message, extra={"action": "invalid_spec", "job": ref.uid})
            return
        try:
            applied = await jobs.apply_job(
                ctx.db,
                namespace=ref.namespace,
                name=ref.name,
                spec=spec,
                uid=ref.uid,
                generation=generation,
                labels=dict(body.metadata.labels),
            )
            if applied.action == "deleted":
                ctx.m.operator_reconciles.labels(outcome="error").inc()
                raise kopf.PermanentError(
                    f"job {ref.uid} was deleted from the store (e.g. `cronwell delete`); "
                    "delete and re-create the ScheduledJob to schedule it again"
                )
            # Before a trigger runs, so its attempt finds the values; a missing Secret does
            # not hold up the rest (kopf retries and posts a Warning Event naming it).
            unresolved: tenancy_sync.SecretUnresolved | None = None
            try:
                await tenancy_sync.resolve_secrets(
                    ctx.db,
                    ctx.kube,
                    ctx.secrets,
                    job_id=applied.id,
                    namespace=ref.namespace,
                    spec=spec,
                )
            except tenancy_sync.SecretUnresolved as e:
                unresolved = e
            if applied.action == "unchanged":
                # Same meaning, newer generation (e.g. a no-op edit): record it as observed.
                await store_jobs.observe_generation(
                    ctx.db, job_id=applied.id, generation=generation
                )
            if ctx.writer is not None:
                ctx.writer.set_spec_error(ref, generation, None)
            outcome = "unchanged" if applied.action == "unchanged" else "applied"
            ctx.m.operator_reconciles.labels(outcome=outcome).inc()
            value = body.metadata.annotations.get(TRIGGER_ANNOTATION)
            if trigger and value:
                key, created = await jobs.trigger_job(
                    ctx.db, namespace=ref.namespace, name=ref.name, trigger_id=value
                )
                if created:
                    log.info(
                        "job triggered",
                        extra={"action": "job_triggered", "key": key, "trigger": value},
                    )
            await _warn_unresolved(ctx, ref, unresolved)
            if unresolved is not None:
                raise unresolved
        except CronwellError as e:
            ctx.m.operator_reconciles.labels(outcome="error").inc()
            raise kopf_error(e) from e

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    async def created(body: kopf.Body, **_: Any) -> None:
        await reconcile(body, trigger=True)

    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def updated(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
        before = ((old or {}).get("metadata") or {}).get("annotations") or {}
        after = ((new or {}).get("metadata") or {}).get("annotations") or {}
        changed = before.get(TRIGGER_ANNOTATION) != after.get(TRIGGER_ANNOTATION)
        await reconcile(body, trigger=changed)

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    async def resumed(body: kopf.Body, **_: Any) -> None:
        # Operator start: a CR without a row is created (drift repair), a changed one updated,
        # a trigger value already run stays a no-op (its key exists).
        await reconcile(body, trigger=True)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def deleted(body: kopf.Body, **_: Any) -> None:
        try:
            async with ctx.slots:
                await jobs.delete_job_by_uid(ctx.db, str(body.metadata.uid))
        except CronwellError as e:
            ctx.m.operator_reconciles.labels(outcome="error").inc()
            raise kopf_error(e) from e
        ctx.m.operator_reconciles.labels(outcome="deleted").inc()
        if ctx.writer is not None:
            ctx.writer.forget(str(body.metadata.uid))
