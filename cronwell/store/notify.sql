-- The wake-up channel: a NOTIFY on cronwell_due (claims.sql, DueNotify) per materialised
-- batch, with {pool: earliest run_at} as its JSON payload.

-- name: DueListen
-- Subscribe this session to the due batches' notifications.
LISTEN cronwell_due;
