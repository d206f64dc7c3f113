-- All runtime SQL of cronwell. Each query: `-- name: NounVerb` then a one-line comment.
-- Every time comparison uses the database clock, now() (invariant 6).

-- name: JobDueClaim
-- Due jobs (next_run_at within the horizon) of one partition this holder owns right now at
-- this epoch, oldest first, locked so concurrent materialisers never process a job twice.
-- One partition per query keeps it an ordered index range scan that stops at the limit.
SELECT j.id, j.spec, j.spec_hash, j.pool, j.next_run_at, j.resumed_at, now() AS db_now
FROM cronwell_jobs j
WHERE j.partition = %(partition)s
  AND EXISTS (SELECT 1 FROM cronwell_partitions p
              WHERE p.partition = %(partition)s AND p.holder = %(holder)s
                AND p.epoch = %(epoch)s AND p.expires_at > now())
  AND NOT j.suspended AND j.deleted_at IS NULL AND j.next_run_at IS NOT NULL
  AND j.next_run_at <= now() + make_interval(secs => %(horizon)s)
ORDER BY j.next_run_at
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED;

-- name: OccurrenceInsertBatch
-- Materialises occurrences; the unique key makes any re-materialisation a no-op.
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, origin, overlap, delivery, max_attempts, timeout_seconds, finished_at)
SELECT k, j, p, s, r, st, rs, o, ov, d, ma, ts, CASE WHEN st = 'missed' THEN now() END
FROM unnest(%(keys)s::text[], %(job_ids)s::uuid[], %(pools)s::text[],
            %(scheduled_for)s::timestamptz[], %(run_at)s::timestamptz[], %(states)s::text[],
            %(reasons)s::text[], %(origins)s::text[], %(overlaps)s::text[],
            %(deliveries)s::text[], %(max_attempts)s::int[], %(timeouts)s::int[])
     AS t(k, j, p, s, r, st, rs, o, ov, d, ma, ts)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: JobAdvanceBatch
-- Moves each job's cursor past what was materialised and counts its missed instants.
UPDATE cronwell_jobs j
SET next_run_at = t.next_run_at, missed_total = j.missed_total + t.missed, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(next_run_at)s::timestamptz[], %(missed)s::int[])
     AS t(id, next_run_at, missed)
WHERE j.id = t.id;

-- name: DueNotify
-- One notification per materialised batch (never per row): pool -> earliest run_at.
SELECT pg_notify('cronwell_due', %(payload)s);

-- name: JobNameLock
-- Serialises upserts of one namespace/name (two concurrent applies of a new name: the
-- second waits, then finds the first's row instead of violating the unique name).
SELECT pg_advisory_xact_lock(7367, hashtext(%(namespace)s || '/' || %(name)s));

-- name: JobGetLive
-- The live job of a namespace/name, locked for an upsert or delete.
SELECT id, spec, spec_hash, generation, suspended, next_run_at
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: JobGetById
-- A job by uid (live or tombstoned), locked for an upsert or delete.
SELECT id, namespace, name, spec, spec_hash, generation, suspended, next_run_at, deleted_at
FROM cronwell_jobs WHERE id = %(id)s FOR UPDATE;

-- name: JobInsert
-- A new job.
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, generation, pool, partition,
                           next_run_at, suspended)
VALUES (%(id)s, %(namespace)s, %(name)s, %(spec)s, %(spec_hash)s, %(generation)s, %(pool)s,
        %(partition)s, %(next_run_at)s, %(suspended)s);

-- name: JobUpdate
-- A changed spec (next_run_at recomputed by the caller when the schedule changed).
UPDATE cronwell_jobs
SET spec = %(spec)s, spec_hash = %(spec_hash)s, generation = %(generation)s, pool = %(pool)s,
    next_run_at = %(next_run_at)s, suspended = %(suspended)s,
    suspended_reason = CASE WHEN %(suspended)s THEN suspended_reason END,
    resumed_at = CASE WHEN suspended AND NOT %(suspended)s THEN now() ELSE resumed_at END,
    updated_at = now()
WHERE id = %(id)s;

