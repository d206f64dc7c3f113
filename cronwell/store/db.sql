-- Server-side bounds on a client that stops answering (db.Database sets them): the
-- deadline and keepalives on the client's side end its own wait, not the server's, whose
-- session otherwise keeps its transaction's locks for as long as it waits to read.

-- name: SessionBounds
-- Set on every new connection. A client idle in a transaction past its own deadline (plus
-- a margin) is paused or gone, for a live one would have dropped the connection at the
-- deadline: the server ends the session, rolling back and releasing its row, job-counter
-- and advisory locks (a frozen worker's claim or completion otherwise held them until the
-- operating system's keepalive noticed, two hours by default). A statement still running
-- then (waiting on a lock, its client paused) is cancelled (statement_timeout); one whose
-- client dropped the connection at its deadline is ended within a second
-- (client_connection_check_interval: otherwise it ran to its end for nobody, holding what
-- it locked). The keepalives and the user timeout are the client's
-- (db.CONNECTION_DEFAULTS), so a frozen host or a partition is noticed by the server as
-- soon as by the client. Values in milliseconds and seconds, as text (set_config's).
-- TimeZone UTC, whatever the server's default: cronwell's SQL names its zone where one
-- matters, and psycopg returns each timestamptz in the session's zone, converting every
-- value through zoneinfo for any name but exactly 'UTC' ('Etc/UTC', the default of a
-- server initialised on a UTC host, included): 0.15-0.25 us more a value; a claimed row
-- carries four.
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false) AS idle,
       set_config('statement_timeout', %(idle_ms)s, false) AS statement,
       set_config('client_connection_check_interval', %(check_ms)s, false) AS check_interval,
       set_config('tcp_keepalives_idle', %(keepalives_idle)s, false) AS keepalives_idle,
       set_config('tcp_keepalives_interval', %(keepalives_interval)s, false)
           AS keepalives_interval,
       set_config('tcp_keepalives_count', %(keepalives_count)s, false) AS keepalives_count,
       set_config('tcp_user_timeout', %(user_timeout_ms)s, false) AS user_timeout,
       set_config('TimeZone', 'UTC', false) AS time_zone;

-- name: DeadlineBounds
-- A checkout with a deadline longer than the connection's (a handler's ctx.transaction(),
-- a migration, the history's conversion building indexes) gets the idle and statement
-- bounds of its own deadline: for its transaction only (`local`), or for the session
-- until the checkout ends and SessionBounds' are set back (this statement again).
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, %(local)s) AS idle,
       set_config('statement_timeout', %(idle_ms)s, %(local)s) AS statement;
