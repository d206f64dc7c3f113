-- Claiming occurrences: candidates, overlap decisions under the job's lock, the claim,
-- specs by hash, waiting promotion and the due notification (cronwell/dispatch.py).

-- name: InIndexOrder
-- For the rest of the transaction, no plan sorts: the claim's candidates and the look read
-- the claim index (pool, run_at) of each history partition in its order (a Merge Append)
-- and stop at their LIMIT. Their plans must not depend on statistics: planned from those
-- taken while the instant's partition was empty (a new store; each day's or hour's
-- partition, made ahead, until autovacuum's ANALYZE a minute or more into it), a partition
-- looked like one row, and the planner read every due row of the pool and sorted them: a
-- claim's cost grew with the backlog it was meant to drain (10,000 per-second jobs: 24-117
-- ms a claim, the backlog 150,000-270,000 after a minute). The other statements of a claim
-- find their rows by id or by the job's index and sort nothing either. `set_config(...,
-- true)`: local to the transaction, so the caller runs this in one.
SELECT set_config('enable_sort', 'off', true);

-- name: ClaimTurn
-- A claim's first statement: the pool's turn to claim (migration 0020:
-- cronwell_claim_turn), held until the claim's transaction ends, waiting at most `wait_ms`
-- for the claim before it (0: only if free); and, as InIndexOrder, no sort planned for
-- the rest of the transaction (one round trip for both). `turn`: whether this claim has
-- the turn (without it, it goes ahead beside the holder).
SELECT cronwell_claim_turn(%(lock_class)s, hashtext(%(pool)s), %(wait_ms)s) AS turn,
       set_config('enable_sort', 'off', true) AS enable_sort;

-- name: OccurrenceClaimCandidates
-- Pending occurrences of a pool due now or within the next `ahead` seconds (claim ahead),
-- oldest first, locked against other workers, as one row of arrays in that order (a burst's
-- claim takes hundreds: a row each cost the claimer 2.2 us of CPU a candidate, the arrays
-- 0.3; claims.Candidates): each one's id and `due` (its instant has come); the columns an
-- overlap decision needs only for the candidates of jobs whose policy serialises them (NULL
-- for the others); lo and hi, the earliest and latest instant. Run after
-- InIndexOrder (a range of the claim index, never a sort of the backlog). For a job whose
-- overlap policy serialises its occurrences (`serial`), `pending_before` is the id of the
-- occurrence just before it (nominal order) when that one is still pending in the same pool
-- and never attempted: if another claimer holds it (SKIP LOCKED hid it), this one must wait
-- for it to be decided (dispatch.hold_back). Not across pools: a job moved to another pool
-- must not wait on its old pool's workers. One probe of the job index per candidate
-- locked, after the locking: rows another claimer holds are skipped before it (in the
-- select list of the locking query, it ran for them too: twice the probes when two
-- workers claim one pool).
-- `until` (claims.LATEST: none): an instant past every candidate's, from the caller's
-- reading of the database clock; a constant, never NULL, so that the planner leaves out the
-- partitions after it: a custom plan when it is planned (the dozens created ahead cost ~7 ms
-- of planning per claim at hour width, unbounded), a generic one when it starts (with
-- `until IS NULL OR ...` it kept them all). A row due now has its instant before now; one
-- instant beyond `until` can be due early only (a waiting occurrence promoted before its
-- instant), and waits until `until` reaches it.
-- Every array is ordered by (run_at, id), a total order: equal in all of them.
SELECT coalesce(array_agg(c.id ORDER BY c.run_at, c.id), '{}') AS ids,
       coalesce(array_agg(c.due ORDER BY c.run_at, c.id), '{}') AS due,
       coalesce(array_agg(CASE WHEN c.serial THEN c.job_id END ORDER BY c.run_at, c.id), '{}')
           AS job_ids,
       coalesce(array_agg(CASE WHEN c.serial THEN c.overlap END ORDER BY c.run_at, c.id), '{}')
           AS overlaps,
       coalesce(array_agg(CASE WHEN c.serial THEN c.attempt END ORDER BY c.run_at, c.id), '{}')
           AS attempts,
       coalesce(array_agg(CASE WHEN c.serial THEN c.scheduled_for END
                          ORDER BY c.run_at, c.id), '{}') AS scheduled_for,
       coalesce(array_agg(CASE WHEN c.serial THEN c.run_at END ORDER BY c.run_at, c.id), '{}')
           AS run_at,
       coalesce(array_agg(CASE WHEN c.serial THEN
           (SELECT CASE WHEN p.state = 'pending' AND p.attempt = 0 AND p.pool = %(pool)s
                        THEN p.id END
            FROM cronwell_occurrences p
            WHERE p.job_id = c.job_id AND p.scheduled_for < c.scheduled_for
              AND p.scheduled_for < %(until)s
            ORDER BY p.scheduled_for DESC LIMIT 1)
       END ORDER BY c.run_at, c.id), '{}') AS pending_before,
       min(c.scheduled_for) AS lo, max(c.scheduled_for) AS hi
FROM (SELECT o.id, o.job_id, o.overlap, o.attempt, o.scheduled_for, o.run_at,
             o.run_at <= now() AS due, o.overlap = ANY(%(serial)b::text[]) AS serial
      FROM cronwell_occurrences o
      WHERE o.pool = %(pool)s AND o.state = 'pending'
        AND o.run_at <= now() + make_interval(secs => %(ahead)s)
        AND o.scheduled_for < %(until)s
      ORDER BY o.run_at
      LIMIT %(limit)s
      FOR UPDATE OF o SKIP LOCKED) c;

-- name: JobLockBatch
-- Locks the jobs whose overlap policy serialises their occurrences until the transaction
-- ends: their claims, the promotion of their waiting occurrences and backfills pass
-- through this lock, so a job's active set is read fresh. An advisory lock per job
-- (class claims.JOB_LOCK_CLASS, the hash of its id), not the job's row lock: the
-- materialiser holds its batch of job rows while it inserts their occurrences (tens of
-- ms), and a claim that waited on one of them held its candidates, and the claims queued
-- behind those, as long (10,000 per-second Skip jobs: this statement took 4.9 ms a call,
-- 0.5-0.8 as advisory locks; bench/README.md, "The claim's job lock"). Taken in hash
-- order, so takers never deadlock on it; two jobs of one hash only wait for each other.
-- A claim holds at most claim_batch_size of them: PostgreSQL's lock table has
-- max_locks_per_transaction (64) slots per connection, and a worker's pool has 8 by
-- default. Returns a count, not the ids: nobody reads them.
SELECT count(pg_advisory_xact_lock(%(lock_class)s, k)) AS locked
FROM (SELECT DISTINCT hashtext(i::text) AS k FROM unnest(%(ids)b::uuid[]) i ORDER BY 1) h;

-- name: LockSlotsPerConnection
-- The slots each connection of max_connections brings to PostgreSQL's shared lock table
-- (max_locks_per_transaction): a claim holds an advisory lock per serialised job among its
-- candidates (JobLockBatch), so a claim batch larger than a worker's connections' share
-- can fill the table (maintenance.announce_lock_table).
SELECT current_setting('max_locks_per_transaction')::int AS slots;

-- name: JobActiveOccurrences
-- Running, retrying and waiting occurrences of the given jobs (read after JobLockBatch),
-- with their instants (the bounds of OccurrenceSettleBatch, which may cancel them).
-- `prev`, for one claimed conditionally (0019) in the claiming pool whose instant has not
-- come by this statement's clock (read after JobLockBatch): the occurrence just before it
-- (nominal order). It has not run, its gate is yet to decide it (its worker's timer is
-- never early: dispatch.Claimed.due_monotonic), and that gate reads the occurrence just
-- before it (ConditionalEarlier): a claim of that one may pass it over. NULL for the
-- others: one probe of the job index per conditional row only.
SELECT o.id, o.job_id, o.state, o.idempotency_key, o.scheduled_for,
       CASE WHEN o.state = 'running' AND o.conditional_at = o.claimed_at
                 AND o.run_at > clock_timestamp() AND o.pool = %(pool)s
            THEN (SELECT p.id FROM cronwell_occurrences p
                  WHERE p.job_id = o.job_id AND p.scheduled_for < o.scheduled_for
                  ORDER BY p.scheduled_for DESC LIMIT 1) END AS prev
FROM cronwell_occurrences o
WHERE o.job_id = ANY(%(ids)b::uuid[])
  AND (o.state IN ('running', 'waiting') OR (o.state = 'pending' AND o.attempt > 0));

-- name: OccurrenceSettleBatch
-- Overlap decisions for claimed candidates: skipped, waiting or cancelled (Replace).
-- Bounded by the earliest and latest instant of the rows decided, to prune a partitioned
-- history to their partitions (see attempts.sql).
UPDATE cronwell_occurrences o
SET state = t.state, reason = t.reason, lease_expires_at = NULL,
    finished_at = CASE WHEN t.state = 'waiting' THEN NULL ELSE now() END
FROM unnest(%(ids)b::bigint[], %(states)b::text[], %(reasons)b::text[]) AS t(id, state, reason)
WHERE o.id = t.id AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s;

-- name: OccurrenceClaimBatch
-- Claims the chosen occurrences: lease, a new fence token each (the epoch, read once per
-- statement, plus the counter: migration 0008), attempt + 1. One already
-- due starts now (started_at); one claimed ahead of its instant has no started_at until
-- the worker records its start (OccurrenceStartBatch). db_now is the database clock at this
-- statement: the worker aligns its local timer to it. Returns the
-- job's spec hash, not its spec (workers cache parsed specs by hash, JobSpecBatch fetches
-- unknown ones); the job is read by primary key per row (LIMIT 1 keeps the planner from a
-- hash join that scanned every job for each batch). Bounded by the candidates' earliest
-- and latest instant, to prune a partitioned history (see attempts.sql).
-- `conditional`: the ids claimed conditionally (dispatch.plan_ahead: decided at their
-- instant by dispatch.gate), marked with this claim's claimed_at (0019).
WITH epoch AS MATERIALIZED (SELECT cronwell_fence_base() AS base),
started AS (
    UPDATE cronwell_occurrences o
    SET state = 'running', attempt = o.attempt + 1,
        fence = (SELECT base FROM epoch) + nextval('cronwell_fence'),
        worker_id = %(worker_id)s, claimed_at = now(), reason = NULL,
        conditional_at = CASE WHEN o.id = ANY(%(conditional)b::bigint[]) THEN now() END,
        started_at = CASE WHEN o.run_at <= now() THEN now() END,
        lease_expires_at = now() + make_interval(secs => %(lease)s)
    WHERE o.id = ANY(%(ids)b::bigint[]) AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
    RETURNING o.id, o.idempotency_key, o.job_id, o.scheduled_for, o.run_at, o.started_at,
              o.attempt, o.fence, o.delivery, o.max_attempts, o.timeout_seconds, o.origin,
              o.claimed_at, o.conditional_at IS NOT NULL AS conditional,
              clock_timestamp() AS db_now)
SELECT s.*, j.namespace, j.name, j.spec_hash
FROM started s
CROSS JOIN LATERAL (SELECT namespace, name, spec_hash FROM cronwell_jobs
                    WHERE id = s.job_id LIMIT 1) j;

-- name: JobSpecBatch
-- The current spec of some jobs, for claimed occurrences whose spec hash a worker has not
-- parsed yet (one job per unknown hash: equal hashes are equal specs).
SELECT id, spec_hash, spec FROM cronwell_jobs WHERE id = ANY(%(ids)b::uuid[]);

-- name: WaitingPromote
-- After an active occurrence of a buffered job ends: the oldest waiting one becomes
-- pending (run after JobLockBatch in the same transaction). Joined on (id, instant): one
-- partition probed per row on a partitioned history. The waiting rows through their own
-- partial index (0021), not the active occurrences'.
UPDATE cronwell_occurrences o SET state = 'pending', run_at = now(), reason = NULL
FROM (SELECT DISTINCT ON (job_id) id, scheduled_for FROM cronwell_occurrences
      WHERE job_id = ANY(%(ids)b::uuid[]) AND state = 'waiting'
      ORDER BY job_id, scheduled_for) w
WHERE o.id = w.id AND o.scheduled_for = w.scheduled_for
RETURNING o.pool, o.run_at;

-- name: WaitingStranded
-- Jobs with waiting occurrences that no completion will promote: nothing of theirs is
-- running or retrying (e.g. backfilled BufferAll occurrences queued behind a Skip one, whose
-- completion promotes nothing). The reaper promotes them; claims re-check overlap anyway.
-- Asked every reaper pass: the waiting rows through their own partial index (0021), where
-- the active occurrences' index made each pass read every running row and, until the next
-- autovacuum, every dead entry (33-63 ms a pass at 10,000 per-second jobs, none waiting).
SELECT DISTINCT w.job_id FROM cronwell_occurrences w
WHERE w.state = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM cronwell_occurrences a
                  WHERE a.job_id = w.job_id
                    AND (a.state = 'running' OR (a.state = 'pending' AND a.attempt > 0)))
LIMIT %(limit)s;

-- name: OccurrenceComingInstants
-- What is coming for a pool: the instants (run_at) of its earliest pending occurrences
-- after `after` (the caller's EARLIEST: from the first; never NULL, so that a generic plan
-- starts its range scan there too), with how many are due at each, and the database clock:
-- at most `due_rows` of those due already and `rows` of those due within `horizon`
-- seconds. A worker sizes its claim ahead from it (it starts claiming a burst early enough
-- that its share is claimed before the instant) and sleeps until the next one; it reads a
-- near window first and a farther one only when the near one does not settle its plan
-- (Worker._look). What is due already is claimed first whatever its count: under a backlog
-- reading all of it (up to the budget, 100,000 rows for two workers: 68 ms a look at
-- 10,000 per-second jobs behind) told the worker nothing more than its first rows. Two
-- range scans of the claim index (pool, run_at) WHERE state = 'pending', each bounded by
-- its LIMIT; the one-row outer side answers db_now when nothing is pending. `until`: as in
-- OccurrenceClaimCandidates (the partitions after it are left out of the plan). Run after
-- InIndexOrder, as the claim's candidates (ranges of the claim index, not a sort).
SELECT i.run_at, i.n, now() AS db_now
FROM (VALUES (1)) one(x)
LEFT JOIN LATERAL (
    SELECT c.run_at, count(*) AS n
    FROM ((SELECT run_at FROM cronwell_occurrences
           WHERE pool = %(pool)s AND state = 'pending'
             AND run_at <= now() AND run_at > %(after)s
             AND scheduled_for < %(until)s
           ORDER BY run_at LIMIT %(due_rows)s)
          UNION ALL
          (SELECT run_at FROM cronwell_occurrences
           WHERE pool = %(pool)s AND state = 'pending'
             AND run_at > greatest(now(), %(after)s)
             AND run_at <= now() + make_interval(secs => %(horizon)s)
             AND scheduled_for < %(until)s
           ORDER BY run_at LIMIT %(rows)s)) c
    GROUP BY c.run_at ORDER BY c.run_at LIMIT %(instants)s) i ON true
ORDER BY i.run_at;

-- name: DueNotify
-- One notification per materialised batch (never per row): pool -> earliest run_at.
SELECT pg_notify('cronwell_due', %(payload)s);

-- name: ConditionalEarlier
-- The gate of conditional claims at their instant (dispatch.gate): per claim, whether an
-- earlier occurrence of its job is active (running, waiting or retrying, a conditional
-- one too: the claim is skipped), and whether the one just before it (nominal order) is
-- pending in the pool and never attempted (the claim steps aside, given back, so that the
-- earlier one is decided first: dispatch.hold_back's rule). That one is the only earlier
-- occurrence a claim may decide as if the conditional one were not there
-- (JobActiveOccurrences' `prev`): while that claim is not committed it is pending here,
-- and once committed, active. The active ones through the partial index of active
-- occurrences, once for all the jobs; the one just before as OccurrenceCandidates'
-- pending_before. `until`: past every claim's instant (a constant: the planner leaves out
-- the partitions after it). `over`: running ones the worker saw succeed, their completion
-- not written yet (completions wait while starts go first): not active.
WITH act AS MATERIALIZED (
    SELECT job_id, min(scheduled_for) AS first FROM cronwell_occurrences
    WHERE job_id = ANY(%(jobs)b::uuid[])
      AND (state IN ('running', 'waiting') OR (state = 'pending' AND attempt > 0))
      AND id <> ALL(%(over)b::bigint[])
    GROUP BY job_id)
SELECT c.id, coalesce(a.first < c.scheduled_for, false) AS overlapped,
       coalesce((SELECT p.state = 'pending' AND p.attempt = 0 AND p.pool = %(pool)s
                 FROM cronwell_occurrences p
                 WHERE p.job_id = c.job_id AND p.scheduled_for < c.scheduled_for
                   AND p.scheduled_for < %(until)s
                 ORDER BY p.scheduled_for DESC LIMIT 1), false) AS behind
FROM unnest(%(ids)b::bigint[], %(jobs)b::uuid[], %(instants)b::timestamptz[])
     AS c(id, job_id, scheduled_for)
LEFT JOIN act a ON a.job_id = c.job_id;

-- name: ConditionalDecide
-- The gate's verdicts on the conditional claims that must not start, by (id, fence) pair,
-- on claims not started: 'skip' records it skipped, never started, its attempt given back
-- (as OccurrenceSettleBatch skips a due one); 'back' gives it back pending at its instant,
-- attempt not consumed (as OccurrenceRelease). Returns the ids decided. Bounded by the
-- claims' instants.
UPDATE cronwell_occurrences o
SET state = CASE WHEN t.verdict = 'skip' THEN 'skipped' ELSE 'pending' END,
    reason = CASE WHEN t.verdict = 'skip' THEN 'Overlap: an earlier occurrence is still active' END,
    finished_at = CASE WHEN t.verdict = 'skip' THEN now() END,
    attempt = o.attempt - 1, lease_expires_at = NULL,
    worker_id = CASE WHEN t.verdict = 'skip' THEN o.worker_id END,
    claimed_at = CASE WHEN t.verdict = 'skip' THEN o.claimed_at END,
    run_at = CASE WHEN t.verdict = 'skip' THEN o.run_at ELSE greatest(o.run_at, now()) END
FROM unnest(%(ids)b::bigint[], %(fences)b::bigint[], %(verdicts)b::text[])
     AS t(id, fence, verdict)
WHERE o.id = ANY(%(ids)b::bigint[]) AND o.id = t.id AND o.fence = t.fence
  AND coalesce(o.state = 'running', false) AND o.started_at IS NULL
  AND o.scheduled_for BETWEEN %(lo)s AND %(hi)s
RETURNING o.id;
