-- The transactional outbox (cronwell_outbox): written in a job's transaction, relayed later.

-- name: OutboxInsert
-- A message written in the job's transaction (published later by the relay).
INSERT INTO cronwell_outbox (idempotency_key, topic, payload)
VALUES (%(key)s, %(topic)s, %(payload)s);

-- name: OutboxClaimBatch
-- Unpublished outbox messages, oldest first, locked so concurrent relays skip them; ids in
-- `skip` are backing off in this relay.
SELECT id, idempotency_key, topic, payload, created_at, attempts
FROM cronwell_outbox
WHERE published_at IS NULL AND NOT (id = ANY(%(skip)b::bigint[]))
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: OutboxPublishedMark
-- Marks relayed messages published (in the transaction that locked them).
UPDATE cronwell_outbox SET published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY(%(ids)b::bigint[]);

-- name: OutboxFailedMark
-- Records failed publish attempts; the messages stay unpublished and are retried.
UPDATE cronwell_outbox o SET attempts = o.attempts + 1, last_error = t.error
FROM unnest(%(ids)b::bigint[], %(errors)b::text[]) AS t(id, error)
WHERE o.id = t.id;
