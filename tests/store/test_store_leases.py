"""`Store.leases()`: the claims held now, as the server's workers view lists them, on
every store (test_store_conformance's ``store`` fixture: memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import time

from test_store_conformance import new_row, pg_schema_url, run, store

from interlock._store import Store

__all__ = ["pg_schema_url", "store"]  # the fixtures, used by name


def test_leases_lists_the_runs_held_by_owner_and_drops_released_ones(store: Store) -> None:
    async def main() -> None:
        rows = [new_row(f"lease-{i}", workflow="triage")[::2] for i in range(3)]
        for row, entries in rows:
            await store.create_run(row, entries)
        assert await store.leases() == []
        before = time.time()
        await store.claim("lease-2", "hostb:22", 30.0)
        await store.claim("lease-0", "hosta:11", 30.0)
        await store.claim("lease-1", "hosta:11", 30.0)
        got = await store.leases()
        assert [(d["owner"], d["run_id"]) for d in got] == [
            ("hosta:11", "lease-0"), ("hosta:11", "lease-1"), ("hostb:22", "lease-2")]
        assert all(d["workflow"] == "triage" and d["status"] == "RUNNING" for d in got)
        assert all(before + 29 <= d["lease_until"] <= time.time() + 31 for d in got)
        await store.release("lease-0", "hosta:11")
        assert [d["run_id"] for d in await store.leases()] == ["lease-1", "lease-2"]
    run(main)
