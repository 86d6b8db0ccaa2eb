"""The PostgreSQL store's schema version is its own (issue 26): it wrote SQLite's
``SCHEMA_VERSION`` into its ``interlock_meta``, so a change of SQLite's file layout would
have made every PostgreSQL store claim a layout it does not have (and refused the stores
of the interlock before it). On a real PostgreSQL (``$INTERLOCK_TEST_POSTGRES``)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from test_store_conformance import pg_schema_url  # noqa: F401  (a fixture)

import interlock
from interlock import StoreError, Workflow, open_store
from interlock._store import (
    _postgres,
    _postgres_claims,
    _postgres_conn,
    _postgres_sql,
    _postgres_writes,
    _sqlite_sql,
)


def test_the_postgres_store_has_its_own_schema_version() -> None:
    for module in (_postgres, _postgres_conn, _postgres_writes, _postgres_claims, _postgres_sql):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module and node.module.endswith(("_rows", "_sqlite", "_sqlite_sql"))
                    for alias in node.names}
        assert "SCHEMA_VERSION" not in imported, \
            "the PostgreSQL store must not take SQLite's SCHEMA_VERSION: its tables change apart"
    tree = ast.parse(Path(_postgres_sql.__file__ or "").read_text())
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name)}
    assert "SCHEMA_VERSION" in defined
    assert isinstance(_postgres_sql.SCHEMA_VERSION, int)
    assert isinstance(_sqlite_sql.SCHEMA_VERSION, int)


def _meta(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return {str(k): str(v) for k, v in
                conn.execute("SELECT key, value FROM interlock_meta").fetchall()}


def _set_version(url: str, version: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE interlock_meta SET value = %s WHERE key = 'version'", (version,))


def _run(url: str, run_id: str) -> str:
    wf = Workflow("pgv").node("a", lambda s: {"a": 1}).edge(interlock.START, "a")

    async def main() -> str:
        async with open_store(url) as st:
            return (await wf.run({}, store=st, run_id=run_id)).status

    return asyncio.run(main())


def test_a_postgres_store_records_and_checks_its_own_version(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # a change of SQLite's layout is not one of PostgreSQL's
    monkeypatch.setattr(_sqlite_sql, "SCHEMA_VERSION", _sqlite_sql.SCHEMA_VERSION + 5)
    assert _run(pg_schema_url, "r1") == "COMPLETED"
    assert _meta(pg_schema_url) == {"schema": "interlock",
                                    "version": str(_postgres_sql.SCHEMA_VERSION)}
    # a store written by an interlock before (version 1: the same tables) opens and works
    _set_version(pg_schema_url, "1")
    assert _run(pg_schema_url, "r2") == "COMPLETED"
    # one newer than this interlock's PostgreSQL layout is refused, naming both versions
    _set_version(pg_schema_url, str(_postgres_sql.SCHEMA_VERSION + 1))

    async def refused() -> None:
        async with open_store(pg_schema_url) as st:
            with pytest.raises(StoreError, match=rf"schema version "
                               rf"'{_postgres_sql.SCHEMA_VERSION + 1}', newer than this "
                               rf"interlock understands \({_postgres_sql.SCHEMA_VERSION}\)"):
                await st.list_runs()

    asyncio.run(refused())
