-- Running attempts: fenced heartbeats, completions, failures, releases and lease reaping
-- (each completion also writes its cronwell_attempts row).

-- The batch statements (heartbeats, starts, completions, releases) find their rows by the
-- ids the worker holds from its claims: by primary key (`id = ANY (ids)`, an index
-- condition whatever the statistics) joined to their pairs, `unnest(ids, fences)`, on id
-- and fence: each row against its own pair, never `fence = ANY (fences)` across the batch
-- (after a failover that lost commits, a fence value was issued again to another key of
-- the same batch, and a stale batch completed attempts it did not run: issue 28), and
-- without array_position's scan of the batch per row. `coalesce(state = 'running', false)`
-- hides the running rows' partial index (cronwell_occurrences_lease), which the planner
-- would otherwise scan, filtering every running row against the id list, when statistics
-- say few are running. Statistics cannot be trusted here: in a burst they were taken while
-- every row was pending, or before the burst was materialised at all; a join with unnest()
-- planned from them matched each running row against the whole list (189 ms for one batch
-- of 341 starts), and a lookup per key read the whole burst per key (see
-- OccurrenceHeartbeat). tests/integration/test_batch_plans.py checks the plans under both.
-- The failure of one attempt goes by (id, fence) too; only a re-assertion (rare: after a
-- failover) goes by key.
--
-- Every write by id or key also bounds the instant, `scheduled_for BETWEEN %(lo)s AND
-- %(hi)s` (the batch's earliest and latest instant, which the worker holds from its
-- claims): on a partitioned history (docs/architecture.md, "History partitions") an id or
-- a key alone probes the index of every partition, the bounds prune to the partitions of
-- the batch's instants (one, for a batch of one instant). Unpartitioned, it is one more
-- filter on rows already found by id. A caller that knows no instants passes the widest
-- bounds (attempts.ALL_TIME).

-- name: OccurrenceHeartbeat
-- Extends the leases of running attempts by (id, fence) pair (as the start and the
-- completion find theirs); a pair missing from the result lost its lease. Not by key: a
-- lookup per key, planned from statistics taken before a burst was materialised, went by
-- the instant's index with the key as a filter, and every key read the whole burst (a
-- heartbeat of 1,000 attempts of a 50,000 burst: 11.5 s, longer than a lease).
UPDATE cronwell_occurrences o
SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM unnest(%(ids)b::bigint[], %(fences)b::bigint[]) AS t(id, fence)
WHERE o.id = ANY (%(ids)b::bigint[]) AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
  AND o.id = t.id AND o.fence = t.fence
  AND coalesce(o.state = 'running', false)
  AND o.worker_id = %(worker_id)s
RETURNING o.idempotency_key;

-- name: OccurrenceReassert
-- Restores claims the store forgot. After a failover that lost the last commits
-- (asynchronous replication) or a restore, an occurrence a worker still runs is back to
-- pending under a lower fence than the worker's (or none): no claim since has been made,
-- for it would carry a higher fence (a new epoch). The worker's claim is then the latest
-- ever made and is restored as it was: running under the worker's fence, its attempt
-- number (never rewound), started if it had started. Never over an occurrence running,
-- finished, or holding a fence not below the worker's: that is a lease lost, as ever.
-- Returns each row's id and instant: the lost commits may have been its materialisation
-- too, and the worker's fenced writes by id then go to the row materialised again under the
-- same key (a trigger's at another instant, its insertion time).
-- Found by key alone (every partition: a rare path), not bounded by the instant the worker
-- holds: a trigger materialised again has a later instant (its insertion time).
WITH held AS MATERIALIZED (
    SELECT array_agg(x.id) AS ids, array_agg(t.f) AS fences, array_agg(t.a) AS attempts,
           array_agg(t.s) AS started
    FROM unnest(%(keys)b::text[], %(fences)b::bigint[], %(attempts)b::int[],
                %(started)b::boolean[]) AS t(k, f, a, s)
    CROSS JOIN LATERAL (SELECT id FROM cronwell_occurrences
                        WHERE idempotency_key = t.k LIMIT 1) x)
UPDATE cronwell_occurrences o
SET state = 'running', fence = h.fences[array_position(h.ids, o.id)],
    worker_id = %(worker_id)s, reason = NULL, finished_at = NULL,
    attempt = greatest(o.attempt, h.attempts[array_position(h.ids, o.id)]),
    claimed_at = coalesce(o.claimed_at, now()),
    started_at = CASE WHEN h.started[array_position(h.ids, o.id)]
                      THEN coalesce(o.started_at, now()) END,
    lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM held h
WHERE o.id = ANY (h.ids) AND coalesce(o.state = 'pending', false)
  AND coalesce(o.fence, 0) < h.fences[array_position(h.ids, o.id)]
RETURNING o.idempotency_key, o.id, o.scheduled_for;

-- name: OccurrenceStartBatch
-- Records the actual start of attempts claimed ahead of their instant, by (id, fence) pair
-- (fenced: a pair missing from the result lost its lease and must not start). `starts`:
-- each one's start instant when the worker already started it (an AtLeastOnce handler
-- still running a while after its instant, recorded late), NULL for one that starts once
-- this commits (AtMostOnce and `job` targets: now()).
UPDATE cronwell_occurrences o SET started_at = coalesce(t.started, now())
FROM unnest(%(ids)b::bigint[], %(fences)b::bigint[], %(starts)b::timestamptz[])
     AS t(id, fence, started)
