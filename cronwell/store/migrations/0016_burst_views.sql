-- 0016: each worker publishes the sizes of the bursts it sees coming (issue 30).
--
-- A worker plans its share of a coming burst from the burst's size: the most occurrences
-- it has seen due at that instant, pending plus held by itself. A worker that joins the
-- pool after another began claiming the burst ahead sees only what is left pending, and
-- took a share of that, not of the burst; and a worker that gives back its surplus when a
-- peer joins makes pending rows that no longer say the burst's size either. So a worker
-- writes its view here at the looks that count its pool's live workers, and reads the
-- most each live worker of the pool has seen ({instant in epoch microseconds: count}).
ALTER TABLE cronwell_processes ADD COLUMN bursts jsonb;
