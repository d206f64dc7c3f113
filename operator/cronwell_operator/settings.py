"""Operator settings, from `cronwell operator` flags or CRONWELL_OPERATOR_* variables.
Units are in the names; each default says why it is what it is."""

from __future__ import annotations

import os
import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CRONWELL_OPERATOR_", extra="ignore", frozen=True)

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to serve; empty = the whole cluster. Drift repair only "
        "tombstones store rows of these namespaces.",
    )
    # -- leader election (coordination.k8s.io Lease), as client-go's defaults
    leader_election: bool = Field(
        True, description="Hold a Lease so that one replica reconciles at a time."
    )
    lease_name: str = Field("cronwell-operator", description="Name of the Lease object.")
    lease_namespace: str = Field(
        "default", description="Namespace of the Lease (the operator's own namespace)."
    )
    identity: str = Field(
        default_factory=_default_identity, description="This replica's Lease holder identity."
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
    # -- status write-back
    status_qps: float = Field(
        20.0,
        gt=0,
        description="Status patches + Events per second, for the whole operator "
        "(controller-runtime's default QPS): a 50k burst must not flood the API server.",
    )
    status_burst: int = Field(40, ge=1, description="Requests allowed at once above the QPS.")
    status_batch_size: int = Field(
        2000, ge=1, description="Change-log rows read per pass (coalesced per job)."
    )
    status_poll_seconds: float = Field(
        1.0, gt=0, description="Pause between passes when the change log is empty."
    )
    status_concurrency: int = Field(8, ge=1, description="Status requests in flight at once.")
    # -- admission webhook
    webhook_port: int | None = Field(
        None, ge=1, le=65535, description="Serve the validating webhook on this port (HTTPS)."
    )
    webhook_addr: str = Field("0.0.0.0", description="Listen address of the webhook server.")
    webhook_host: str | None = Field(
        None,
        description="Host the API server calls (a URL clientConfig). Unset with a port: "
        "the webhook is served but the cluster's configuration is not managed.",
    )
    webhook_cert_dir: str | None = Field(
        None,
        description="tls.crt/tls.key (and ca.crt) for the webhook; missing files are "
        "generated self-signed for webhook_host (local runs only).",
    )
    webhook_payload_max_bytes: int = Field(
        65536, ge=1, description="Largest handler payload accepted (JSON bytes)."
    )
    # -- admission (rules that need the cluster or the store)
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
    tenancy_sync_seconds: float = Field(
        30.0,
        gt=0,
        description="How often Namespaces, WorkerPools and Secret-backed header values are "
        "synced into the store for the workers: a rotated Secret reaches the next attempt "
        "within this. Each pass lists Namespaces and WorkerPools and GETs each distinct "
        "referenced Secret once: 30 s keeps that light with thousands of Secrets.",
    )
    webhook_require_known_pool: bool = Field(
        True,
        description="Refuse a spec.pool that is neither a WorkerPool nor in `pools`: nothing "
        "would ever run the job.",
    )
    webhook_pool_cache_seconds: float = Field(
        5.0,
        ge=0,
        description="How long the WorkerPool names listed for admission are reused (one "
        "list per few seconds keeps admission fast during a bulk apply).",
    )
    webhook_max_occurrences_per_hour: int = Field(
        60_000,
        ge=1,
        description="Default cap on a namespace's scheduled runs per hour (the Namespace "
        "annotation cronwell.dev/max-occurrences-per-hour overrides it): one team's typo "
        "(every second instead of every minute) must not starve the others' workers.",
    )
    # -- pre-scaling (WorkerPools: operator/cronwell_operator/scaler.py)
    prescale: bool = Field(
        True,
        description="Forecast each WorkerPool's demand and scale its Deployment ahead of "
        "bursts (off: WorkerPools are left alone).",
    )
    scale_interval_seconds: float = Field(
        5.0,
        gt=0,
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
