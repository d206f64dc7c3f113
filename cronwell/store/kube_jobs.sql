-- The Kubernetes Jobs of `job` targets, as the store knows them (cronwell_worker/kubejob.py).

-- name: OccurrenceJobRecord
-- Records the Job the running attempt (its fence) created or adopted, for status.active.
-- Fenced: a stale attempt records nothing (rowcount 0).
UPDATE cronwell_occurrences SET job_name = %(job_name)s, job_fence = fence
WHERE idempotency_key = %(key)s AND fence = %(fence)s AND state = 'running';

-- name: OccurrenceStatesByKey
-- The states of the occurrences with these keys (a key without a row: its history was
-- pruned). Decides which of a ScheduledJob's Jobs may be deleted: only those whose
-- occurrence's outcome is recorded.
SELECT idempotency_key AS key, state FROM cronwell_occurrences
WHERE idempotency_key = ANY(%(keys)b::text[]);