-- name: JobFutureOccurrencesDelete
-- Unstarted future occurrences of a job, removed when its schedule changes (no fence was
-- ever issued for them, so no effect can have happened). Returns the earliest removed.
WITH gone AS (
    DELETE FROM cronwell_occurrences
    WHERE job_id = %(id)s AND state = 'pending' AND attempt = 0 AND origin = 'schedule'
      AND scheduled_for > now()
    RETURNING scheduled_for)
SELECT min(scheduled_for) AS earliest, count(*) AS n FROM gone;

-- name: JobLatestScheduled
-- The latest nominal instant already materialised for a job (the cursor must not go back).
SELECT max(scheduled_for) AS latest FROM cronwell_occurrences
WHERE job_id = %(id)s AND origin IN ('schedule', 'catchup');

-- name: JobTombstone
-- Deletes a job: keeps its history, drops its unstarted occurrences.
WITH j AS (
    UPDATE cronwell_jobs SET deleted_at = now(), next_run_at = NULL, updated_at = now()
    WHERE id = %(id)s AND deleted_at IS NULL RETURNING id)
DELETE FROM cronwell_occurrences o USING j
WHERE o.job_id = j.id AND o.state IN ('pending', 'waiting') AND o.attempt = 0;

-- name: JobSuspendSet
-- Suspends or resumes a job; a resume records its instant (the instants before it that the
-- suspension skipped are missed, reason Suspended, with at most the misfire policy's
-- catch-up).
UPDATE cronwell_jobs SET suspended = %(suspended)s, suspended_reason = %(reason)s,
                         resumed_at = CASE WHEN suspended AND NOT %(suspended)s THEN now()
                                           ELSE resumed_at END,
                         updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL;

-- name: JobList
-- Live jobs with their counters for `cronwell jobs` / status.
SELECT id, namespace, name, pool, spec, next_run_at, suspended, suspended_reason,
       consecutive_failures, missed_total
FROM cronwell_jobs WHERE deleted_at IS NULL
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
ORDER BY namespace, name;

-- name: OccurrenceTriggerInsert
-- A manual trigger: runs now, idempotent per trigger id (the key carries it).
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    origin, overlap, delivery, max_attempts, timeout_seconds)
VALUES (%(key)s, %(job_id)s, %(pool)s, now(), now(), 'pending', 'trigger', %(overlap)s,
        %(delivery)s, %(max_attempts)s, %(timeout_seconds)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: OccurrenceClaimCandidates
-- Due pending occurrences of a pool, oldest first, locked against other workers.
SELECT id, job_id, overlap, attempt, scheduled_for
FROM cronwell_occurrences
WHERE pool = %(pool)s AND state = 'pending' AND run_at <= now()
ORDER BY run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: JobLockBatch
-- Locks the jobs whose overlap policy serialises their occurrences (claims and
-- completions of one job pass through this lock, so its active set is read fresh). Returns
-- a count, not the ids: nobody reads them.
SELECT count(*) AS locked
FROM (SELECT id FROM cronwell_jobs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE) l;

-- name: JobActiveOccurrences
-- Running, retrying and waiting occurrences of the given jobs (read after JobLockBatch).
SELECT id, job_id, state, idempotency_key FROM cronwell_occurrences
WHERE job_id = ANY(%(ids)s::uuid[])
  AND (state IN ('running', 'waiting') OR (state = 'pending' AND attempt > 0));

-- name: OccurrenceSettleBatch
-- Overlap decisions for claimed candidates: skipped, waiting or cancelled (Replace).
UPDATE cronwell_occurrences o
SET state = t.state, reason = t.reason, lease_expires_at = NULL,
    finished_at = CASE WHEN t.state = 'waiting' THEN NULL ELSE now() END
FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(reasons)s::text[]) AS t(id, state, reason)
WHERE o.id = t.id;

