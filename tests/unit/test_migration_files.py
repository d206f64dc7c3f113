"""Migration files: one per version, numbered without gaps. Two branches that each add a
migration with the same number would otherwise merge silently, and `migrate` (which records
versions, not names) would skip one of them on every database that has the other."""

from __future__ import annotations

from cronwell.store.migrate import migrations


def test_versions_are_unique_and_contiguous() -> None:
    versions = [v for v, _, _ in migrations()]
    assert len(versions) == len(set(versions)), f"two migrations share a number: {versions}"
    assert versions == list(range(1, len(versions) + 1)), versions
