-- The wake-up channel: a NOTIFY on cronwell_due (claims.sql, DueNotify) per materialised
-- batch, with {pool: earliest run_at} as its JSON payload.

-- name: DueListen
-- Subscribe this session to the due batches' notifications.
LISTEN cronwell_due;

-- name: DueListening
-- Whether this session still listens on a primary: the periodic check of the LISTEN
-- connection (a server that restarted as a standby, or a subscription lost, says false).
SELECT 'cronwell_due' = ANY (ARRAY(SELECT pg_listening_channels())) AND NOT pg_is_in_recovery()
       AS listening;
