"""Pydantic models of the cronwell resources: the single source of truth for CRD schemas,
the standalone YAML loader and the store's copy of each spec."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from cronwell.cronexpr import load_zone, uses_hash, validate_cron

GROUP = "cronwell.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# DNS-1123 label, as Kubernetes requires for names used in keys and labels.
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class CamelModel(BaseModel):
    """camelCase on the wire (as Kubernetes users write it), snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=True,
    )


class ConcurrencyPolicy(StrEnum):
    """What happens when an occurrence comes due while an earlier one of the job is active
    (Temporal's overlap policies)."""

    SKIP = "Skip"
    BUFFER_ONE = "BufferOne"
    BUFFER_ALL = "BufferAll"
    REPLACE = "Replace"
    ALLOW = "Allow"


class MisfirePolicy(StrEnum):
    """What happens to instants that passed their starting deadline without being dispatched."""

    RUN_ONCE = "RunOnce"
    RUN_ALL = "RunAll"
    SKIP = "Skip"


class Delivery(StrEnum):
    AT_LEAST_ONCE = "AtLeastOnce"
    AT_MOST_ONCE = "AtMostOnce"


class SpringForward(StrEnum):
    """Local times that do not exist (the clock jumps forward)."""

    RUN_AT_GAP_END = "RunAtGapEnd"
    SKIP = "Skip"


class FallBack(StrEnum):
    """Local times that occur twice (the clock falls back)."""

    RUN_ONCE = "RunOnce"
    RUN_TWICE = "RunTwice"


class DstPolicy(CamelModel):
    """How the schedule treats daylight-saving transitions in `timeZone`."""

    spring_forward: SpringForward = Field(
        SpringForward.RUN_AT_GAP_END,
        description="Local times skipped by a DST jump: run at the end of the gap, or skip.",
    )
    fall_back: FallBack = Field(
        FallBack.RUN_ONCE,
        description="Local times repeated by a DST fall-back: run at the first one, or at both.",
    )


class RetryPolicy(CamelModel):
    """Retries of a failed attempt, under the same idempotency key."""

    max_attempts: int = Field(3, ge=1, le=100, description="Attempts before dead-lettering.")
    initial_delay_seconds: float = Field(
        1.0, ge=0, le=86400, description="Backoff before the first retry, in seconds."
    )
    factor: float = Field(2.0, ge=1, le=10, description="Each retry waits this much longer.")
    max_delay_seconds: float = Field(
        300.0, ge=0, le=86400, description="Upper bound of the backoff, in seconds."
    )


_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"


class SecretKeySelector(CamelModel):
    """One key of a Secret in the ScheduledJob's own namespace (never another's)."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
              description="Name of the Secret, in the ScheduledJob's namespace."),
    ]  # fmt: skip
    key: Annotated[
        str,
        Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
              description="Key in the Secret's data."),
    ]  # fmt: skip


class HeaderValueSource(CamelModel):
    """Where a header's value comes from instead of the spec."""

    secret_key_ref: SecretKeySelector = Field(
        description="A key of a Secret in the same namespace; resolved by the operator."
    )