-- name: OccurrenceClaimBatch
-- Starts the chosen occurrences: lease, a new fence token each, attempt + 1. Returns the
-- job's spec hash, not its spec (workers cache parsed specs by hash, JobSpecBatch fetches
-- unknown ones); the job is read by primary key per row (LIMIT 1 keeps the planner from a
-- hash join that scanned every job for each batch).
WITH started AS (
    UPDATE cronwell_occurrences o
    SET state = 'running', attempt = o.attempt + 1, fence = nextval('cronwell_fence'),
        worker_id = %(worker_id)s, started_at = now(), reason = NULL,
        lease_expires_at = now() + make_interval(secs => %(lease)s)
    WHERE o.id = ANY(%(ids)s::bigint[])
    RETURNING o.id, o.idempotency_key, o.job_id, o.scheduled_for, o.run_at, o.started_at,
              o.attempt, o.fence, o.delivery, o.max_attempts, o.timeout_seconds, o.origin)
SELECT s.*, j.namespace, j.name, j.spec_hash
FROM started s
CROSS JOIN LATERAL (SELECT namespace, name, spec_hash FROM cronwell_jobs
                    WHERE id = s.job_id LIMIT 1) j;

-- name: JobSpecBatch
-- The current spec of some jobs, for claimed occurrences whose spec hash a worker has not
-- parsed yet (one job per unknown hash: equal hashes are equal specs).
SELECT id, spec_hash, spec FROM cronwell_jobs WHERE id = ANY(%(ids)s::uuid[]);

-- name: WaitingPromote
-- After an active occurrence of a buffered job ends: the oldest waiting one becomes
-- pending (run after JobLockBatch in the same transaction).
UPDATE cronwell_occurrences o SET state = 'pending', run_at = now(), reason = NULL
FROM (SELECT DISTINCT ON (job_id) id FROM cronwell_occurrences
      WHERE job_id = ANY(%(ids)s::uuid[]) AND state = 'waiting'
      ORDER BY job_id, scheduled_for) w
WHERE o.id = w.id
RETURNING o.pool, o.run_at;

-- name: WaitingStranded
-- Jobs with waiting occurrences that no completion will promote: nothing of theirs is
-- running or retrying (e.g. backfilled BufferAll occurrences queued behind a Skip one, whose
-- completion promotes nothing). The reaper promotes them; claims re-check overlap anyway.
SELECT DISTINCT w.job_id FROM cronwell_occurrences w
WHERE w.state = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM cronwell_occurrences a
                  WHERE a.job_id = w.job_id
                    AND (a.state = 'running' OR (a.state = 'pending' AND a.attempt > 0)))
LIMIT %(limit)s;

-- name: OccurrenceNextDue
-- When the next pending occurrence of a pool becomes claimable (workers sleep until then).
SELECT min(run_at) AS next_due, now() AS db_now FROM cronwell_occurrences
WHERE pool = %(pool)s AND state = 'pending';

-- name: OccurrenceHeartbeat
-- Extends the leases of running attempts; a key missing from the result lost its lease.
UPDATE cronwell_occurrences o
SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM unnest(%(keys)s::text[], %(fences)s::bigint[]) AS t(k, f)
WHERE o.idempotency_key = t.k AND o.fence = t.f AND o.state = 'running'
  AND o.worker_id = %(worker_id)s
RETURNING o.idempotency_key;

-- name: OccurrenceSucceedBatch
-- Fenced completion: only the current holder (key + fence, still running) can succeed.
WITH done AS (
    UPDATE cronwell_occurrences o
    SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL, last_error = NULL,
        reason = NULL
    FROM unnest(%(keys)s::text[], %(fences)s::bigint[]) AS t(k, f)
    WHERE o.idempotency_key = t.k AND o.fence = t.f AND o.state = 'running'
    RETURNING o.id, o.idempotency_key, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.finished_at, o.overlap),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence, worker_id,
                                   outcome, started_at, finished_at)
    SELECT id, idempotency_key, attempt, fence, worker_id, 'succeeded', started_at, finished_at
    FROM done),
jobs AS (
    UPDATE cronwell_jobs j SET consecutive_failures = 0
    FROM (SELECT DISTINCT job_id FROM done) d
    WHERE j.id = d.job_id AND j.consecutive_failures <> 0)
SELECT idempotency_key, job_id, overlap FROM done;

