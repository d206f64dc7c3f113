-- Fenced writes to users' resources (cronwell_fences).

-- name: FenceWrite
-- Fenced write check for a user's resource: succeeds only if `fence` is not below the
-- highest fence already accepted for it (rowcount 0 = stale writer).
INSERT INTO cronwell_fences AS f (resource, fence) VALUES (%(resource)s, %(fence)s)
ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, updated_at = now()
WHERE f.fence <= excluded.fence;
