-- Namespace and pool policies the operator syncs for the workers, which read no Kubernetes
-- object themselves (cronwell_namespace_policies, cronwell_pool_policies).

-- name: NamespacePolicyUpsert
-- The operator records a Namespace's labels and egress annotations (workers read them).
INSERT INTO cronwell_namespace_policies AS p (namespace, labels, egress_allow, egress_deny)
VALUES (%(namespace)s, %(labels)s, %(egress_allow)s, %(egress_deny)s)
ON CONFLICT (namespace) DO UPDATE
SET labels = excluded.labels, egress_allow = excluded.egress_allow,
    egress_deny = excluded.egress_deny, updated_at = now()
WHERE (p.labels, p.egress_allow, p.egress_deny)
      IS DISTINCT FROM (excluded.labels, excluded.egress_allow, excluded.egress_deny);

-- name: NamespacePolicyDelete
-- A Namespace is gone.
DELETE FROM cronwell_namespace_policies WHERE namespace = %(namespace)s;

-- name: NamespacePolicyList
-- Every namespace's labels and egress annotations (a worker caches them for a few seconds).
SELECT namespace, labels, egress_allow, egress_deny FROM cronwell_namespace_policies;

-- name: PoolPolicyUpsert
-- The operator records a WorkerPool's namespaces, namespace selector and handlers.
INSERT INTO cronwell_pool_policies AS p (pool, owner_namespace, namespaces,
                                         namespace_selector, handlers)
VALUES (%(pool)s, %(owner_namespace)s, %(namespaces)s, %(namespace_selector)s, %(handlers)s)
ON CONFLICT (pool, owner_namespace) DO UPDATE
SET namespaces = excluded.namespaces, namespace_selector = excluded.namespace_selector,
    handlers = excluded.handlers, updated_at = now();

-- name: PoolPolicyDelete
-- A WorkerPool is gone.
DELETE FROM cronwell_pool_policies WHERE pool = %(pool)s AND owner_namespace = %(owner_namespace)s;

-- name: PoolPolicyList
-- The policies of one pool (one row per WorkerPool of that name).
SELECT pool, owner_namespace, namespaces, namespace_selector, handlers
FROM cronwell_pool_policies WHERE pool = %(pool)s;

-- name: PoolPolicyListAll
-- Every WorkerPool's policy row (the operator's sync deletes those of vanished WorkerPools).
SELECT pool, owner_namespace FROM cronwell_pool_policies;
