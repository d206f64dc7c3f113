"""The validating admission webhook: what the CRD schema and CEL cannot check.

The API server checks types, enums, bounds, lengths and the cross-field rules (CEL) itself.
This webhook adds the rules that need cronwell's code, the cluster or the store; each
message names the field and the fix, as `cronwell apply` does (the same
`format_validation_error` for the spec's own validators):

- **spec**: the cron expression parses, the time zone exists, every pydantic validator of
  `cronwell.models` holds; the handler payload is not too large.
- **pool**: `spec.pool` names a WorkerPool (listed cluster-wide, names only, cached for
  `webhook_pool_cache_seconds`; without the WorkerPool CRD there are none) or a static pool
  of the `pools` setting (the chart's worker Deployments). Checked when the pool is new or
  changed, never on edits that keep it.
- **rate**: the namespace's schedules stay under a cap of occurrences per hour (setting
  `webhook_max_occurrences_per_hour`, overridden per namespace by the Namespace annotation
  `cronwell.dev/max-occurrences-per-hour`). Checked only when a change raises the job's own
  rate, so an edit that slows a job down is never refused in a namespace already over.

- **egress**: an http target's URL as written (a literal IP or a host name) passes the
  egress policy (`cronwell.egress`: built-in deny list, the cluster's CRONWELL_EGRESS_*
  lists, the Namespace annotations `cronwell.dev/egress-allow`/`-deny`). Checked when the
  URL is new or changed; the workers check again at connect time, after DNS.
- **tenancy**: the job's namespace may use `spec.pool` and the pool serves its handler
  (WorkerPool `namespaces`/`namespaceSelector`/`handlers`; static pools' from settings).
  Checked when the pool or the handler is new or changed; the workers check again.

- **job**: a `job` target's namespace is one where the workers may create Jobs (setting
  `webhook_job_namespaces`, the chart's `jobTarget.namespaces`), and the Job the worker
  would build from `jobTemplate` (kubejob.manifest) passes a server-side dry-run create
  (the API server's schema with fieldValidation=Strict, its own rules and the cluster's
  admission). Checked when the job target is new or changed; a dry-run that cannot be
  made (RBAC, outage) allows with a warning, and the worker reports the API server's
  answer when it creates the Job.

Secret references (`headers[].valueFrom.secretKeyRef`) have no namespace field: the Secret
is always in the ScheduledJob's own namespace (the schema forbids anything else).

The rate of a schedule is its instants on a day it runs, divided by 24 (seconds x minutes
x hours of the expanded cron; `H` fields expanded with a fixed seed, the count is the same
for every job), cached per expression; a one-shot (`runAt`) counts 1. The peak day rather
than an average: a weekday-only every-second job loads the workers every weekday. The
namespace's other jobs come from the store (`WebhookNamespaceSchedules`: one row per
distinct cron, counted in SQL) rather than from listing its CRs (10,000 full objects per
review); a CR accepted but not reconciled yet (seconds) is not counted, so the cap is a
guard against mistakes, not an exact quota. When the store or the Namespace cannot be read
the rate is not checked: the review is allowed with a warning (`kubectl` prints it), so an
outage does not also block every fix.

Served by kopf's WebhookServer (HTTPS). For local runs a self-signed certificate is made
with the `openssl` CLI; in a cluster, mount one (cert-manager) into `webhook_cert_dir`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import pydantic

from cronwell import cronexpr, kubejob, tenancy
from cronwell.egress import EgressDenied, EgressPolicy, NamespaceEgress
from cronwell.errors import CronwellError
from cronwell.loader import format_validation_error
from cronwell.metrics import Metrics
from cronwell.models import GROUP, ScheduledJob
from cronwell.settings import EgressSettings
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell_operator.kube import Kube, KubeInvalid, KubeNotFound
from cronwell_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

RATE_ANNOTATION = f"{GROUP}/max-occurrences-per-hour"
WARN_RATIO = 0.8
"""Above this share of the cap, an allowed review carries a warning."""

_HINTS = {
    "spec.schedule": "use 5 fields (minute hour day-of-month month day-of-week), 6 with "
    "seconds first, or a macro such as @hourly; e.g. '*/5 * * * *'",
}


@dataclass(frozen=True)
class Verdict:
    """One review's answer: `denial` is the message (None: allowed); `reason` the class
    counted in metrics (none, spec, payload, pool, rate, egress, tenancy, job; unchecked when a
    rule could not be evaluated)."""

    denial: str | None = None
    reason: str = "none"
    warnings: tuple[str, ...] = ()


def _exempt(body: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return True  # never block a deletion (finalizer removal) on a spec stored earlier
    # A metadata-only change (labels, the trigger annotation, finalizers).
    return old is not None and old.get("spec") == body.get("spec")


def _parse(body: Mapping[str, Any], settings: OperatorSettings) -> ScheduledJob | Verdict:
    """The validated document, or the spec/payload denial."""
    name = (body.get("metadata") or {}).get("name", "?")
    try:
        job = ScheduledJob.model_validate(body)
    except pydantic.ValidationError as e:
        lines = []
        for line in format_validation_error(e).split("; "):
            field = line.split(":", 1)[0]
            hint = _HINTS.get(field)
            useful = hint and hint not in line and "never fires" not in line
            lines.append(f"{line} ({hint})" if useful else line)
        return Verdict(f"ScheduledJob {name}: " + "; ".join(lines), "spec")
    handler = job.spec.target.handler
    if handler is not None:
        size = len(json.dumps(handler.payload, separators=(",", ":")).encode())
        limit = settings.webhook.payload_max_bytes
        if size > limit:
            return Verdict(
                f"ScheduledJob {name}: spec.target.handler.payload: {size} bytes is over the "
                f"{limit}-byte limit: keep large data elsewhere (a ConfigMap, object storage) "
                "and pass a reference to it",
                "payload",
            )
    return job


def problems(
    body: dict[str, Any], old: dict[str, Any] | None, *, settings: OperatorSettings
) -> str | None:
    """Why `body`'s spec itself must be refused, or None (the rules that need neither the
    cluster nor the store). `old` is the object before an UPDATE."""
    if _exempt(body, old):
        return None
    parsed = _parse(body, settings)
    return parsed.denial if isinstance(parsed, Verdict) else None


# ------------------------------------------------------------------------ schedule rate


@functools.lru_cache(maxsize=4096)
def occurrences_per_hour(schedule: str | None) -> float:
    """Runs per hour of one job on a day its schedule runs (a one-shot: 1). `schedule` is
    a cron cronwell accepts (validated before)."""
    if schedule is None:
        return 1.0
    return cronexpr.runs_per_hour(schedule)


def _job_rate(spec: Mapping[str, Any] | None) -> float:
    """Rate of a stored or submitted (camelCase) spec; 0 when suspended or unparsable."""
    if not spec or spec.get("suspend"):
        return 0.0
    try:
        return occurrences_per_hour(spec.get("schedule"))
    except (ValueError, KeyError):  # an old spec from before a validator: no rate to keep
        return 0.0


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


class Admission:
    """The rules that need the cluster (WorkerPools, the Namespace) or the store."""

    def __init__(
        self,
        db: Database,
        kube: Kube,
        settings: OperatorSettings,
        metrics: Metrics,
        egress: EgressPolicy | None = None,
    ):
        self.db = db
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.egress = egress if egress is not None else EgressSettings().policy()
        self._pools: tuple[float, dict[str, list[tenancy.PoolPolicy]] | None] | None = None
        self._pools_lock = asyncio.Lock()

    async def review(self, body: dict[str, Any], old: dict[str, Any] | None) -> Verdict:
        verdict = await self._review(body, old)
        result = "denied" if verdict.denial else "allowed"
        self.metrics.operator_admissions.labels(result=result, reason=verdict.reason).inc()
        return verdict

    async def _review(self, body: dict[str, Any], old: dict[str, Any] | None) -> Verdict:
        if _exempt(body, old):
            return Verdict()
        parsed = _parse(body, self.settings)
        if isinstance(parsed, Verdict):
            return parsed
        warnings: list[str] = []
        old_spec = (old or {}).get("spec") or None
        old_pool = old_spec.get("pool", "default") if old_spec is not None else None
        old_target = (old_spec or {}).get("target") or {}
        http = parsed.spec.target.http
        url_changed = http is not None and http.url != (old_target.get("http") or {}).get("url")
        handler = parsed.spec.target.handler
        old_handler = (old_target.get("handler") or {}).get("name")
        pool_changed = parsed.spec.pool != old_pool
        pool_check = pool_changed or (handler is not None and handler.name != old_handler)
        meta: dict[str, Any] = {}
        if url_changed or pool_check:
            meta = await self._namespace(parsed.metadata.namespace, warnings)
        if url_changed:
            denial = self._check_egress(parsed, meta)
            if denial is not None:
                return denial
        if pool_check:
            verdict = await self._check_pool(parsed, meta, warnings, known=pool_changed)
            if verdict is not None:
                return verdict
        new_job = ((body.get("spec") or {}).get("target") or {}).get("job")
        if parsed.spec.target.job is not None and new_job != old_target.get("job"):
            verdict = await self._check_job(parsed, body, warnings)
            if verdict is not None:
                return verdict
        rate = await self._check_rate(parsed, body, old_spec, warnings)
        if rate is not None:
            return rate
        reason = "unchecked" if any("not checked" in w for w in warnings) else "none"
        return Verdict(None, reason, tuple(warnings))

    # -- namespace

    async def _namespace(self, namespace: str, warnings: list[str]) -> dict[str, Any]:
        """The Namespace's labels and annotations ({} when it cannot be read: say so)."""
        try:
            return await self.kube.namespace_meta(namespace)
        except CronwellError as e:
            warnings.append(f"namespace {namespace} could not be read ({e}): its egress "
                            "annotations and labels were not applied here")  # fmt: skip
            return {}

    # -- egress

    def _check_egress(self, job: ScheduledJob, meta: Mapping[str, Any]) -> Verdict | None:
        http = job.spec.target.http
        assert http is not None
        name, namespace = job.metadata.name, job.metadata.namespace
        try:
            ns = NamespaceEgress.from_annotations(namespace, meta.get("annotations") or {})
            self.egress.for_namespace(ns).check_url(http.url)
        except EgressDenied as e:
            return Verdict(f"ScheduledJob {name}: {e}", "egress")
        return None

    # -- job target

    async def _check_job(
        self, job: ScheduledJob, body: Mapping[str, Any], warnings: list[str]
    ) -> Verdict | None:
        target = job.spec.target.job
        assert target is not None
        name, namespace = job.metadata.name, job.metadata.namespace
        allowed = self.settings.webhook.job_namespaces
        if "*" not in allowed and namespace not in allowed:
            return Verdict(
                f"ScheduledJob {name}: spec.target.job: the workers may not create Jobs in "
                f"namespace {namespace}: add {namespace} to jobTarget.namespaces in the chart's "
                "values (a Role there lets the workers create, get, list, watch and delete "
                "Jobs) and upgrade the release, then apply again",
                "job",
            )
        uid = (body.get("metadata") or {}).get("uid") or str(uuid.UUID(int=0))
        occ = kubejob.Occurrence(
            namespace=namespace,
            scheduledjob=name,
            scheduledjob_uid=uid,
            pool=job.spec.pool,
            key=f"{uid}:dry-run",
            scheduled_for=datetime.now(UTC).replace(microsecond=0),
            attempt=1,
            fence=1,
        )
        try:
            await self.kube.dry_run_job(kubejob.manifest(target.job_template, occ, 1))
        except KubeInvalid as e:
            return Verdict(
                f"ScheduledJob {name}: spec.target.job.jobTemplate: the API server refuses "
                f"the Job it makes: {e} (`kubectl explain job.spec` lists the fields)",
                "job",
            )
        except CronwellError as e:
            warnings.append(
                f"spec.target.job.jobTemplate not checked (its Job's dry-run failed: {e}): "
                "the worker reports any refusal at run time"
            )
        return None

    # -- pool

    async def _workerpools(self, max_age: float) -> dict[str, list[tenancy.PoolPolicy]] | None:
        """WorkerPools' policies by pool name (None: not served by the API server), listed
        at most once per `max_age` seconds however many reviews arrive together."""
        async with self._pools_lock:
            now = time.monotonic()
            if self._pools is not None and now - self._pools[0] <= max_age:
                return self._pools[1]
            found: dict[str, list[tenancy.PoolPolicy]] | None
            try:
                objs = await self.kube.list_workerpools()
            except KubeNotFound:
                found = None
            else:
                found = {}
                for obj in objs:
                    name = (obj.get("metadata") or {}).get("name")
                    policy = tenancy.from_workerpool(obj)
                    if name:
                        found.setdefault(name, [])  # an invalid WorkerPool still names a pool
                        if policy is not None:
                            found[name].append(policy)
            self._pools = (time.monotonic(), found)
            return found

    def _static(self, pool: str) -> tenancy.PoolPolicy:
        s = self.settings.tenancy
        return tenancy.static(pool, s.pool_namespaces.get(pool), s.pool_handlers.get(pool))

    async def _check_pool(
        self, job: ScheduledJob, meta: Mapping[str, Any], warnings: list[str], *, known: bool
    ) -> Verdict | None:
        """The pool exists (when `known` and required) and the namespace may use it and
        its handler."""
        pool = job.spec.pool
        static = set(self.settings.tenancy.pools)
        try:
            pools = await self._workerpools(self.settings.webhook.pool_cache_seconds)
            if pool not in static and (pools is None or pool not in pools):
                pools = await self._workerpools(0)  # maybe created a moment ago: look again
        except CronwellError as e:
            log.warning(
                "could not list WorkerPools; spec.pool not checked",
                extra={"action": "webhook_pool_unchecked", "error": str(e)},
            )
            warnings.append(f"spec.pool {pool!r} was not checked: could not list WorkerPools")
            return None
        policies = list((pools or {}).get(pool, []))
        if pool in static:
            policies.append(self._static(pool))
        if pool in static or (pools is not None and pool in pools):
            handler = job.spec.target.handler
            refusal = tenancy.check(
                policies,
                pool=pool,
                namespace=job.metadata.namespace,
                labels=meta.get("labels") or {},
                handler=handler.name if handler is not None else None,
            )
            if refusal is None:
                return None
            return Verdict(f"ScheduledJob {job.metadata.name}: {refusal.message}", "tenancy")
        if not (known and self.settings.webhook.require_known_pool):
            return None
        known_names = ", ".join(sorted(static | set(pools or ()))) or "none"
        return Verdict(
            f"ScheduledJob {job.metadata.name}: spec.pool: no worker pool {pool!r} (known "
            f"pools: {known_names}): set spec.pool to a known pool, or create a WorkerPool named "
            f"{pool!r} (cronwell.dev/v1alpha1) for the worker Deployment that serves it",
            "pool",
        )

    # -- rate

    async def _cap(self, namespace: str) -> tuple[int, str]:
        """The namespace's cap and a note when its annotation is not usable."""
        default = self.settings.webhook.max_occurrences_per_hour
        raw = ((await self.kube.namespace_meta(namespace)).get("annotations") or {}).get(
            RATE_ANNOTATION
        )
        if raw is None:
            return default, ""
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            value = -1
        if value < 0:
            return default, (
                f" (the namespace's {RATE_ANNOTATION} annotation {raw!r} is not a whole "
                "number >= 0, so the default applies)"
            )
        return value, ""

    async def _check_rate(
        self,
        job: ScheduledJob,
        body: Mapping[str, Any],
        old_spec: Mapping[str, Any] | None,
        warnings: list[str],
    ) -> Verdict | None:
        spec = body.get("spec") or {}
        new = _job_rate(spec)
        if new <= _job_rate(old_spec):
            return None  # never refuse a change that does not raise the job's rate
        namespace = job.metadata.namespace
        try:
            rows = await store_jobs.namespace_schedules(
                self.db, namespace=namespace, other_than=job.metadata.name
            )
            cap, note = await self._cap(namespace)
        except CronwellError as e:
            log.warning(
                "schedule rate not checked",
                extra={"action": "webhook_rate_unchecked", "namespace": namespace, "error": str(e)},
            )
            warnings.append(f"the namespace's schedule rate was not checked: {e}")
            return None
        total = new
        for r in rows:
            total += r.jobs * _job_rate({"schedule": r.schedule})
        field = "spec.schedule" if job.spec.schedule is not None else "spec.runAt"
        if total > cap:
            return Verdict(
                f"ScheduledJob {job.metadata.name}: {field}: namespace {namespace} would "
                f"schedule {_num(total)} runs per hour with this job ({_num(new)} from it), "
                f"over its cap of {cap:,}{note}: space the schedule out (e.g. every minute "
                "rather than every second), or have a cluster admin raise the cap: kubectl "
                f"annotate namespace {namespace} {RATE_ANNOTATION}=N --overwrite",
                "rate",
            )
        if total > WARN_RATIO * cap:
            warnings.append(
                f"namespace {namespace} schedules {_num(total)} runs per hour, "
                f"{total / cap:.0%} of its cap of {cap:,} ({RATE_ANNOTATION})"
            )
        return None


