"""Operator settings, from `cronwell operator` flags or CRONWELL_OPERATOR_* variables.

Grouped as kopf groups its settings (leadership, status, webhook, tenancy, scaling); units
are in the names; each default says why it is what it is. Each group reads its own
variables: the group's env prefix plus the field name, or the field's alias where the
historical name differs (CRONWELL_OPERATOR_LEADER_ELECTION is `leadership.enabled`). The
variable names, and the flags (`flat_name`), are the chart's interface: they do not change
with the grouping.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "CRONWELL_OPERATOR_"


def _config(prefix: str = "") -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=PREFIX + prefix, extra="ignore", frozen=True, populate_by_name=True
    )


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class LeadershipSettings(BaseSettings):
    """Leader election (a coordination.k8s.io Lease), as client-go's defaults."""

    model_config = _config()

    enabled: bool = Field(
        True,
        validation_alias="cronwell_operator_leader_election",
        description="Hold a Lease so that one replica reconciles at a time.",
    )
    lease_name: str = Field("cronwell-operator", description="Name of the Lease object.")
    lease_namespace: str = Field(
        "default", description="Namespace of the Lease (the operator's own namespace)."
    )
    lease_duration_seconds: float = Field(
        15.0, gt=0, description="A standby takes over this long after the last renewal it saw."
    )
    renew_deadline_seconds: float = Field(
        10.0,
        gt=0,
        description="The leader stops reconciling if it could not renew for this long (must "
        "be below the lease duration, so it stops before anyone else can take over).",
    )
    retry_period_seconds: float = Field(
        2.0, gt=0, description="How often the leader renews and standbys try to acquire."
    )


class StatusSettings(BaseSettings):
    """Status write-back (status.py): CR status and Events from the store's change log."""

    model_config = _config("STATUS_")

    qps: float = Field(
        20.0,
        gt=0,
        description="Status patches + Events per second, for the whole operator "
        "(controller-runtime's default QPS): a 50k burst must not flood the API server.",
    )
    burst: int = Field(40, ge=1, description="Requests allowed at once above the QPS.")
    batch_size: int = Field(
        2000, ge=1, description="Change-log rows read per pass (coalesced per job)."
    )
    poll_seconds: float = Field(
        1.0, gt=0, description="Pause between passes when the change log is empty."
    )
    concurrency: int = Field(8, ge=1, description="Status requests in flight at once.")
    declaration_seconds: float = Field(
        30.0,
        ge=3,
        description="How long the writer's declaration in the store lasts unrenewed (renewed "
        "every third of it): the store logs status changes only while one is declared, so a "
        "writer that dies leaves the log filling this long.",
    )


class WebhookSettings(BaseSettings):
    """The validating admission webhook (webhook.py), and its rules that need the cluster
    or the store."""

    model_config = _config("WEBHOOK_")

    port: int | None = Field(
        None, ge=1, le=65535, description="Serve the validating webhook on this port (HTTPS)."
    )
    addr: str = Field("0.0.0.0", description="Listen address of the webhook server.")
    host: str | None = Field(
        None,
        description="Host the API server calls (a URL clientConfig). Unset with a port: "
        "the webhook is served but the cluster's configuration is not managed.",
    )
    cert_dir: str | None = Field(
        None,
        description="tls.crt/tls.key (and ca.crt) for the webhook; missing files are "
        "generated self-signed for webhook.host (local runs only).",
    )
    payload_max_bytes: int = Field(
        65536, ge=1, description="Largest handler payload accepted (JSON bytes)."
    )
    require_known_pool: bool = Field(
        True,
        description="Refuse a spec.pool that is neither a WorkerPool nor in `tenancy.pools`: "
        "nothing would ever run the job.",
    )
    pool_cache_seconds: float = Field(
        5.0,
        ge=0,
        description="How long the WorkerPool names listed for admission are reused (one "
        "list per few seconds keeps admission fast during a bulk apply).",
    )
    job_namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces where the workers may create Jobs (the chart's "
        "jobTarget.namespaces, each with a Role for the workers and the operator): a job "
        "target elsewhere is refused; '*' allows any (a cluster-wide grant, local runs).",
    )
    max_occurrences_per_hour: int = Field(
        60_000,
        ge=1,
        description="Default cap on a namespace's scheduled runs per hour (the Namespace "
        "annotation cronwell.dev/max-occurrences-per-hour overrides it): one team's typo "
        "(every second instead of every minute) must not starve the others' workers.",
    )