-- name: OccurrenceFail
-- Fenced failure of one attempt: back to pending after a backoff, or dead.
WITH failed AS (
    UPDATE cronwell_occurrences o
    SET state = %(next_state)s, reason = %(reason)s, last_error = %(error)s,
        run_at = now() + make_interval(secs => %(delay)s), lease_expires_at = NULL,
        finished_at = CASE WHEN %(next_state)s = 'dead' THEN now() END
    WHERE o.idempotency_key = %(key)s AND o.fence = %(fence)s AND o.state = 'running'
    RETURNING o.id, o.idempotency_key, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.overlap, o.state),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence, worker_id,
                                   outcome, error, started_at)
    SELECT id, idempotency_key, attempt, fence, worker_id, %(outcome)s, %(error)s, started_at
    FROM failed),
jobs AS (
    UPDATE cronwell_jobs j
    SET consecutive_failures = j.consecutive_failures + 1,
        suspended = j.suspended OR coalesce(
            (j.spec ->> 'suspendAfterFailures')::int <= j.consecutive_failures + 1, false),
        suspended_reason = CASE WHEN NOT j.suspended AND coalesce(
            (j.spec ->> 'suspendAfterFailures')::int <= j.consecutive_failures + 1, false)
            THEN 'SuspendedAfterFailures' ELSE j.suspended_reason END
    FROM failed f
    WHERE j.id = f.job_id AND f.state = 'dead')
SELECT idempotency_key, job_id, overlap, state FROM failed;

-- name: OccurrenceRelease
-- Gives back claimed-but-unstarted occurrences (graceful shutdown): pending again,
-- attempt not consumed.
UPDATE cronwell_occurrences o
SET state = 'pending', attempt = o.attempt - 1, worker_id = NULL, lease_expires_at = NULL,
    run_at = now()
FROM unnest(%(keys)s::text[], %(fences)s::bigint[]) AS t(k, f)
WHERE o.idempotency_key = t.k AND o.fence = t.f AND o.state = 'running'
RETURNING o.idempotency_key;

-- name: LeaseReap
-- Expired leases: the attempt's outcome is unknown. AtLeastOnce re-runs it under the same
-- key (pending); AtMostOnce never does (dead, Ambiguous); exhausted attempts are dead.
WITH expired AS (
    SELECT id FROM cronwell_occurrences
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
reaped AS (
    UPDATE cronwell_occurrences o
    SET state = CASE WHEN o.delivery = 'AtMostOnce' OR o.attempt >= o.max_attempts
                     THEN 'dead' ELSE 'pending' END,
        reason = CASE WHEN o.delivery = 'AtMostOnce' THEN 'Ambiguous'
                      WHEN o.attempt >= o.max_attempts THEN 'AttemptsExhausted'
                      ELSE 'LeaseExpired' END,
        finished_at = CASE WHEN o.delivery = 'AtMostOnce' OR o.attempt >= o.max_attempts
                           THEN now() END,
        last_error = 'lease expired on worker ' || coalesce(o.worker_id, '?'),
        run_at = now(), lease_expires_at = NULL
    FROM expired e WHERE o.id = e.id
    RETURNING o.id, o.idempotency_key, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.state, o.reason, o.pool, o.overlap, o.run_at),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, attempt, fence, worker_id,
                                   outcome, error, started_at)
    SELECT id, idempotency_key, attempt, fence, worker_id, 'lease_expired', 'lease expired',
           started_at
    FROM reaped),
-- A death by lease expiry is a death like any other: it counts toward suspendAfterFailures.
jobs AS (
    UPDATE cronwell_jobs j
    SET consecutive_failures = j.consecutive_failures + d.n,
        suspended = j.suspended OR coalesce(
            (j.spec ->> 'suspendAfterFailures')::int <= j.consecutive_failures + d.n, false),
        suspended_reason = CASE WHEN NOT j.suspended AND coalesce(
            (j.spec ->> 'suspendAfterFailures')::int <= j.consecutive_failures + d.n, false)
            THEN 'SuspendedAfterFailures' ELSE j.suspended_reason END
    FROM (SELECT job_id, count(*) AS n FROM reaped WHERE state = 'dead' GROUP BY job_id) d
    WHERE j.id = d.job_id)
SELECT idempotency_key, job_id, state, reason, pool, overlap, run_at FROM reaped;

