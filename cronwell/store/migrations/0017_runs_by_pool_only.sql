-- 0017: every run newest first is read from cronwell_occurrences_pool, one range a pool,
-- merged (issue 30); cronwell_occurrences_recent (0010) goes.
--
-- A state change is not a HOT update (state is in the partial indexes' predicates), so each
-- index on the runs costs every materialisation, claim and completion one more index entry:
-- the two run-list indexes (0010's and 0011's) were about a fifth of PostgreSQL's time in
-- a 10k burst (bench/README.md, "What the schema's extra writes cost PostgreSQL"). A page
-- of every pool's runs is now the newest of each pool's page (store/runs.py,
-- newest_first): a few pools, a few short range scans, the same rows in the same order.
DROP INDEX IF EXISTS cronwell_occurrences_recent;
