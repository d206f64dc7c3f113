-- Reads off a streaming replica (store/replica.py: ReadDatabase).

-- name: ReplicaLag
-- How stale this server's data may be, in seconds: 0 on a primary (a read URL that reaches
-- one, e.g. a promoted standby) and on a standby that has replayed everything its live WAL
-- receiver got; else the age of the last transaction it replayed (an upper bound: it counts
-- the primary's idle time too). NULL: nothing replayed since it started (unknown).
SELECT CASE
         WHEN NOT pg_is_in_recovery() THEN 0
         WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
              AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver) THEN 0
         ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())
       END::float8 AS lag_seconds;
