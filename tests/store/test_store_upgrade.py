"""A SQLite store written by interlock with schema version 1 opens with this one.

``golden/store-v1.db`` was written by the version-1 store (the stop-22 code, through
the CLI): the incident example approved twice (COMPLETED), waiting at its approval gate
(``inc-wait``), a fork of the first, a keyed run (``INTERLOCK_LOG_KEY=s3cret``), a run
with a sub-workflow and its child run, and a 200-step loop with a snapshot.
``store-v1.expected.json`` is what that version read back from it: each run's status,
state, summary, snapshot and a digest of its records (seq, type, node, hash, JSON).

Opening the file upgrades it in place to version 3 (2, then the claims' generation), in
one transaction; every record
must come back exactly as version 1 read it, every chain must verify, the waiting run
must go on, and an upgrade that fails or is killed half-way must leave version 1 as it
was.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock._store import open_store

GOLDEN = Path(__file__).parent.parent / "golden"
REPO = Path(interlock.__file__).resolve().parent.parent
KEY = "s3cret"  # the keyed run's key


def expected() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((GOLDEN / "store-v1.expected.json").read_text())
    return found


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    shutil.copyfile(GOLDEN / "store-v1.db", path)
    return path


def meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT key, value FROM interlock_meta"))


def v1_records(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT run_id, seq, type, node, data, hash FROM records "
                            "ORDER BY run_id, seq").fetchall()


async def read_back(url: str) -> dict[str, Any]:
    """What `mkexpected` (the script that wrote store-v1.expected.json) read with v1."""
    st = open_store(url)
    out = {}
    try:
        for row in await st.list_runs(limit=1000):
            digest = hashlib.sha256()
            for e in await st.entries(row.run_id):
                digest.update(f"{e.seq}|{e.type}|{e.node}|{e.hash}|".encode() + e.data + b"\n")
            snap = await st.load_snapshot(row.run_id)
            out[row.run_id] = {
                "status": row.summary.status, "last_seq": row.summary.last_seq,
                "last_hash": row.summary.last_hash, "parent_run": row.parent_run,
                "state": (await interlock.status(row.run_id, store=st)).state,
                "entries_sha256": digest.hexdigest(),
                "snapshot_seq": snap[0] if snap else None}
    finally:
        await st.close()
    return out


def test_a_version_1_file_is_upgraded_and_reads_back_exactly(
        v1: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    before = v1_records(v1)
    url = f"sqlite:///{v1}"
    got = asyncio.run(read_back(url))
    assert meta(v1) == {"schema": "interlock", "version": "3"}
    assert "upgrading the store" in caplog.text and f"({len(before)} records;" in caplog.text
    assert got == expected()
    # the records view shows what the version-1 table held, row for row
    assert v1_records(v1) == before
    for run_id in got:
        with monkeypatch.context() as env:
            if run_id == "inc-keyed":
                env.setenv("INTERLOCK_LOG_KEY", KEY)
            report = asyncio.run(interlock.verify(run_id, store=url))
        assert report.ok, (run_id, report)
        assert report.keyed == (run_id == "inc-keyed")
    caplog.clear()
    asyncio.run(read_back(url))  # opened again: nothing more to upgrade
    assert "upgrading" not in caplog.text and "did not fit" not in caplog.text
    with sqlite3.connect(v1) as conn:
        (free,), = conn.execute("PRAGMA freelist_count")
        assert free == 0  # the old tables' pages were given back
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "v1_leftovers" not in tables  # nothing odd in a file v1 wrote
        with pytest.raises(sqlite3.DatabaseError, match="read-only view"):
            conn.execute("UPDATE records SET data = '{}' WHERE run_id = 'loop' AND seq = 3")


# a version-1 file changed by hand: (the SQL, the runs verify must then call broken, why
# the record is kept in v1_leftovers; None: none is)
TAMPERED = [
    ("UPDATE records SET seq = 4294967296 + 100 WHERE run_id = 'inc-wait' AND seq = 19",
     {"inc-wait"}, "out of range"),
    ("UPDATE records SET seq = -1 WHERE run_id = 'inc-wait' AND seq = 19",
     {"inc-wait"}, "out of range"),
    ("UPDATE records SET hash = X'00112233' WHERE run_id = 'inc-done' AND seq = 5",
     {"inc-done"}, "64 lowercase hex"),
    ("UPDATE records SET hash = upper(hash) WHERE run_id = 'inc-done' AND seq = 5",
     {"inc-done"}, "64 lowercase hex"),
    ("UPDATE records SET hash = substr(hash, 1, 10) || ' ' || substr(hash, 11) "
     "WHERE run_id = 'inc-done' AND seq = 5", {"inc-done"}, "64 lowercase hex"),
    # a column version 2 does not keep: its evidence is the table and the warning
    ("UPDATE records SET node = 'elsewhere' WHERE run_id = 'inc-done' AND seq = 3",
     set(), "type or node column"),
    ("UPDATE records SET type = 'node.failed' WHERE run_id = 'inc-done' AND seq = 3",
     set(), "type or node column"),
    ("DELETE FROM runs WHERE run_id = 'sub'", set(), "of no run"),
]


@pytest.mark.parametrize(("sql", "broken", "why"), TAMPERED)
def test_a_changed_version_1_file_is_upgraded_with_its_evidence_kept(
        v1: Path, caplog: pytest.LogCaptureFixture, sql: str, broken: set[str], why: str
        ) -> None:
    with sqlite3.connect(v1) as conn:
        conn.execute(sql)
        (changed,), = conn.execute("SELECT count(*) FROM records")
    url = f"sqlite:///{v1}"
    runs = asyncio.run(interlock.list_runs(store=url, limit=100))  # every command works
    assert "did not fit schema version 3" in caplog.text
    verdicts = {r.run_id: asyncio.run(interlock.verify(r.run_id, store=url)).ok
                for r in runs if r.run_id != "inc-keyed"}  # (keyed: needs its key)
    assert {run for run, ok in verdicts.items() if not ok} == broken
    with sqlite3.connect(v1) as conn:
        kept = conn.execute("SELECT why FROM v1_leftovers").fetchall()
        (moved,), = conn.execute("SELECT count(*) FROM entries")
    assert kept and all(why in w for (w,) in kept), kept
    # every record is in the log or in the table (a changed column's: in both)
    assert moved + len(kept) >= changed


def test_a_waiting_run_of_a_version_1_file_goes_on(v1: Path, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    monkeypatch.chdir(REPO)  # the example's call targets resolve from here
    url = f"sqlite:///{v1}"
    result = asyncio.run(interlock.resume("inc-wait", interlock.approve(by="bob"), store=url))
    assert result.status == "WAITING_APPROVAL" and result.waiting is not None
    assert result.waiting["node"] == "code_fix"  # the policy edge took the run on
    done = asyncio.run(interlock.resume("inc-wait", interlock.approve(by="bob"), store=url))
    assert done.status == "COMPLETED", done.error
    report = asyncio.run(interlock.verify("inc-wait", store=url))
    assert report.ok, report
    with sqlite3.connect(v1) as conn:  # the new records follow the upgraded ones
        seqs = [s for (s,) in conn.execute("SELECT seq FROM records WHERE run_id = 'inc-wait' "
                                           "ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > expected()["inc-wait"][
        "last_seq"]


def test_an_upgrade_that_fails_leaves_the_version_1_file_as_it_was(v1: Path) -> None:
    with sqlite3.connect(v1) as conn:  # something in the way of the new table
        conn.execute("CREATE VIEW entries AS SELECT 1")
    before = v1_records(v1)
    with pytest.raises(interlock.StoreError, match="entries"):
        asyncio.run(read_back(f"sqlite:///{v1}"))
    assert meta(v1)["version"] == "1"
    assert v1_records(v1) == before
    with sqlite3.connect(v1) as conn:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE "
                                             "type = 'table'")}
    assert "runs_v2" not in tables


UPGRADE = r"""
import asyncio, sys
from interlock._store import open_store

