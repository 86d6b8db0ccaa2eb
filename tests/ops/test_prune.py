"""`interlock prune` (SPEC §10): finished runs older than a cut-off go, with their records;
waiting runs and the children of kept parents stay; the space is given back."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import interlock
from interlock import START, Workflow
from interlock.cli import cli

DAY = 86400.0


def workflow() -> Workflow:
    wf = Workflow("kept", state={"log": "append"})
    wf.node("a", lambda s: {"log": "x" * 2000})  # records with some weight
    wf.approval("gate", show=["log"])
    wf.node("b", lambda s: {"done": True})
    wf.edge(START, "a").edge("a", "gate").edge("gate", "b", when='gate.decision == "approved"')
    return wf


def age(db: Path, run_id: str, days: float) -> None:
    """Make a run look ``days`` old, as the clock would (an operator's edit of the row)."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET updated_at = ?, created_at = ? WHERE run_id = ?",
                     (time.time() - days * DAY, time.time() - days * DAY, run_id))


def settled(db: Path) -> None:
    """Wait for the stores of ``db`` the runs above let go of to finish closing: the last
    user of a shared store does not wait for SQLite's copy of its WAL into the file.
    (Threads are named by the file's name, unique here: another test's threads on a
    ``runs.db`` it leaves open are not waited for -- CI waited minutes on them.)"""
    for t in threading.enumerate():
        if t.name.startswith("interlock-sqlite") and t.name.endswith(":" + db.name):
            t.join(timeout=30)


def prune(db: Path, *args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, ["prune", *args, "--json", "--store", f"sqlite:///{db}"],
                                catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout) if result.exit_code == 0 else None


def test_prune_deletes_old_finished_runs_and_keeps_waiting_ones_and_kept_parents_children(
        tmp_path: Path) -> None:
    db = tmp_path / "prune-kept-parents.db"
    store = f"sqlite:///{db}"
    wf = workflow()
    old_done = [wf.run_sync(store=store) for _ in range(3)]
    for r in old_done:
        assert r.status == "WAITING_APPROVAL"
        assert wf.resume_sync(r.run_id, interlock.approve(), store=store).status == "COMPLETED"
    waiting = wf.run_sync(store=store)  # old too, but waiting for a human
    recent = wf.run_sync(store=store)
    wf.resume_sync(recent.run_id, interlock.approve(), store=store)
    # a fork of the recent run: old (as if), but its parent is kept
    import asyncio

    fork = asyncio.run(interlock.fork(recent.run_id, 3, store=store, workflow=wf))
    assert fork.status == "WAITING_APPROVAL"
    asyncio.run(interlock.resume(fork.run_id, interlock.reject(), store=store, workflow=wf))
    for run_id in [r.run_id for r in old_done] + [waiting.run_id, fork.run_id]:
        age(db, run_id, 40)

    code, dry = prune(db, "--older-than", "30d", "--dry-run")
    assert code == 0 and dry["dry_run"]
    assert sorted(dry["runs"]) == sorted(r.run_id for r in old_done)
    assert dry["kept_children"] == [fork.run_id]
    assert len(asyncio.run(interlock.list_runs(store=store))) == 6  # nothing deleted

    settled(db)
    size = db.stat().st_size + (os.path.getsize(f"{db}-wal") if Path(f"{db}-wal").exists()
                                else 0)
    code, done = prune(db, "--older-than", "30d")
    settled(db)
    assert code == 0 and not done["dry_run"]
    assert sorted(done["runs"]) == sorted(r.run_id for r in old_done)
    assert done["records"] > 0
    left = {r.run_id for r in asyncio.run(interlock.list_runs(store=store))}
    assert left == {waiting.run_id, recent.run_id, fork.run_id}
    with sqlite3.connect(db) as conn:
        gone = [r.run_id for r in old_done]
        marks = ", ".join("?" * len(gone))
        assert conn.execute(f"SELECT count(*) FROM records WHERE run_id IN ({marks})",
                            gone).fetchone() == (0,)
    # it freed what it says: the file (and WAL) before, minus after its VACUUM
    after = db.stat().st_size + (os.path.getsize(f"{db}-wal") if Path(f"{db}-wal").exists()
                                 else 0)
    assert done["bytes_before"] == size and done["bytes_after"] == after
    assert done["bytes_freed"] == size - after > 0
    # what is left still verifies
    for run_id in left:
        assert asyncio.run(interlock.verify(run_id, store=store)).ok


def test_status_filter_and_a_cut_off_nothing_is_older_than(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = f"sqlite:///{db}"
    wf = workflow()
    first = wf.run_sync(store=store)
    rejected = wf.resume_sync(first.run_id, interlock.reject(), store=store)
    assert rejected.status == "REJECTED"
    age(db, first.run_id, 2)
    assert prune(db, "--older-than", "3d")[1]["runs"] == []
    assert prune(db, "--older-than", "1d", "--status", "completed")[1]["runs"] == []
    assert prune(db, "--older-than", "1d", "--status", "rejected")[1]["runs"] == [first.run_id]


@pytest.mark.parametrize("args, message", [
    (["--older-than", "soon"], "expected an age with its unit, such as 30d"),
    (["--older-than", "30"], "expected an age with its unit"),  # not 30 seconds
    (["--older-than", "1d", "--status", "waiting"], "is not one of"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["prune", *args, "--store", f"sqlite:///{tmp_path}/r.db"])
    assert result.exit_code == 2 and message in result.output
