-- Backfill (`cronwell backfill`): past instants of one live job run under their real keys;
-- missed ones are re-opened, present ones left alone.

-- name: BackfillJobGet
-- The live job of a namespace/name with its suspension, locked while a backfill plans and
-- writes (its claims and materialisation wait; the window's rows are read consistently).
SELECT id, spec, pool, suspended, suspended_reason, next_run_at
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: BackfillExisting
-- The occurrences that already exist for some keys, with their state (backfill summary).
SELECT idempotency_key, state FROM cronwell_occurrences
WHERE idempotency_key = ANY(%(keys)b::text[]);

-- name: BackfillReopen
-- Missed instants of a backfilled window become runnable again, once (only `missed` rows
-- match, and they stop being missed here); origin and key are unchanged.
UPDATE cronwell_occurrences
SET state = 'pending', reason = 'Backfill', run_at = now(), finished_at = NULL,
    pool = %(pool)s, overlap = %(overlap)s, delivery = %(delivery)s,
    max_attempts = %(max_attempts)s, timeout_seconds = %(timeout_seconds)s
WHERE idempotency_key = ANY(%(keys)b::text[]) AND state = 'missed' AND job_id = %(job_id)s
RETURNING idempotency_key;

-- name: BackfillInsert
-- Backfilled instants under their real keys; an instant that already has an occurrence
-- (run, running, pending, skipped, dead, missed) is left alone by the unique key (no conflict
-- target, so it works on both history shapes; see OccurrenceInsertBatch).
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, origin, overlap, delivery, max_attempts, timeout_seconds)
SELECT k, %(job_id)s, %(pool)s, s, now(), 'pending', 'Backfill', 'backfill', %(overlap)s,
       %(delivery)s, %(max_attempts)s, %(timeout_seconds)s
FROM unnest(%(keys)b::text[], %(scheduled_for)b::timestamptz[]) AS t(k, s)
ON CONFLICT DO NOTHING
RETURNING idempotency_key;

-- name: JobMissedUncount
-- Re-opened missed instants no longer count as missed for their job.
UPDATE cronwell_jobs SET missed_total = greatest(0, missed_total - %(n)s), updated_at = now()
WHERE id = %(id)s;