WHERE o.id = ANY (%(ids)b::bigint[]) AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
  AND o.id = t.id AND o.fence = t.fence
  AND coalesce(o.state = 'running', false)
  AND o.started_at IS NULL
RETURNING o.idempotency_key;

-- name: OccurrenceSucceedBatch
-- Fenced completion by (id, fence) pair: only the current holder (its fence, still
-- running) can succeed. `starts`: the start instant of an attempt whose start was not
-- written yet (an AtLeastOnce handler started at its instant without a write), recorded
-- here with its ending (NULL: already recorded). Returns one row of arrays (a row per
-- occurrence cost the worker 0.9 us of CPU each, the arrays 0.3): the keys completed, and
-- the jobs of those whose overlap policy is in `buffered` (their waiting ones go next).
WITH done AS (
    UPDATE cronwell_occurrences o
    SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL, last_error = NULL,
        reason = NULL, started_at = coalesce(o.started_at, t.started)
    FROM unnest(%(ids)b::bigint[], %(fences)b::bigint[], %(starts)b::timestamptz[])
         AS t(id, fence, started)
    WHERE o.id = ANY (%(ids)b::bigint[]) AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
      AND o.id = t.id AND o.fence = t.fence
      AND coalesce(o.state = 'running', false)
    RETURNING o.id, o.idempotency_key, o.scheduled_for, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.finished_at, o.overlap),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                                   worker_id, outcome, started_at, finished_at)
    SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'succeeded', started_at,
           finished_at
    FROM done),
-- A success resets its job's failures. One scan of the small partial index
-- cronwell_jobs_failing (0007) with the batch's job ids as one array, not a lookup per job
-- (the array form keeps that plan whatever the estimates; `IN (SELECT ...)` flips between
-- plans with the index's statistics).
jobs AS (
    UPDATE cronwell_jobs j SET consecutive_failures = 0
    WHERE j.consecutive_failures <> 0 AND j.id = ANY (ARRAY(SELECT job_id FROM done)))
SELECT coalesce(array_agg(idempotency_key), '{}') AS keys,
       coalesce(array_agg(job_id) FILTER (WHERE overlap = ANY(%(buffered)b::text[])), '{}')
           AS buffered_jobs
FROM done;

-- name: OccurrenceFail
-- Fenced failure of one attempt, by (id, fence): back to pending after a backoff, or dead.
-- `started`: its start instant when not written yet (as in OccurrenceSucceedBatch), else
-- NULL. By id, and `coalesce(state = 'running', false)` as in the batch statements: under
-- statistics taken before a burst the planner read the running rows' partial lease index
-- and filtered every running row for the one it fails, by key or by id.
WITH failed AS (
    UPDATE cronwell_occurrences o
    SET state = %(next_state)s, reason = %(reason)s, last_error = %(error)s,
        started_at = coalesce(o.started_at, %(started)s::timestamptz),
        run_at = now() + make_interval(secs => %(delay)s), lease_expires_at = NULL,
        finished_at = CASE WHEN %(next_state)s = 'dead' THEN now() END
    WHERE o.id = %(id)s AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
      AND o.fence = %(fence)s AND coalesce(o.state = 'running', false)
    RETURNING o.id, o.idempotency_key, o.scheduled_for, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.overlap, o.state),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                                   worker_id, outcome, error, started_at)
    SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, %(outcome)s, %(error)s,
           started_at
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
-- Gives back claimed-but-unstarted occurrences (graceful shutdown) by (id, fence) pair:
-- pending again at their instant (one claimed ahead is not due yet), attempt not consumed.
UPDATE cronwell_occurrences o
SET state = 'pending', attempt = o.attempt - 1, worker_id = NULL, lease_expires_at = NULL,
    run_at = greatest(o.run_at, now()), started_at = NULL, claimed_at = NULL
