-- Secret-backed header values, encrypted (cronwell_job_secrets): the operator resolves and
-- stores them, workers read them for each attempt.

-- name: JobSecretUpsert
-- Stores a job's encrypted header values when they changed (digest), so rotation lands.
INSERT INTO cronwell_job_secrets AS s (job_id, ciphertext, digest)
VALUES (%(job_id)s, %(ciphertext)s, %(digest)s)
ON CONFLICT (job_id) DO UPDATE
SET ciphertext = excluded.ciphertext, digest = excluded.digest, resolved_at = now()
WHERE s.digest <> excluded.digest
RETURNING job_id;

-- name: JobSecretGet
-- A job's encrypted header values, read by the worker for each attempt (rotation reaches
-- the next attempt).
SELECT ciphertext FROM cronwell_job_secrets WHERE job_id = %(job_id)s;

-- name: JobSecretDelete
-- A job no longer has Secret-backed headers.
DELETE FROM cronwell_job_secrets WHERE job_id = %(job_id)s;

-- name: JobSecretRefList
-- Live jobs whose spec has Secret-backed headers (the operator re-resolves them on a period).
SELECT id, namespace, name, spec FROM cronwell_jobs
WHERE deleted_at IS NULL AND jsonb_path_exists(spec, '$.target.http.headers[*].valueFrom');
