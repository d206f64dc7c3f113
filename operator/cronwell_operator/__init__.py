"""cronwell's Kubernetes operator (kopf): ScheduledJob CRs into the store and results back
into their status. The only package of cronwell that imports kopf."""
