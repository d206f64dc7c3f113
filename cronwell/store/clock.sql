-- Every time comparison uses the database clock, now() (invariant 6).

-- name: ClockNow
-- The database's clock: the only clock scheduling decisions read.
SELECT now() AS now;