-- name: RunsList
-- Recent occurrences (optionally of one job) with lag and attempts, newest first.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state, o.reason,
       o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.started_at - o.scheduled_for) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: FenceWrite
-- Fenced write check for a user's resource: succeeds only if `fence` is not below the
-- highest fence already accepted for it (rowcount 0 = stale writer).
INSERT INTO cronwell_fences AS f (resource, fence) VALUES (%(resource)s, %(fence)s)
ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, updated_at = now()
WHERE f.fence <= excluded.fence;

-- name: OutboxInsert
-- A message written in the job's transaction (published later by the relay).
INSERT INTO cronwell_outbox (idempotency_key, topic, payload)
VALUES (%(key)s, %(topic)s, %(payload)s);

-- ==== worker: DLQ, outbox relay ====

-- name: DeadList
-- Dead-lettered occurrences (optionally of one job), newest first, with reason and error.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.state, o.reason,
       o.last_error, o.attempt, o.max_attempts, o.fence, o.delivery, o.origin, o.started_at,
       o.finished_at
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.state = 'dead'
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
ORDER BY o.finished_at DESC NULLS LAST, o.id DESC
LIMIT %(limit)s;

-- name: OccurrenceGet
-- One occurrence by idempotency key, with its job, for `cronwell dlq show`.
SELECT j.namespace, j.name, j.deleted_at AS job_deleted_at, o.idempotency_key, o.job_id,
       o.pool, o.scheduled_for, o.run_at, o.state, o.reason, o.last_error, o.origin,
       o.overlap, o.delivery, o.attempt, o.max_attempts, o.fence, o.worker_id,
       o.lease_expires_at, o.started_at, o.finished_at, o.created_at
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.idempotency_key = %(key)s;

-- name: AttemptList
-- Every recorded attempt of one key, in order (fences strictly increase along it).
SELECT attempt, fence, worker_id, outcome, error, started_at, finished_at
FROM cronwell_attempts WHERE idempotency_key = %(key)s ORDER BY id;

-- name: DeadReplay
-- Dead occurrences back to pending under the same key: attempt numbers continue, the budget
-- grows by the job's retry.maxAttempts, the claim issues a new, higher fence. Ambiguous
-- (AtMostOnce) ones only when asked; never for deleted jobs.
UPDATE cronwell_occurrences o
SET state = 'pending', reason = 'Replayed', run_at = now(), finished_at = NULL,
    lease_expires_at = NULL, worker_id = NULL,
    max_attempts = o.attempt + coalesce((j.spec -> 'retry' ->> 'maxAttempts')::int,
                                        o.max_attempts)
FROM cronwell_jobs j
WHERE j.id = o.job_id AND o.state = 'dead' AND j.deleted_at IS NULL
  AND (%(key)s::text IS NULL OR o.idempotency_key = %(key)s)
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(include_ambiguous)s OR o.reason IS DISTINCT FROM 'Ambiguous')
RETURNING o.idempotency_key, o.pool, o.run_at, o.attempt, o.max_attempts;

-- name: DeadPurge
-- Deletes dead occurrences finished longer ago than the cutoff (their attempts cascade).
DELETE FROM cronwell_occurrences o USING cronwell_jobs j
WHERE j.id = o.job_id AND o.state = 'dead'
  AND o.finished_at < now() - make_interval(secs => %(older_than)s)
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
RETURNING o.idempotency_key;

-- name: OutboxClaimBatch
-- Unpublished outbox messages, oldest first, locked so concurrent relays skip them; ids in
-- `skip` are backing off in this relay.
SELECT id, idempotency_key, topic, payload, created_at, attempts
FROM cronwell_outbox
WHERE published_at IS NULL AND NOT (id = ANY(%(skip)s::bigint[]))
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: OutboxPublishedMark
-- Marks relayed messages published (in the transaction that locked them).
UPDATE cronwell_outbox SET published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY(%(ids)s::bigint[]);

-- name: OutboxFailedMark
-- Records failed publish attempts; the messages stay unpublished and are retried.
UPDATE cronwell_outbox o SET attempts = o.attempts + 1, last_error = t.error
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS t(id, error)
WHERE o.id = t.id;

-- ==== operator: status write-back, drift repair ====