class TenancySettings(BaseSettings):
    """Static pools and the sync of tenancy facts into the store (tenancy_sync.py)."""

    model_config = _config()

    pools: list[str] = Field(
        default_factory=lambda: ["default"],
        description="Static pools served by worker Deployments without a WorkerPool object "
        "(the chart passes its worker pool names); 'default' is the pool of a spec that "
        "names none.",
    )
    pool_namespaces: dict[str, str] = Field(
        default_factory=dict,
        description="Static pools' namespaces, comma-separated per pool ('*': any, the "
        "default of a pool not listed); the chart passes worker.pools[].namespaces.",
    )
    pool_handlers: dict[str, str] = Field(
        default_factory=dict,
        description="Static pools' handlers, comma-separated per pool (a pool not listed "
        "serves any handler).",
    )
    sync_seconds: float = Field(
        30.0,
        gt=0,
        validation_alias="cronwell_operator_tenancy_sync_seconds",
        description="How often Namespaces, WorkerPools and Secret-backed header values are "
        "synced into the store for the workers: a rotated Secret reaches the next attempt "
        "within this. Each pass lists Namespaces and WorkerPools and GETs each distinct "
        "referenced Secret once: 30 s keeps that light with thousands of Secrets.",
    )


class ScalingSettings(BaseSettings):
    """Pre-scaling of WorkerPools (scaler.py, planning in cronwell.prescale)."""

    model_config = _config()

    enabled: bool = Field(
        True,
        validation_alias="cronwell_operator_prescale",
        description="Forecast each WorkerPool's demand and scale its Deployment ahead of "
        "bursts (off: WorkerPools are left alone).",
    )
    interval_seconds: float = Field(
        5.0,
        gt=0,
        validation_alias="cronwell_operator_scale_interval_seconds",
        description="Longest pause between two forecasts (the loop also wakes at each planned "
        "change, so a scale-up lands leadTimeSeconds before its burst whatever this is); "
        "5 s keeps the store's forecast queries cheap and reacts to new schedules quickly.",
    )
    forecast_horizon_seconds: float = Field(
        900.0,
        gt=0,
        le=86400,
        description="How far ahead bursts are forecast: must exceed every WorkerPool's "
        "leadTimeSeconds (15 min covers pod start-up and node provisioning).",
    )


_GROUPS: dict[str, type[BaseSettings]] = {
    "leadership": LeadershipSettings,
    "status": StatusSettings,
    "webhook": WebhookSettings,
    "tenancy": TenancySettings,
    "scaling": ScalingSettings,
}


class OperatorSettings(BaseSettings):
    model_config = _config()

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to serve; empty = the whole cluster. Drift repair only "
        "tombstones store rows of these namespaces.",
    )
    identity: str = Field(
        default_factory=_default_identity,
        description="This replica's identity: the Lease holder, and the reporting instance "
        "of its Events.",
    )
    leadership: LeadershipSettings = Field(default_factory=LeadershipSettings)
    status: StatusSettings = Field(default_factory=StatusSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    tenancy: TenancySettings = Field(default_factory=TenancySettings)
    scaling: ScalingSettings = Field(default_factory=ScalingSettings)

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> OperatorSettings:
        """Settings from flat names (`status_qps`, `prescale`: the flags' and variables'
        names); what is not given comes from the environment, else the defaults."""
        where = flat_names()
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
        for key, value in values.items():
            if key in cls.model_fields and key not in _GROUPS:
                top[key] = value
            elif key in where:
                group, name = where[key]
                groups[group][name] = value
            else:
                raise ValueError(f"unknown operator setting {key!r}")
        built: dict[str, Any] = {g: _GROUPS[g](**kw) for g, kw in groups.items()}
        return cls(**top, **built)


def flat_name(group: type[BaseSettings], field: str) -> str:
    """A group field's flat name: its variable without CRONWELL_OPERATOR_, lower case."""
    info = group.model_fields[field]
    if isinstance(info.validation_alias, str):
        return info.validation_alias.lower().removeprefix(PREFIX.lower())
    prefix = str(group.model_config.get("env_prefix", "")).removeprefix(PREFIX)
    return (prefix + field).lower()


def flat_names() -> dict[str, tuple[str, str]]:
    """Every group field by its flat name: (group, field)."""
    return {
        flat_name(model, field): (group, field)
        for group, model in _GROUPS.items()
        for field in model.model_fields
    }