FROM unnest(%(ids)b::bigint[], %(fences)b::bigint[]) AS t(id, fence)
WHERE o.id = ANY (%(ids)b::bigint[]) AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
  AND o.id = t.id AND o.fence = t.fence
  AND coalesce(o.state = 'running', false)
RETURNING o.idempotency_key;

-- name: LeaseReap
-- Expired leases. One whose handler never ran (claimed ahead, its worker died or stopped
-- before the instant) is pending again at its instant, attempt not consumed, no attempt
-- row, not a failure, and not ambiguous under AtMostOnce (NotStarted). One that may have
-- run has an unknown outcome: AtLeastOnce re-runs it under the same key (pending);
-- AtMostOnce never does (dead, Ambiguous); exhausted attempts are dead. Except a `job`
-- target (AtLeastOnce): its Job runs on without the worker, so it is pending whatever
-- attempts are left, and the next claim adopts the Job and records how it ends (a claim
-- past max_attempts only adopts: kubejob.next_step).
-- May have run (`ran`): started_at is set, or it is an AtLeastOnce handler whose instant
-- (run_at) came before its lease expired. Those start at their instant without a write
-- first, and only while their worker judges the lease held (issue 30): one whose instant
-- was at or after the lease's expiry never started. AtMostOnce attempts and `job` targets
-- start only once started_at is written, so for them started_at NULL means never started.
WITH expired AS (
    SELECT o.id, o.scheduled_for, o.delivery <> 'AtMostOnce' AND x.job AS adopt,
           o.started_at IS NOT NULL
           OR (o.delivery <> 'AtMostOnce' AND NOT x.job AND o.run_at < o.lease_expires_at)
           AS ran
    FROM cronwell_occurrences o
    CROSS JOIN LATERAL (
        SELECT coalesce((SELECT jsonb_typeof(j.spec -> 'target' -> 'job') = 'object'
                         FROM cronwell_jobs j WHERE j.id = o.job_id), false) AS job) x
    WHERE o.state = 'running' AND o.lease_expires_at < now()
    ORDER BY o.lease_expires_at LIMIT %(limit)s FOR UPDATE OF o SKIP LOCKED),
reaped AS (
    UPDATE cronwell_occurrences o
    SET state = CASE WHEN NOT e.ran THEN 'pending'
                     WHEN o.delivery = 'AtMostOnce'
                          OR (o.attempt >= o.max_attempts AND NOT e.adopt)
                     THEN 'dead' ELSE 'pending' END,
        reason = CASE WHEN NOT e.ran THEN 'NotStarted'
                      WHEN o.delivery = 'AtMostOnce' THEN 'Ambiguous'
                      WHEN o.attempt >= o.max_attempts AND NOT e.adopt THEN 'AttemptsExhausted'
                      ELSE 'LeaseExpired' END,
        finished_at = CASE WHEN NOT e.ran THEN NULL
                           WHEN o.delivery = 'AtMostOnce'
                                OR (o.attempt >= o.max_attempts AND NOT e.adopt)
                           THEN now() END,
        attempt = CASE WHEN NOT e.ran THEN o.attempt - 1 ELSE o.attempt END,
        last_error = CASE WHEN NOT e.ran
                          THEN 'claimed ahead by worker ' || coalesce(o.worker_id, '?')
                               || ', which never started it (lease expired)'
                          ELSE 'lease expired on worker ' || coalesce(o.worker_id, '?') END,
        run_at = greatest(o.run_at, now()), lease_expires_at = NULL, claimed_at = NULL
    FROM expired e WHERE o.id = e.id AND o.scheduled_for = e.scheduled_for
    RETURNING o.id, o.idempotency_key, o.scheduled_for, o.job_id, o.attempt, o.fence, o.worker_id,
              o.started_at, o.state, o.reason, o.pool, o.overlap, o.run_at, e.ran),
att AS (
    INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                                   worker_id, outcome, error, started_at)
    SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'lease_expired',
           'lease expired', started_at
    FROM reaped WHERE ran),
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
