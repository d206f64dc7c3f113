"""One error hierarchy for cronwell; client-library errors are translated at the boundary."""

from __future__ import annotations


class CronwellError(Exception):
    """Base of every error cronwell raises on purpose; the CLI prints these without a traceback."""


class SpecError(CronwellError, ValueError):
    """A ScheduledJob (or WorkerPool) spec is invalid; the message names the field and the fix."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        super().__init__(message)


class DatabaseError(CronwellError):
    """PostgreSQL could not be reached or refused a request."""


class UniqueViolation(DatabaseError):
    """A row with the same unique key exists (the store's functions say which callers expect it)."""

    def __init__(self, message: str, constraint: str | None = None):
        self.constraint = constraint
        super().__init__(message)


class DatabaseUnavailable(DatabaseError):
    """The database is unreachable (wrong URL, server down, network cut)."""


class LockTimeout(DatabaseUnavailable):
    """A lock was not granted within the statement's `lock_timeout` (a strong lock that
    must not queue the hot path behind it): the caller backs off and tries again."""


class SchemaTooNew(DatabaseError):
    """The database schema was migrated by a newer cronwell than this one."""


class ApiUnavailable(CronwellError):
    """The Kubernetes API server is unreachable or overloaded (connection error, 429, 5xx):
    time fixes it, so background loops retry with backoff."""


EXPECTED_ERRORS: tuple[type[Exception], ...] = (DatabaseUnavailable, ApiUnavailable)
"""What a background loop expects and retries with backoff (logged as one line); any other
exception is a bug: logged with its traceback, and the process exits non-zero."""


class SchemaMissing(DatabaseError):
    """The database has no cronwell schema, or an older one: `cronwell migrate` first."""


class PartitionMismatch(CronwellError):
    """A process was configured with a partition count the store does not use."""


class JobNotFound(CronwellError):
    """No live job with that namespace/name exists in the store."""


class LeaseLost(CronwellError):
    """A heartbeat or completion matched zero rows: another worker owns the occurrence now."""