def self_signed_cert(directory: Path, host: str) -> tuple[Path, Path]:
    """tls.crt + tls.key for `host` (an IP or a DNS name), made once; for local runs."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "tls.crt", directory / "tls.key"
    if crt.is_file() and key.is_file():
        return crt, key
    san = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    cmd = [
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "365",
        "-subj", "/CN=cronwell-operator-webhook",
        "-addext", f"subjectAltName={san},DNS:localhost",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
        "-addext", "extendedKeyUsage=serverAuth",
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        raise RuntimeError(
            f"could not make a self-signed webhook certificate with openssl: {e} "
            f"{err.decode(errors='replace')}"
        ) from e
    key.chmod(0o600)
    return crt, key


def server(cfg: OperatorSettings) -> kopf.WebhookServer:
    """kopf's HTTPS webhook server for these settings."""
    directory = (
        Path(cfg.webhook.cert_dir)
        if cfg.webhook.cert_dir is not None
        else Path(tempfile.gettempdir()) / f"cronwell-webhook-{cfg.webhook.port}"
    )
    certfile, pkeyfile = self_signed_cert(directory, cfg.webhook.host or "127.0.0.1")
    ca = directory / "ca.crt"
    cafile = ca if ca.is_file() else None
    return kopf.WebhookServer(
        addr=cfg.webhook.addr,
        port=cfg.webhook.port,
        host=cfg.webhook.host,
        certfile=certfile,
        pkeyfile=pkeyfile,
        cafile=cafile,
    )