-- name: StatusChangesRead
-- The oldest logged status changes (the operator's writer coalesces them per job); jobs in
-- `skip` are backing off after failed writes, so their rows never block the others.
SELECT id, job_id, occurrence_id, scheduled_for, state, reason, attempt, error, changed_at
FROM cronwell_status_changes
WHERE NOT (job_id = ANY(%(skip)s::uuid[]))
ORDER BY id LIMIT %(limit)s;

-- name: StatusChangesDelete
-- Forgets logged changes once the status they led to is written (or its CR is gone).
DELETE FROM cronwell_status_changes WHERE id = ANY(%(ids)s::bigint[]);

-- name: JobStatusBatch
-- Everything the status of each given job shows: totals from its counters row (history is
-- pruned, totals are not), the rest from the few newest occurrences of the job.
SELECT j.id, j.namespace, j.name, j.generation, j.suspended, j.suspended_reason,
       j.consecutive_failures, j.missed_total, j.deleted_at,
       CASE WHEN NOT j.suspended AND j.deleted_at IS NULL
            THEN least(j.next_run_at, nxt.t) END AS next_schedule_time,
       (j.next_run_at IS NULL AND nxt.t IS NULL) AS schedule_done,
       ls.t AS last_schedule_time,
       c.active, coalesce(t.succeeded_total, 0) AS succeeded,
       coalesce(t.dead_total, 0) AS dead, coalesce(t.skipped_total, 0) AS skipped,
       t.last_successful_at AS last_successful_time, coalesce(t.failed_total, 0) AS failed,
       t.last_failure_at AS last_failure_time, t.last_error,
       fin.state AS last_state, fin.reason AS last_reason, fin.idempotency_key AS last_key,
       fin.last_error AS last_state_error,
       extract(epoch FROM fin.finished_at - fin.started_at) AS last_duration_seconds
FROM cronwell_jobs j
LEFT JOIN cronwell_job_counters t ON t.job_id = j.id
-- Every lateral reads the job's own rows through (job_id, scheduled_for): its cost is the
-- job's retained history (bounded by its limits), never the size of the table or the
-- pool's backlog (ordering by finished_at walked the global finished_at index instead).
LEFT JOIN LATERAL (
    SELECT o.scheduled_for AS t FROM cronwell_occurrences o
    -- coalesce(): keeps the planner off the pool-wide claim index (a burst's backlog)
    WHERE o.job_id = j.id AND coalesce(o.state = 'pending' AND o.attempt = 0, false)
    ORDER BY o.scheduled_for LIMIT 1) nxt ON true
LEFT JOIN LATERAL (
    SELECT o.scheduled_for AS t FROM cronwell_occurrences o
    WHERE o.job_id = j.id AND o.started_at IS NOT NULL
    ORDER BY o.scheduled_for DESC LIMIT 1) ls ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS active FROM cronwell_occurrences o
    WHERE o.job_id = j.id
      AND (o.state = 'running' OR (o.state = 'pending' AND o.attempt > 0))) c ON true
-- The last result: the newest finished occurrence by nominal instant.
LEFT JOIN LATERAL (
    SELECT o.state, o.reason, o.idempotency_key, o.last_error, o.started_at, o.finished_at
    FROM cronwell_occurrences o WHERE o.job_id = j.id AND o.finished_at IS NOT NULL
    ORDER BY o.scheduled_for DESC, o.id DESC LIMIT 1) fin ON true
WHERE j.id = ANY(%(ids)s::uuid[]);

-- name: JobLiveIdsList
-- Live jobs of some namespaces (all when NULL): drift repair compares them with the CRs.
SELECT id, namespace, name FROM cronwell_jobs
WHERE deleted_at IS NULL
  AND (%(namespaces)s::text[] IS NULL OR namespace = ANY(%(namespaces)s::text[]));

-- name: JobGenerationObserve
-- A CR generation whose spec means the same (same hash) is applied: record it as observed.
UPDATE cronwell_jobs SET generation = %(generation)s, updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL AND generation < %(generation)s;

-- ==== forecast ====

-- name: ForecastJobList
-- Live jobs of a pool (all when NULL) with the p90 duration of their last N successful runs:
-- those with a next instant, and one-shot (runAt) jobs whose only occurrence the scheduler
-- has materialised (next_run_at NULL) but is not due yet, so a burst still counts in the
-- horizon before it (the forecast enumerates instants from now: none is counted twice).
SELECT j.id, j.pool, j.spec, j.next_run_at, h.p90_seconds, h.runs
FROM cronwell_jobs j
CROSS JOIN LATERAL (
    SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY r.secs) AS p90_seconds, count(*) AS runs
    FROM (SELECT extract(epoch FROM o.finished_at - o.started_at)::float8 AS secs
          FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.state = 'succeeded'
            AND o.started_at IS NOT NULL AND o.finished_at IS NOT NULL
          ORDER BY o.scheduled_for DESC
          LIMIT %(history)s) r) h
