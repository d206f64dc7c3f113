-- 0003: tenant safety — what the operator knows of namespaces, pools and Secrets, for the
-- workers (which read no Kubernetes object themselves: least privilege).

-- Namespaces as the operator sees them: labels (for WorkerPool namespace selectors) and the
-- egress annotations (cronwell.dev/egress-allow, cronwell.dev/egress-deny), as written.
CREATE TABLE cronwell_namespace_policies (
    namespace    text        PRIMARY KEY,
    labels       jsonb       NOT NULL DEFAULT '{}',
    egress_allow text,        -- NULL: no allow list (anything the cluster allows)
    egress_deny  text,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Which namespaces may use a pool and which handlers it serves, one row per WorkerPool
-- (pool names are cluster-wide: two WorkerPools of one name in two namespaces both count).
CREATE TABLE cronwell_pool_policies (
    pool               text        NOT NULL,
    owner_namespace    text        NOT NULL,  -- the WorkerPool's namespace (always allowed)
    namespaces         text[]      NOT NULL DEFAULT '{}',
    namespace_selector jsonb,                 -- a Kubernetes label selector, NULL: none
    handlers           text[],                -- NULL: any handler
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, owner_namespace)
);

-- Resolved values of a job's Secret-backed headers: one Fernet token (AES-128-CBC +
-- HMAC-SHA256) of {"header": "value"} with the key of the chart's Secret; never plaintext.
CREATE TABLE cronwell_job_secrets (
    job_id      uuid        PRIMARY KEY REFERENCES cronwell_jobs (id) ON DELETE CASCADE,
    ciphertext  text        NOT NULL,
    digest      text        NOT NULL,  -- keyed hash of the values: rewrite only on change
    resolved_at timestamptz NOT NULL DEFAULT now()
);
