"""Pydantic model of the `WorkerPool` resource: which Deployment runs a pool and how the
operator pre-scales it ahead of known bursts (see cronwell.forecast). The pool is the
WorkerPool's `metadata.name` (the `pool` of the ScheduledJobs it runs)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cronwell.models import CamelModel as _Model
from cronwell.models import Condition, ObjectMeta


class TargetApiVersion(StrEnum):
    APPS_V1 = "apps/v1"


class TargetKind(StrEnum):
    """Kinds the operator scales (an enum, so the API server rejects others at apply time)."""

    DEPLOYMENT = "Deployment"


class ScaleTargetRef(_Model):
    """The workload the operator scales through its scale subresource."""

    api_version: TargetApiVersion = Field(
        TargetApiVersion.APPS_V1, description="API group/version (apps/v1)."
    )
    kind: TargetKind = Field(TargetKind.DEPLOYMENT, description="Kind (Deployment).")
    name: str = Field(
        min_length=1, max_length=253, description="Name of the Deployment, in the pool's namespace."
    )


class LabelSelectorRequirement(_Model):
    """One matchExpressions entry of a Kubernetes label selector."""

    key: str = Field(min_length=1, max_length=317, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[str] = Field(default_factory=list, description="Values for In and NotIn.")


class LabelSelector(_Model):
    """A Kubernetes label selector over Namespaces."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels to equal.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Label requirements."
    )


class WorkerPoolSpec(_Model):
    """How many workers a pool may have and how far ahead of a burst they must be ready."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.maxReplicas >= self.minReplicas",
                    "message": "spec.maxReplicas must be >= spec.minReplicas",
                    "fieldPath": ".maxReplicas",
                }
            ]
        }
    )

    scale_target_ref: ScaleTargetRef = Field(description="The worker Deployment of this pool.")
    min_replicas: int = Field(1, ge=0, le=10000, description="Never fewer replicas.")
    max_replicas: int = Field(10, ge=1, le=10000, description="Never more replicas.")
    concurrency_per_replica: int = Field(
        64, ge=1, le=100000, description="Attempts one worker runs at once (its --concurrency)."
    )
    lead_time_seconds: int = Field(
        60, ge=0, le=3600, description="Pod start + warm-up: scale up this long before a burst."
    )
    scale_down_delay_seconds: int = Field(
        120, ge=0, le=86400, description="Hold the replicas this long after the last need."
    )
    start_slo_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        validation_alias="startSLOSeconds",
        serialization_alias="startSLOSeconds",
        description="Each occurrence should start within this of its time.",
    )
    default_duration_seconds: float = Field(
        1.0, gt=0, le=86400, description="Duration assumed for jobs without history."
    )
    namespaces: list[str] | None = Field(
        None,
        description="Namespaces whose ScheduledJobs may use this pool, besides the "
        "WorkerPool's own ('*': any namespace).",
    )
    namespace_selector: LabelSelector | None = Field(
        None, description="Namespaces (by label) that may use this pool, besides those listed."
    )
    handlers: list[str] | None = Field(
        None, description="Handlers this pool serves (unset: any registered in its image)."
    )

    @model_validator(mode="after")
    def _max_ge_min(self) -> WorkerPoolSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                "spec.maxReplicas must be >= spec.minReplicas "
                f"(maxReplicas {self.max_replicas} < minReplicas {self.min_replicas})"
            )
        return self


class NextBurst(_Model):
    """The next time the forecast needs more than minReplicas."""

    time: datetime = Field(description="When the next burst starts (UTC).")
    size: int = Field(ge=0, description="Occurrences due in it.")


class LastPreScale(_Model):
    """The latest scale-up, and whether its pods were Ready before the burst it was for
    (replicas merely set would say nothing about image pulls, start-up and probes)."""

    time: datetime = Field(description="When the operator last scaled up ahead of a burst.")
    replicas: int = Field(ge=0, description="Replicas it asked for.")
    burst_time: datetime | None = Field(None, description="Start of the burst it was for.")
    ready_at: datetime | None = Field(
        None,
        description="When the operator first saw that many pods Ready (the Deployment's "
        "status.readyReplicas >= replicas; it looks about every second while waiting). "
        "burstTime - readyAt is the lead achieved.",
    )
    landed_before_burst: bool | None = Field(
        None,
        description="Whether the Deployment had those replicas Ready (status.readyReplicas, "
        "pods passing their readiness probes), not merely set, before the burst started "
        "(unset while neither has happened yet).",
    )


class PoolCondition(Condition):
    """A condition of a WorkerPool."""

    type: str = Field(max_length=316, description="Ready or TargetFound.")


class WorkerPoolStatus(_Model):
    """What the operator reports for a pool (status subresource)."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = Field(None, ge=0)
    desired_replicas: int | None = Field(None, ge=0, description="Replicas the plan wants now.")
    current_replicas: int | None = Field(
        None, ge=0, description="Replicas the target is set to (spec.replicas of its scale)."
    )
    next_burst: NextBurst | None = None
    last_pre_scale: LastPreScale | None = None
    conditions: list[PoolCondition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    kopf: dict[str, Any] | None = Field(
        None, description="The operator framework's own bookkeeping (kopf); do not edit."
    )


class WorkerPool(BaseModel):
    """A whole WorkerPool document."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    api_version: Literal["cronwell.dev/v1alpha1"] = Field(
        "cronwell.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["WorkerPool"] = "WorkerPool"
    metadata: ObjectMeta
    spec: WorkerPoolSpec

    @property
    def pool(self) -> str:
        return self.metadata.name