WHERE NOT j.suspended AND j.deleted_at IS NULL
  AND (j.next_run_at IS NOT NULL
       OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                  WHERE o.job_id = j.id AND o.state = 'pending' AND o.run_at > now()))
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s);

-- ==== day-2: backfill, pause/resume, kubectl plugin ====

-- name: BackfillExisting
-- The occurrences that already exist for some keys, with their state (backfill summary).
SELECT idempotency_key, state FROM cronwell_occurrences
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: BackfillInsert
-- Backfilled instants under their real keys; an instant that already has an occurrence
-- (run, running, pending, skipped, dead, missed) is left alone by the unique key.
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, origin, overlap, delivery, max_attempts, timeout_seconds)
SELECT k, %(job_id)s, %(pool)s, s, now(), 'pending', 'Backfill', 'backfill', %(overlap)s,
       %(delivery)s, %(max_attempts)s, %(timeout_seconds)s
FROM unnest(%(keys)s::text[], %(scheduled_for)s::timestamptz[]) AS t(k, s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: BackfillReopen
-- Missed instants of a backfilled window become runnable again, once (only `missed` rows
-- match, and they stop being missed here); origin and key are unchanged.
UPDATE cronwell_occurrences
SET state = 'pending', reason = 'Backfill', run_at = now(), finished_at = NULL,
    pool = %(pool)s, overlap = %(overlap)s, delivery = %(delivery)s,
    max_attempts = %(max_attempts)s, timeout_seconds = %(timeout_seconds)s
WHERE idempotency_key = ANY(%(keys)s::text[]) AND state = 'missed' AND job_id = %(job_id)s
RETURNING idempotency_key;

-- name: JobMissedUncount
-- Re-opened missed instants no longer count as missed for their job.
UPDATE cronwell_jobs SET missed_total = greatest(0, missed_total - %(n)s), updated_at = now()
WHERE id = %(id)s;

-- name: JobPauseBatch
-- `cronwell pause`: suspends the selected live jobs that are running their schedule (jobs
-- already suspended keep their own reason).
UPDATE cronwell_jobs SET suspended = true, suspended_reason = %(reason)s, updated_at = now()
WHERE deleted_at IS NULL AND NOT suspended
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
RETURNING namespace, name;

-- name: JobResumePausedBatch
-- `cronwell resume --all`: resumes the selected jobs suspended with this reason only (jobs
-- suspended by their spec, by hand or after failures stay suspended).
UPDATE cronwell_jobs SET suspended = false, suspended_reason = NULL, resumed_at = now(),
                         updated_at = now()
WHERE deleted_at IS NULL AND suspended AND suspended_reason = %(reason)s
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
RETURNING namespace, name;

-- name: RunsListForJob
-- Recent occurrences of one job by uid (the kubectl plugin resolves the CR to it), as
-- RunsList shows them.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state, o.reason,
       o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.started_at - o.scheduled_for) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.job_id = %(job_id)s
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: BackfillJobGet
-- The live job of a namespace/name with its suspension, locked while a backfill plans and
-- writes (its claims and materialisation wait; the window's rows are read consistently).
SELECT id, spec, pool, suspended, suspended_reason, next_run_at
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- ==== webhook: admission rules, operator metrics ====

-- name: WebhookNamespaceSchedules
-- The schedules a namespace's live jobs keep running, one row per distinct cron (NULL: the
-- one-shots) with how many jobs use it: the schedule-rate cap of the admission webhook.
-- The job under review (`name`) is left out; jobs suspended by their spec and finished jobs
-- (no next run, not suspended) produce nothing and are left out too.
SELECT spec->>'schedule' AS schedule, count(*) AS jobs
FROM cronwell_jobs
WHERE namespace = %(namespace)s AND name <> %(name)s AND deleted_at IS NULL
  AND NOT coalesce((spec->>'suspend')::boolean, false)
  AND (next_run_at IS NOT NULL OR suspended)
