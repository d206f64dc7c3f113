-- 0001: jobs, occurrences, attempts, scheduler partitions, worker registry, outbox, fences.

-- One row per ScheduledJob (identity = CR uid). Deleted jobs are tombstoned (deleted_at)
-- so the history of their occurrences survives until the history limits prune it.
CREATE TABLE cronwell_jobs (
    id              uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    name            text        NOT NULL,
    spec            jsonb       NOT NULL,
    spec_hash       text        NOT NULL,
    generation      bigint      NOT NULL DEFAULT 1,
    pool            text        NOT NULL,
    partition       integer     NOT NULL,
    -- Nominal instant of the next occurrence not yet materialised; NULL = schedule ended.
    next_run_at     timestamptz,
    suspended       boolean     NOT NULL DEFAULT false,
    suspended_reason text,
    consecutive_failures integer NOT NULL DEFAULT 0,
    missed_total    bigint      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz
);
CREATE UNIQUE INDEX cronwell_jobs_live_name ON cronwell_jobs (namespace, name)
    WHERE deleted_at IS NULL;
-- The due scan: an index range scan per owned partition, in next_run_at order.
CREATE INDEX cronwell_jobs_due ON cronwell_jobs (partition, next_run_at)
    WHERE NOT suspended AND deleted_at IS NULL AND next_run_at IS NOT NULL;

-- Fence tokens: one global sequence, so tokens for any key are strictly increasing.
CREATE SEQUENCE cronwell_fence AS bigint;

-- One row per scheduled occurrence; idempotency_key is the identity that arbitrates races.
CREATE TABLE cronwell_occurrences (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key  text        NOT NULL,
    job_id           uuid        NOT NULL REFERENCES cronwell_jobs (id),
    pool             text        NOT NULL,
    scheduled_for    timestamptz NOT NULL,   -- nominal instant (identity)
    run_at           timestamptz NOT NULL,   -- claimable from (jitter, retry backoff)
    state            text        NOT NULL CHECK (state IN ('pending', 'waiting', 'running',
                         'succeeded', 'dead', 'skipped', 'missed', 'cancelled')),
    reason           text,
    origin           text        NOT NULL DEFAULT 'schedule',  -- schedule|catchup|trigger|backfill
    overlap          text        NOT NULL,
    delivery         text        NOT NULL,
    max_attempts     integer     NOT NULL,
    timeout_seconds  integer     NOT NULL,
    attempt          integer     NOT NULL DEFAULT 0,
    fence            bigint,
    worker_id        text,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT cronwell_occurrences_key UNIQUE (idempotency_key)
);
-- Worker claim: pending rows of a pool in run_at order.
CREATE INDEX cronwell_occurrences_claim ON cronwell_occurrences (pool, run_at)
    WHERE state = 'pending';
-- Reaper: running rows by lease expiry.
CREATE INDEX cronwell_occurrences_lease ON cronwell_occurrences (lease_expires_at)
    WHERE state = 'running';
CREATE INDEX cronwell_occurrences_job ON cronwell_occurrences (job_id, scheduled_for DESC);
-- Overlap checks look for the active/waiting occurrences of a job.
CREATE INDEX cronwell_occurrences_active ON cronwell_occurrences (job_id)
    WHERE state IN ('running', 'waiting') OR (state = 'pending' AND attempt > 0);
CREATE INDEX cronwell_occurrences_finished ON cronwell_occurrences (finished_at)
    WHERE finished_at IS NOT NULL;

-- One row per finished attempt (success, failure, lease expiry, cancellation).
CREATE TABLE cronwell_attempts (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurrence_id    bigint      NOT NULL REFERENCES cronwell_occurrences (id) ON DELETE CASCADE,
    idempotency_key  text        NOT NULL,
    attempt          integer     NOT NULL,
    fence            bigint      NOT NULL,
    worker_id        text,
    outcome          text        NOT NULL CHECK (outcome IN ('succeeded', 'failed',
                         'lease_expired', 'cancelled', 'timeout')),
    error            text,
    started_at       timestamptz,
    finished_at      timestamptz NOT NULL DEFAULT now()
);
-- Invariant 1, enforced by the database: at most one successful completion per key, ever.
CREATE UNIQUE INDEX cronwell_attempts_one_success ON cronwell_attempts (idempotency_key)
    WHERE outcome = 'succeeded';
CREATE INDEX cronwell_attempts_occurrence ON cronwell_attempts (occurrence_id);

-- Scheduler partition leases: one owner per partition; a takeover increments the epoch.
CREATE TABLE cronwell_partitions (
    partition   integer     PRIMARY KEY,
    holder      text,
    epoch       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz
);

-- Live process registry (schedulers and workers), kept by heartbeats.
CREATE TABLE cronwell_processes (
    id           text        PRIMARY KEY,
    role         text        NOT NULL CHECK (role IN ('scheduler', 'worker')),
    pool         text,
    hostname     text,
    pid          integer,
    version      text,
    concurrency  integer,
    running      integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Transactional outbox: rows written in the job's own transaction, relayed at least once.
CREATE TABLE cronwell_outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL,
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text
);
CREATE INDEX cronwell_outbox_unpublished ON cronwell_outbox (id) WHERE published_at IS NULL;

-- Fenced writes to users' resources: a write with a fence below the highest seen is stale.
CREATE TABLE cronwell_fences (
    resource    text        PRIMARY KEY,
    fence       bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
