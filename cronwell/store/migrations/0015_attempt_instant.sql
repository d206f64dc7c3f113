-- 0015: each attempt carries its occurrence's nominal instant (issue 31).
--
-- History is partitioned by that instant (cronwell/store/history_partitions.py: `cronwell
-- migrate` converts an existing store online after this migration). An attempt lives in the
-- partition of its occurrence, so a whole day of both drops together, and the one-success
-- index (invariant 1) can include the partition column without losing its meaning: the
-- idempotency key determines the instant. Rows written before this migration keep NULL
-- (adding a nullable column rewrites nothing); every writer sets it from now on.
ALTER TABLE cronwell_attempts ADD COLUMN scheduled_for timestamptz;