GROUP BY 1;

-- ==== maintenance: history limits and retention (cronwell/maintenance.py) ====

-- name: HistoryLimitPrune
-- Per-job history limits for the jobs after `after` in uid order (`jobs` of them): deletes
-- at most `limit` finished occurrences (their attempts cascade) beyond the newest
-- successfulJobsHistoryLimit succeeded ones and failedJobsHistoryLimit of each other final
-- state. Returns the last job examined (NULL: the sweep is over) and the rows deleted.
WITH js AS (
    SELECT id, coalesce((spec ->> 'successfulJobsHistoryLimit')::int, 100) AS ok_keep,
           coalesce((spec ->> 'failedJobsHistoryLimit')::int, 100) AS bad_keep
    FROM cronwell_jobs WHERE id > %(after)s ORDER BY id LIMIT %(jobs)s),
ranked AS (
    SELECT o.id,
           row_number() OVER (PARTITION BY o.job_id, o.state
                              ORDER BY o.scheduled_for DESC, o.id DESC) AS rn,
           CASE WHEN o.state = 'succeeded' THEN js.ok_keep ELSE js.bad_keep END AS keep
    FROM js JOIN cronwell_occurrences o ON o.job_id = js.id
    WHERE o.state IN ('succeeded', 'dead', 'skipped', 'missed', 'cancelled')),
gone AS (
    DELETE FROM cronwell_occurrences
    WHERE id IN (SELECT id FROM ranked WHERE rn > keep LIMIT %(limit)s)
    RETURNING 1)
SELECT (SELECT max(id::text)::uuid FROM js) AS last_job, (SELECT count(*) FROM gone) AS deleted;

-- name: HistoryRetentionPrune
-- Store-wide retention: at most `limit` finished occurrences (attempts cascade) of deleted
-- and one-shot jobs that finished longer than `retention` seconds ago, oldest first.
DELETE FROM cronwell_occurrences
WHERE id IN (SELECT o.id FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
             WHERE o.finished_at < now() - make_interval(secs => %(retention)s)
               AND (j.deleted_at IS NOT NULL OR j.spec ->> 'runAt' IS NOT NULL)
             ORDER BY o.finished_at LIMIT %(limit)s);

-- name: JobTombstonePurge
-- Forgets at most `limit` jobs deleted longer than `retention` seconds ago whose history
-- is gone (nothing references them any more), with their counters.
WITH gone AS (
    DELETE FROM cronwell_jobs
    WHERE id IN (SELECT j.id FROM cronwell_jobs j
                 WHERE j.deleted_at < now() - make_interval(secs => %(retention)s)
                   AND NOT EXISTS (SELECT 1 FROM cronwell_occurrences o WHERE o.job_id = j.id)
                 LIMIT %(limit)s)
    RETURNING id),
counters AS (DELETE FROM cronwell_job_counters c USING gone WHERE c.job_id = gone.id)
SELECT count(*) AS n FROM gone;

-- name: StatusChangesPrune
-- Change-log rows older than the retention (no operator drains the log in standalone use;
-- a status is recomputed from the store anyway).
DELETE FROM cronwell_status_changes
WHERE id IN (SELECT id FROM cronwell_status_changes
             WHERE changed_at < now() - make_interval(secs => %(retention)s)
             ORDER BY id LIMIT %(limit)s);

-- name: OutboxPublishedPrune
-- Outbox messages published longer than the retention ago.
DELETE FROM cronwell_outbox
WHERE id IN (SELECT id FROM cronwell_outbox
             WHERE published_at < now() - make_interval(secs => %(retention)s)
             ORDER BY id LIMIT %(limit)s);