class Header(CamelModel):
    """One request header: a literal `value`, or `valueFrom` a Secret (kept out of the CR)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.value) != has(self.valueFrom)",
                    "message": "a header needs exactly one of value or valueFrom",
                }
            ]
        }
    )

    name: Annotated[
        str, Field(min_length=1, max_length=256, pattern=_HEADER_NAME, description="Header name.")
    ]
    value: str | None = Field(None, max_length=8192, description="Literal value.")
    value_from: HeaderValueSource | None = Field(
        None, description="The value from a Secret key (credentials: keep them out of Git)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Header:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(
                f"header {self.name!r}: set exactly one of value or valueFrom "
                "(valueFrom: {secretKeyRef: {name: SECRET, key: KEY}})"
            )
        return self


class HttpTarget(CamelModel):
    """An HTTP call; the occurrence's idempotency key is sent as the Idempotency-Key header."""

    url: Annotated[
        str, Field(max_length=2048, pattern=r"^https?://", description="http:// or https:// URL.")
    ]
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(
        "POST", description="HTTP method."
    )
    headers: list[Header] = Field(
        default_factory=list,
        max_length=64,
        description="Extra request headers: [{name, value}] or [{name, valueFrom: "
        "{secretKeyRef: {name, key}}}].",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    body: str | None = Field(None, max_length=65536, description="Request body.")
    connect_timeout_seconds: float = Field(
        5.0, gt=0, le=300, description="Connect timeout, in seconds."
    )
    verify_tls: bool = Field(True, description="Verify the server's TLS certificate.")
    follow_redirects: bool = Field(
        False,
        description="Follow redirects (at most 5, each hop checked by the egress policy). "
        "Off: a 3xx answer fails the attempt.",
    )

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_map(cls, v: Any) -> Any:
        """The first shape, a map of literal values, still loads (stored specs, old YAML)."""
        if isinstance(v, dict):
            return [{"name": k, "value": val} for k, val in v.items()]
        return v

    @field_validator("headers")
    @classmethod
    def _unique(cls, v: list[Header]) -> list[Header]:
        seen: set[str] = set()
        for h in v:
            if h.name.lower() in seen:
                raise ValueError(f"header {h.name!r} is given twice: keep one")
            seen.add(h.name.lower())
        return v

    @property
    def secret_headers(self) -> list[Header]:
        return [h for h in self.headers if h.value_from is not None]


class HandlerTarget(CamelModel):
    """A function registered with @cronwell.handler in the pool's worker image."""

    name: Annotated[
        str, Field(min_length=1, max_length=253, description="The registered handler name.")
    ]
    payload: dict[str, Any] = Field(
        default_factory=dict, description="JSON object passed to the handler."
    )


class LogTarget(CamelModel):
    """Log a line (for trying cronwell out)."""

    message: Annotated[str, Field(max_length=4096, description="The line to log.")] = (
        "hello from cronwell"
    )


#: Label and annotation keys under this prefix are the worker's (job, instant, key, fence):
#: a jobTemplate may not set them, so no Job can pose as another occurrence's.
RESERVED_PREFIX = "cronwell.dev/"


class JobTemplateMetadata(CamelModel):
    """Labels and annotations of each Job (its name is cronwell's, from the idempotency key)."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels of each Job.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations of each Job."
    )

    @field_validator("labels", "annotations")
    @classmethod
    def _not_reserved(cls, v: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in v if k.startswith(RESERVED_PREFIX))
        if taken:
            raise ValueError(
                f"{', '.join(taken)}: keys under {RESERVED_PREFIX} are set by cronwell on every "
                "Job; remove them from the jobTemplate"
            )
        return v


_NO_TTL = (
    "ttlSecondsAfterFinished: remove it; cronwell deletes finished Jobs itself "
    "(successfulJobsHistoryLimit, failedJobsHistoryLimit) once their outcome is recorded, "
    "while a TTL could delete a Job before that and a later attempt would run the "
    "occurrence again"
)


class JobTemplate(CamelModel):
    """CronJob's jobTemplate: metadata (labels, annotations) and a batch/v1 JobSpec.

    The JobSpec is kept whole (`x-kubernetes-preserve-unknown-fields`) and validated by the
    API server itself when the Job is built (server-side dry-run, fieldValidation=Strict):
    docs/design/job-target.md says why. Only the checks below run without a cluster."""

    metadata: JobTemplateMetadata = Field(default_factory=JobTemplateMetadata)
    spec: dict[str, Any] = Field(
        description="A batch/v1 JobSpec, as in a CronJob's jobTemplate.spec (validated by the "
        "API server: `kubectl explain job.spec`).",
        json_schema_extra={
            "required": ["template"],
            "x-kubernetes-validations": [
                {"rule": "!has(self.ttlSecondsAfterFinished)", "message": _NO_TTL}
            ],
            "properties": {
                "template": {
                    "type": "object",
                    "description": "The Pod template (`kubectl explain job.spec.template`).",
                    "additionalProperties": True,
                },
                # Declared only so that the rule above can see it (CEL sees no unknown field).
                "ttlSecondsAfterFinished": {
                    "type": "integer",
                    "description": "Not allowed: cronwell deletes finished Jobs itself.",
                },
            },
        },
    )

    @field_validator("spec")
    @classmethod
    def _runnable(cls, v: dict[str, Any]) -> dict[str, Any]:
        """What every Job needs, said before a cluster is involved (standalone, convert)."""
        template = v.get("template")
        pod = template.get("spec") if isinstance(template, dict) else None
        if not isinstance(pod, dict):
            raise ValueError(
                "spec.template.spec is required: the Pod to run "
                "(template: {spec: {containers: [{name, image}], restartPolicy: Never}})"
            )
        containers = pod.get("containers")
        if (
            not isinstance(containers, list)
            or not containers
            or not all(isinstance(c, dict) for c in containers)
        ):
            raise ValueError(
                "spec.template.spec.containers needs at least one container: "
                "[{name: main, image: IMAGE}]"
            )
        if "ttlSecondsAfterFinished" in v:
            raise ValueError(f"spec.{_NO_TTL}")
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            raise ValueError(
                "spec.template.spec.restartPolicy must be Never or OnFailure (a Job's Pod "
                f"may not restart Always); got {pod.get('restartPolicy')!r}"
            )
        return v


class JobTarget(CamelModel):
    """A Kubernetes Job per occurrence, named from its idempotency key: created at most once."""

    job_template: JobTemplate = Field(
        description="What each Job is: CronJob's jobTemplate ({metadata, spec})."
    )


TARGET_KINDS = ("http", "handler", "log", "job")
_TARGETS_NEEDED = "target needs exactly one of http, handler, log or job"


class Target(CamelModel):
    """Exactly one of http, handler, log or job."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.http), has(self.handler), has(self.log), has(self.job)]"
                    ".filter(x, x).size() == 1",
                    "message": _TARGETS_NEEDED,
                }
            ]
        }
    )

    http: HttpTarget | None = None
    handler: HandlerTarget | None = None
    log: LogTarget | None = None
    job: JobTarget | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        given = [k for k in TARGET_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(_TARGETS_NEEDED + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def kind(self) -> str:
        return next(k for k in TARGET_KINDS if getattr(self, k) is not None)


class ScheduledJobSpec(CamelModel):
    """What runs (target), when (schedule or runAt) and how (policies)."""

    # Cross-field rules, enforced by the API server too (CEL) with the same messages.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.schedule) != has(self.runAt)",
                    "message": "set exactly one of spec.schedule (cron) or spec.runAt (one-shot)",
                    "fieldPath": ".schedule",
                },
                {
                    "rule": "!has(self.startAt) || !has(self.endAt) || self.endAt > self.startAt",
                    "message": "spec.endAt must be after spec.startAt",
                    "fieldPath": ".endAt",
                },
            ]
        }
    )

    schedule: str | None = Field(
        None,
        max_length=256,
        description="Cron: 5 fields, or 6 with seconds first; @hourly-style macros; "
        "@every DURATION; H for a per-job hashed value; L, W and # day syntax.",
    )
    run_at: datetime | None = Field(None, description="One-shot instant (RFC 3339).")
    time_zone: str = Field("UTC", max_length=64, description="IANA zone for the schedule.")
    dst_policy: DstPolicy = Field(default_factory=DstPolicy)
    start_at: datetime | None = Field(None, description="No occurrence before this instant.")
    end_at: datetime | None = Field(None, description="No occurrence after this instant.")
    target: Target = Field(description="What runs: exactly one of http, handler, log or job.")
    pool: Annotated[
        str,
        Field(
            max_length=63,
            pattern=_NAME_RE.pattern,
            description="Worker pool that runs it (a DNS-1123 label).",
        ),
    ] = "default"
    concurrency_policy: ConcurrencyPolicy = Field(
        ConcurrencyPolicy.SKIP,
        description="When an occurrence comes due while an earlier one is still active.",
    )
    misfire_policy: MisfirePolicy = Field(
        MisfirePolicy.RUN_ONCE,
        description="What happens to instants missed beyond the starting deadline.",
    )
    starting_deadline_seconds: int | None = Field(
        None, ge=1, le=31_536_000, description="Dispatch later than this is a misfire."
    )
    max_catchup: int = Field(100, ge=1, le=1000, description="RunAll: most missed instants run.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_seconds: int = Field(3600, ge=1, le=86400 * 7, description="Per attempt, in seconds.")
    jitter_seconds: int = Field(
        0, ge=0, le=3600, description="Per-job delay of each run; never changes its identity."
    )
    delivery: Delivery = Field(
        Delivery.AT_LEAST_ONCE,
        description="AtMostOnce: an ambiguous attempt is dead-lettered, never retried.",
    )
    suspend: bool = Field(False, description="Stop scheduling (resuming applies misfirePolicy).")
    suspend_after_failures: int | None = Field(
        None, ge=1, le=10000, description="Suspend after this many dead-lettered runs in a row."
    )
    successful_jobs_history_limit: int = Field(
        100, ge=0, le=100000, description="Newest succeeded runs kept in history."
    )
    failed_jobs_history_limit: int = Field(
        100,
        ge=0,
        le=100000,
        description="Newest runs kept in history for each other final state (dead, "
        "missed, skipped, cancelled).",
    )

    @field_validator("schedule")
    @classmethod
    def _cron_parses(cls, v: str | None) -> str | None:
        if v is None:
            return v
        validate_cron(v)
        return v.strip()

    @field_validator("time_zone")
    @classmethod
    def _zone_exists(cls, v: str) -> str:
        load_zone(v)
        return v

    @field_validator("run_at", "start_at", "end_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return v
        if v.tzinfo is None:
            raise ValueError("must carry a UTC offset, e.g. 2026-12-01T09:00:00Z")
        return v.astimezone(UTC).replace(microsecond=0)

    @model_validator(mode="after")
    def _one_kind(self) -> ScheduledJobSpec:
        if (self.schedule is None) == (self.run_at is None):
            raise ValueError(
                "set exactly one of spec.schedule (cron) or spec.runAt (one-shot)"
                + (" (both are set)" if self.schedule is not None else "")
            )
        if self.start_at and self.end_at and self.end_at <= self.start_at:
            raise ValueError("spec.endAt must be after spec.startAt")
        if self.schedule and self.start_at and self.end_at and not uses_hash(self.schedule):
            from cronwell.schedule import JobSchedule  # it imports this module

            if JobSchedule.from_spec("", self).first_at_or_after(self.start_at) is None:
                raise ValueError(
                    f"spec.schedule {self.schedule!r} never fires between spec.startAt and "
                    "spec.endAt: move spec.endAt later or change the schedule"
                )
        return self


class ObjectMeta(BaseModel):
    """The part of Kubernetes metadata cronwell reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if len(v) > 63 or not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a valid name: use lower-case letters, digits and '-', "
                "start and end with a letter or digit, at most 63 characters"
            )
        return v


class ScheduledJob(BaseModel):
    """A whole ScheduledJob document, as in `kubectl apply -f` or `cronwell apply -f`."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    api_version: Literal["cronwell.dev/v1alpha1"] = Field(
        "cronwell.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["ScheduledJob"] = "ScheduledJob"
    metadata: ObjectMeta
    spec: ScheduledJobSpec


# ---------------------------------------------------------------------------------- status
# Written by the operator (status subresource) from the store; never read back as input.


class LastResult(StrEnum):
    """Outcome of the most recently finished occurrence."""

    SUCCEEDED = "Succeeded"
    DEAD = "Dead"
    MISSED = "Missed"
    SKIPPED = "Skipped"
    CANCELLED = "Cancelled"


class Condition(CamelModel):
    """A Kubernetes condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="Ready, Suspended, Failing or DeadLettered.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", max_length=1024, description="CamelCase reason.")
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(None, ge=0)


class RunCounters(CamelModel):
    """Occurrences by outcome, over the history the store keeps."""

    succeeded: int = Field(0, ge=0, description="Occurrences that succeeded.")
    failed: int = Field(0, ge=0, description="Failed attempts (each retry counts).")
    dead: int = Field(0, ge=0, description="Occurrences dead-lettered.")
    missed: int = Field(0, ge=0, description="Instants missed (misfire policy).")
    skipped: int = Field(0, ge=0, description="Occurrences skipped (concurrency policy).")


MAX_ACTIVE_REFS = 10
"""status.active lists at most this many running Jobs (status.activeCount counts them all)."""


class JobReference(CamelModel):
    """A running Job, as a CronJob's status.active lists it (an ObjectReference)."""

    api_version: str = Field("batch/v1", max_length=64, description="Always batch/v1.")
    kind: str = Field("Job", max_length=64, description="Always Job.")
    name: str = Field(max_length=63, description="The Job's name.")
    namespace: str = Field(max_length=63, description="The Job's namespace (the ScheduledJob's).")


class ScheduledJobStatus(CamelModel):
    """What the operator reports: computed from the store, written to the status subresource."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = Field(
        None, ge=0, description="The metadata.generation the store runs."
    )
    next_schedule_time: datetime | None = Field(None, description="Next nominal instant.")
    last_schedule_time: datetime | None = Field(
        None, description="Nominal instant of the latest occurrence that started."
    )
    last_successful_time: datetime | None = Field(None, description="When a run last succeeded.")
    last_failure_time: datetime | None = Field(None, description="When an attempt last failed.")
    last_result: LastResult | None = Field(None, description="Outcome of the latest finished run.")
    last_duration: str | None = Field(
        None, max_length=64, description="Duration of the latest finished run, e.g. 1.5s."
    )
    consecutive_failures: int = Field(0, ge=0, description="Dead-lettered runs in a row.")
    active: list[JobReference] | None = Field(
        None,
        max_length=MAX_ACTIVE_REFS,
        description="The running Jobs of a job target, as a CronJob lists them (so "
        "`.status.active[*].name` works as for a CronJob): the newest "
        f"{MAX_ACTIVE_REFS} at most; absent when none runs, and for other targets. "
        "activeCount counts every active occurrence.",
    )
    active_count: int = Field(0, ge=0, description="Occurrences running or waiting to retry.")
    counters: RunCounters = Field(default_factory=RunCounters)
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    kopf: dict[str, Any] | None = Field(
        None, description="The operator framework's own bookkeeping (kopf); do not edit."
    )