async def main():
    st = open_store(sys.argv[1])
    try:
        await st.list_runs()
    finally:
        await st.close()
    print("upgraded", flush=True)

asyncio.run(main())
"""


def test_a_process_killed_during_an_upgrade_leaves_version_1_and_it_upgrades_later(
        v1: Path) -> None:
    # a big version-1 file (150 copies of the loop run: about 120,000 records), so that
    # the upgrade is still running when the process is killed
    with sqlite3.connect(v1) as conn:
        cols = [c for (_, c, *_) in conn.execute("PRAGMA table_info(runs)") if c != "run_id"]
        for n in range(150):
            conn.execute(f"INSERT INTO runs (run_id, {', '.join(cols)}) SELECT 'loop-{n}', "
                         f"{', '.join(cols)} FROM runs WHERE run_id = 'loop'")
            conn.execute(f"INSERT INTO records SELECT 'loop-{n}', seq, type, node, data, hash "
                         "FROM records WHERE run_id = 'loop'")
    before = v1_records(v1)
    url = f"sqlite:///{v1}"
    with subprocess.Popen([sys.executable, "-c", UPGRADE, url], cwd=REPO,
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
                          ) as child:
        try:
            assert child.stderr is not None
            line = child.stderr.readline()  # the upgrade's warning: it has begun
            assert "upgrading the store" in line, line
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert meta(v1)["version"] == "1"  # the transaction never committed
    assert v1_records(v1) == before
    got = asyncio.run(read_back(url))  # and the next open upgrades it whole
    assert meta(v1)["version"] == "3"
    assert v1_records(v1) == before
    assert {k: got[k] for k in expected()} == expected()
    assert all(got[f"loop-{n}"]["entries_sha256"] == got["loop"]["entries_sha256"]
               for n in range(150))


def _as_version_2(path: Path) -> None:
    """Turn an upgraded file back into what version 2 wrote: no claim generation."""
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN generation")
        conn.execute("UPDATE interlock_meta SET value = '2' WHERE key = 'version'")


def test_a_version_2_file_gets_the_claims_generation(v1: Path) -> None:
    url = f"sqlite:///{v1}"
    asyncio.run(read_back(url))  # upgraded to the current version
    _as_version_2(v1)
    assert meta(v1)["version"] == "2"

    async def main() -> None:
        st = open_store(url)
        try:
            rows = await st.list_runs(limit=1000)
            assert rows and {r.generation for r in rows} == {0}
            assert await st.claim("inc-wait", "host-a:1", 60) == 1  # the first claim
            for row in rows:
                if row.run_id != "inc-keyed":  # (checked with its key elsewhere)
                    assert (await interlock.verify(row.run_id, store=st)).ok, row.run_id
        finally:
            await st.close()

    asyncio.run(main())
    assert meta(v1)["version"] == "3"
    with sqlite3.connect(v1) as conn:
        assert "generation" in {c[1] for c in conn.execute("PRAGMA table_info(runs)")}
