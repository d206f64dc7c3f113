"""The store: every SQL statement of cronwell, migrations, and the connection pool."""

from cronwell.store.db import Database
from cronwell.store.migrate import SCHEMA_VERSION, migrate

__all__ = ["SCHEMA_VERSION", "Database", "migrate"]
