"""Settings, grouped by process, from CLI flags or CRONWELL_* environment variables.
Units are in the names; each default says why it is what it is."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cronwell.egress import EgressPolicy, split_list


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CRONWELL_", extra="ignore", frozen=True)


class DatabaseSettings(_Settings):
    database_url: str | None = Field(
        None, description="PostgreSQL URL. Unset: an embedded PostgreSQL in data_dir."
    )
    database_url_file: Path | None = Field(
        None, description="File holding the URL (a mounted Secret); excludes database_url."
    )
    database_read_url: str | None = Field(
        None,
        description="A streaming replica of it, for reads that tolerate staleness (the "
        "read-only CLI views, the dashboard's pages, the forecast). Unset: the primary.",
    )
    database_read_url_file: Path | None = Field(
        None,
        description="File holding the read URL (a mounted Secret); excludes database_read_url.",
    )
    database_read_max_lag_seconds: float = Field(
        30.0,
        gt=0,
        le=300,
        description="A replica further behind serves no reads (they go to the primary): "
        "half a minute is stale for a page refreshed every few seconds, yet rides out a "
        "burst's replay backlog. At most 5 minutes: the forecast rereads the runs finished "
        "in the 5 minutes before its previous read (fleet_forecast.FINISH_SLACK), so a copy "
        "further behind could hide a run's duration from it.",
    )
    database_read_check_seconds: float = Field(
        5.0,
        gt=0,
        description="How often the replica's lag is checked (one query), and how long reads "
        "stay on the primary after the replica failed.",
    )
    data_dir: Path = Field(
        Path(platformdirs.user_data_dir("cronwell")),
        description="Where the embedded PostgreSQL keeps its data (reused across runs).",
    )
    pool_min_size: int = Field(1, ge=1, description="Connections kept open per process.")
    pool_max_size: int = Field(
        8, ge=1, description="Per process: claim, heartbeat, complete and listen share it."
    )
    connect_timeout_seconds: float = Field(
        10.0, gt=0, description="How long to wait for the database before a clear error."
    )
    deadline_seconds: float = Field(
        10.0,
        gt=0,
        description="Longest a database call (a whole transaction) may take: past it the "
        "connection is dropped and the call retried on another, so a primary that went "
        "silent never wedges a process. Far above any statement's time under load.",
    )


class SchedulerSettings(_Settings):
    partitions: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Expected partition count. The store holds P (set when it is created, "
        "changed with `cronwell partitions set`); a scheduler configured with another P "
        "refuses to start. Unset: use the store's.",
    )
    horizon_seconds: float = Field(
        30.0,
        gt=0,
        description="Materialise this far ahead, so a :00 burst is in the table "
        "before it is due and workers only claim. A job is visited when its next instant "
        "is within half of this (or two ticks), then materialised to all of it.",
    )
    partition_lease_seconds: float = Field(
        10.0,
        gt=0,
        description="Partition lease TTL; a dead scheduler's partitions are taken over within it.",
    )
    tick_seconds: float = Field(
        1.0, gt=0, description="Pause between materialisation passes when nothing is due."
    )
    batch_size: int = Field(
        1000, ge=1, description="Jobs per materialisation transaction (one NOTIFY each)."
    )
    misfire_threshold_seconds: float = Field(
        60.0,
        gt=0,
        description="An instant later than this (or the job's "
        "startingDeadlineSeconds) at materialisation has misfired (Quartz's default).",
    )
    reap_batch_size: int = Field(1000, ge=1, description="Expired leases reaped per pass.")
    retention_seconds: float = Field(
        7 * 86400.0,
        gt=0,
        description="Store-wide retention: all run history (whole partitions, by nominal "
        "instant; dead runs included: replay them within it) and drained bookkeeping older "
        "than this is dropped; a week covers incident reviews. On an unpartitioned store only "
        "finished runs of deleted and one-shot jobs.",
    )
    history_partition_seconds: int = Field(
        86400,
        ge=60,
        le=86400,
        description="Width of new history partitions (one per day; an hour at high rates; "
        "minutes only for a retention of minutes: tests, soaks); must divide a day. "
        "Partitions are created two days (at most 48 partitions) ahead.",
    )

    @field_validator("history_partition_seconds")
    @classmethod
    def _divides_a_day(cls, v: int) -> int:
        if 86400 % v:
            raise ValueError(f"{v} does not divide a day (86400 s): use e.g. 3600, 21600, 86400")
        return v

    prune_interval_seconds: float = Field(
        60.0,
        gt=0,
        description="Pause between prune passes (history limits, retention); a minute keeps "
        "history within a minute's runs of the limits at a negligible cost.",
    )
    prune_batch_rows: int = Field(
        1000,
        ge=1,
        description="Rows deleted per statement while pruning: short transactions, no long locks.",
    )


class WorkerSettings(_Settings):
    pool: str = Field("default", description="The worker pool whose occurrences this claims.")
    concurrency: int = Field(
        64, ge=1, description="Attempts run at once per worker process (asyncio tasks)."
    )
    lease_seconds: float = Field(
        60.0, gt=0, description="Occurrence lease; heartbeats renew it every third of it."
    )
    claim_batch_size: int = Field(
        512,
        ge=1,
        description="Most occurrences per claim query (512: as many job locks as the "
        "default 8 connections' share of PostgreSQL's lock table; a 50,000 burst's claims "
        "ahead cost the workers about a tenth less CPU than at 256).",
    )
    claim_ahead_seconds: float = Field(
        2.0,
        ge=0,
        description="The least claim-ahead window: occurrences due within this many seconds "
        "are always claimed before their instant and started at it (a local timer aligned "
        "to the database clock). A coming burst widens the window (see "
        "claim_ahead_max_seconds); 0 claims only what is due.",
    )
    claim_ahead_max_seconds: float = Field(
        30.0,
        ge=0,
        description="The widest claim-ahead window: a coming burst is claimed from "
        "(its share / the measured claim rate + a margin) before its instant, at most this "
        "early (the scheduler materialises at least half of horizon_seconds ahead).",
    )
    claim_ahead_margin_seconds: float = Field(
        1.0,
        ge=0,
        description="A coming burst's claim starts this much earlier than its share takes "
        "to claim at the measured rate.",
    )
    claim_ahead_max: int = Field(
        50_000,
        ge=0,
        description="Most occurrences one worker holds claimed ahead, waiting for their "
        "instant (a row in memory each, not a handler slot).",
    )
    poll_seconds: float = Field(
        5.0, gt=0, description="Polling fallback when LISTEN/NOTIFY is silent."
    )
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, description="On SIGTERM, how long running attempts may finish."
    )
    complete_flush_seconds: float = Field(
        0.005, ge=0, description="Successful completions are written in batches this often."
    )
    completion_hold_seconds: float = Field(
        1.0,
        ge=0,
        description="Starts before completions: while attempts are due to start (within "
        "50 ms) or starting, completion writes wait, at most this long, then go in one "
        "larger batch.",
    )
    pool_namespaces: str = Field(
        "*",
        description="Static pool policy: namespaces whose jobs this pool runs, comma-separated "
        "('*': any; the chart sets it from worker.pools). WorkerPools' policies come from the "
        "store and apply too.",
    )
    pool_handlers: str | None = Field(
        None, description="Static pool policy: handlers it serves, comma-separated (unset: any)."
    )
    policy_refresh_seconds: float = Field(
        5.0,
        gt=0,
        description="How long namespace and pool policies read from the store are reused.",
    )


class EgressSettings(_Settings):
    """The cluster's egress policy for http targets (cronwell.egress); the same variables
    on the operator (admission), `cronwell apply` and the workers (connect time)."""

    egress_allow_cidrs: str = Field(
        "",
        description="CIDRs exempt from the built-in deny list, comma-separated (e.g. "
        "127.0.0.1/32 for a local test server). Empty: the secure default.",
    )
    egress_allow_hosts: str = Field(
        "", description="Host patterns exempt from the built-in deny list (*.svc.local)."
    )
    egress_deny_cidrs: str = Field("", description="CIDRs no http target may reach.")
    egress_deny_hosts: str = Field("", description="Host patterns no http target may reach.")

    def policy(self) -> EgressPolicy:
        return EgressPolicy.from_lists(
            allow_cidrs=split_list(self.egress_allow_cidrs),
            allow_hosts=split_list(self.egress_allow_hosts),
            deny_cidrs=split_list(self.egress_deny_cidrs),
            deny_hosts=split_list(self.egress_deny_hosts),
        )


class SecretsSettings(_Settings):
    """The key that encrypts Secret-backed header values in the store (cronwell.secretbox);
    the operator and the workers need the same one (the chart's secrets Secret)."""

    secrets_key: str | None = Field(
        None, description="Fernet key(s), comma-separated, newest first (key rotation)."
    )
    secrets_key_file: Path | None = Field(
        None, description="File holding the key(s) (a mounted Secret); wins over secrets_key."
    )
