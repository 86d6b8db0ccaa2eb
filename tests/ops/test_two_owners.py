"""Two would-be owners of one run, with real ``interlock worker`` processes, on SQLite
and PostgreSQL (issue 26): an ``async def`` node that blocks its event loop for longer
than the lease, and a worker SIGSTOPped past its lease then SIGCONTed. The first keeps
the lease (its lease-keeper thread renews it) or stops when it wakes (the claim is
gone); exactly one owner's records land; no ``ctx.once`` effect runs twice.

One trial each here (the harness is tests/_two_owners.py); bench/two_owners.py runs 26
timed trials each, with its figures in bench/HISTORY.md, "Two owners of one run".
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _two_owners import trial
from test_store_conformance import pg_schema_url  # noqa: F401 - a fixture used below


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    url: str = request.getfixturevalue("pg_schema_url")  # a schema of its own
    return url


def test_a_node_blocking_its_loop_past_the_lease_keeps_it(tmp_path: Path,
                                                          store_url: str) -> None:
    # the loop is blocked 2.5 leases long: only a renewal off the loop keeps the run
    found = trial(tmp_path, store_url, "block", lease=2.0, block=5.0)
    assert found.ok, found.why()


def test_a_worker_stopped_past_its_lease_stops_when_continued(tmp_path: Path,
                                                              store_url: str) -> None:
    for attempt in range(3):
        found = trial(tmp_path / str(attempt), store_url, "stop", lease=2.0)
        if not found.no_takeover:
            break
        # SQLite: A was stopped inside a write and held the file's lock, so B could not
        # take over (bench/HISTORY.md: 1 trial in 26); the run completed once, by A
        assert found.effects == Counter({"before": 1, "after": 1, "post": 1}), found.why()
    assert found.ok, found.why()
    # told the run moved on: to B, or -- when B finished it and released the claim
    # before A's next write -- to "another owner (since released)"
    assert "moved to" in found.a_text and "being executed by nobody" not in found.a_text
