"""Tamper evidence (SPEC §2): a cut tail, a forged snapshot, and the keyed chain.

Each test edits a real SQLite store the way someone with write access to the file
would (with ``sqlite3``), then runs the commands a user would.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
import pytest
from conftest import record_row

from interlock._engine import _snapshot as snapshots

if TYPE_CHECKING:
    from conftest import CliProject as Project

NODES = """
import os


def first(state):
    return {"x": state.get("x", 0) + 1}


def flaky(state):
    if not os.path.exists("marker"):
        raise RuntimeError("the marker file is missing")
    return {"y": state["x"] + 1}


def step(state):
    return {"i": 1}


def report(state):
    return {"seen": state["i"]}
"""

FAILING = """
workflow: failing
nodes:
  a: {mod}:first
  f: {mod}:flaky
edges:
  - {from: START, to: a}
  - {from: a, to: f}
"""

LOOP_THEN_GATE = """
workflow: looped
state: {i: {reducer: add}}
limits: {steps: 1000}
nodes:
  step: {mod}:step
  gate: {approval: {show: [i]}}
  report: {mod}:report
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'i < 40'}
  - {from: step, to: gate, otherwise: true}
  - {from: gate, to: report, when: 'gate.decision == "approved"'}
"""


@pytest.fixture
def project(make_project: Callable[..., Project]) -> Project:
    return make_project(NODES, "tamper_nodes")


# -- a cut tail --------------------------------------------------------------------------------


def test_a_log_cut_at_its_end_is_refused_and_never_rewritten(project: Project) -> None:
    assert project.start(FAILING, "r-cut").exit_code == 1
    seqs = project.seqs("r-cut")
    project.sql(f"DELETE FROM entries WHERE id = {record_row('r-cut', seqs[-1])}")

    verify = project.cli("verify", "r-cut")
    assert verify.exit_code == 1 and "summary says last seq" in verify.stdout
    for args in (["status", "r-cut"], ["resume", "r-cut"], ["fork", "r-cut", "--at", "2"]):
        refused = project.cli(*args)
        # a broken log is not a usage mistake (2): exit 1, as verify, saying what to do
        assert refused.exit_code == 1, (args, refused.output)
        assert "records were removed from its end" in refused.stderr, (args, refused.stderr)
        assert "`interlock verify r-cut` shows where the chain breaks" in refused.stderr
    (project.root / "marker").touch()
    assert project.cli("resume", "r-cut").exit_code == 1
    assert project.seqs("r-cut") == seqs[:-1]  # nothing was written over the gap
    assert project.cli("verify", "r-cut").exit_code == 1  # and the cut is still seen


def test_a_last_record_replaced_with_another_is_refused(project: Project) -> None:
    assert project.start(FAILING, "r-swap").exit_code == 1
    last = project.seqs("r-swap")[-1]
    project.sql(f"UPDATE entries SET hash = ? WHERE id = {record_row('r-swap', last)}",
                bytes(32))
    project.sql("UPDATE runs SET last_hash = ? WHERE run_id = ?", "e" * 64, "r-swap")
    refused = project.cli("status", "r-swap")
    assert refused.exit_code == 1 and "broken at record" in refused.stderr


# -- snapshots ---------------------------------------------------------------------------------


@pytest.fixture
def snapshot_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "EVERY", 20)


def _forge_snapshot(project: Project, run_id: str, i: int) -> int:
    ((seq, raw),) = project.sql("SELECT seq, data FROM snapshots WHERE run_id = ?", run_id)
    data = orjson.loads(raw)
    assert data["state"]["i"] > 0
    data["state"]["i"] = i
    project.sql("UPDATE snapshots SET data = ? WHERE run_id = ?", orjson.dumps(data), run_id)
    return int(seq)


def test_a_snapshot_is_bound_to_the_chain_by_its_digest(project: Project,
                                                        snapshot_often: None) -> None:
    assert project.start(LOOP_THEN_GATE, "r-snap").exit_code == 3
    ((seq, raw),) = project.sql("SELECT seq, data FROM snapshots WHERE run_id = ?", "r-snap")
    ((rtype, data),) = project.sql("SELECT type, data FROM records WHERE run_id = ? AND seq = ?",
                                   "r-snap", seq + 1)
    assert rtype == "snapshot.taken"
    assert json.loads(data)["digest"] == hashlib.sha256(raw).hexdigest()
    assert json.loads(data)["covers"] == seq
    clean = project.cli("status", "r-snap", "--json")
    assert clean.exit_code == 3 and "warning" not in clean.stderr


def test_a_forged_snapshot_is_not_used_and_is_reported(project: Project,
                                                      snapshot_often: None) -> None:
    assert project.start(LOOP_THEN_GATE, "r-forge").exit_code == 3
    seq = _forge_snapshot(project, "r-forge", 999)

    status = project.cli("status", "r-forge", "--json")
    assert status.exit_code == 3
    assert json.loads(status.stdout)["state"]["i"] == 40  # the log's value, not the forgery
    assert f"the snapshot at record {seq} was not used" in status.stderr
    assert "changed after it was taken" in status.stderr

    verify = project.cli("verify", "r-forge")
    assert verify.exit_code == 0  # the log itself is intact
    assert f"the snapshot at record {seq} does not match the log" in verify.stderr

    approved = project.cli("resume", "r-forge", "--approve", "--by", "alice", "--json")
    assert approved.exit_code == 0, approved.output
    assert json.loads(approved.stdout)["state"]["seen"] == 40  # the node saw the true state
    assert project.cli("verify", "r-forge").exit_code == 0


def test_a_snapshot_whose_record_was_removed_is_not_used(project: Project,
                                                        snapshot_often: None) -> None:
    """An older interlock's snapshot, or one without its record: the whole log is folded."""
    assert project.start(LOOP_THEN_GATE, "r-old").exit_code == 3
    ((seq,),) = project.sql("SELECT seq FROM snapshots WHERE run_id = ?", "r-old")
    project.sql("UPDATE snapshots SET seq = ? WHERE run_id = ?", seq - 1, "r-old")
    status = project.cli("status", "r-old", "--json")
    assert status.exit_code == 3 and json.loads(status.stdout)["state"]["i"] == 40


# -- the keyed chain ---------------------------------------------------------------------------

KEY = {"INTERLOCK_LOG_KEY": "correct horse battery staple"}
OTHER_KEY = {"INTERLOCK_LOG_KEY": "another key"}


def test_a_keyed_log_verifies_with_its_key_only(project: Project) -> None:
    assert project.start(FAILING, "r-key", env=KEY).exit_code == 1
    ((data,),) = project.sql("SELECT data FROM records WHERE run_id = ? AND seq = 1", "r-key")
    first = json.loads(data)
    assert first["chain"] == "hmac-sha256" and len(first["key_id"]) == 16
    assert "correct horse" not in data  # the key itself is never stored

    ok = project.cli("verify", "r-key", env=KEY)
    assert ok.exit_code == 0 and "written by a holder of INTERLOCK_LOG_KEY" in ok.stdout
    without = project.cli("verify", "r-key")
    assert without.exit_code == 1 and "keyed log" in without.stdout
    wrong = project.cli("verify", "r-key", env=OTHER_KEY)
    assert wrong.exit_code == 1 and first["key_id"] in wrong.stdout
    # another key is not tampering: "not verified" with the fix, never "broken ... at
    # record 1 of 0" and restore-from-backup advice (it said that before)
    assert wrong.stdout.startswith("not verified: r-key: run 'r-key' was written with the "
                                   f"log key {first['key_id']}")
    assert "set it to the run's key" in wrong.stdout
    assert "broken" not in wrong.stdout and "backup" not in wrong.stdout
    assert "its records were not checked" in wrong.stdout

    # reading without the key works, and says the chain was not checked
    shown = project.cli("status", "r-key")
    assert shown.exit_code == 1 and "its hashes were not checked" in shown.stderr
    # continuing needs the key: a record written without it could not be told from a forgery
    (project.root / "marker").touch()
    refused = project.cli("resume", "r-key")
    assert refused.exit_code == 2 and "INTERLOCK_LOG_KEY" in refused.stderr
    assert project.cli("resume", "r-key", env=OTHER_KEY).exit_code == 2
    done = project.cli("resume", "r-key", env=KEY)
    assert done.exit_code == 0, done.output
    assert project.cli("verify", "r-key", env=KEY).exit_code == 0


def _rechain_plain(project: Project, run_id: str) -> None:
    """What someone who can write the store but has no key can do: edit a record and
    recompute every hash after it (and the summary) with plain SHA-256."""
    rows = project.sql("SELECT seq, data FROM records WHERE run_id = ? ORDER BY seq", run_id)
    prev = "0" * 64
    with sqlite3.connect(project.db) as conn:
        for seq, data in rows:
            if seq == 2:
                data = data.replace('"x":1', '"x":7')
            prev = hashlib.sha256(prev.encode() + data.encode()).hexdigest()
            conn.execute(f"UPDATE entries SET data = ?, hash = ? "
                         f"WHERE id = {record_row(run_id, seq)}", (data, bytes.fromhex(prev)))
        conn.execute("UPDATE runs SET last_hash = ? WHERE run_id = ?", (prev, run_id))


def test_a_rechained_plain_log_verifies_but_a_rechained_keyed_one_does_not(
        project: Project) -> None:
    assert project.start(FAILING, "r-plain").exit_code == 1
    _rechain_plain(project, "r-plain")
    assert project.cli("verify", "r-plain").exit_code == 0  # the documented limit of a plain chain

    assert project.start(FAILING, "r-keyed", env=KEY).exit_code == 1
    _rechain_plain(project, "r-keyed")
    broken = project.cli("verify", "r-keyed", env=KEY)
    assert broken.exit_code == 1 and "HMAC" in broken.stdout
    assert broken.stdout.startswith("broken: r-keyed at record 1 of ")
    assert "record 1 of 0" not in broken.stdout
    refused = project.cli("resume", "r-keyed", env=KEY)
    assert refused.exit_code == 1 and "broken at record 1" in refused.stderr


def test_with_the_key_set_a_plain_log_does_not_prove_who_wrote_it(project: Project) -> None:
    assert project.start(FAILING, "r-old").exit_code == 1
    refused = project.cli("verify", "r-old", env=KEY)
    assert refused.exit_code == 1 and "not keyed" in refused.stdout
    # not evidence of tampering either: "not verified", and how to check its plain chain
    assert refused.stdout.startswith("not verified: r-old: INTERLOCK_LOG_KEY is set, but "
                                     "the log of run 'r-old' is not keyed")
    assert "unset INTERLOCK_LOG_KEY" in refused.stdout and "broken" not in refused.stdout
    assert "record 1 of 0" not in refused.stdout
    assert project.cli("verify", "r-old").exit_code == 0
    # an old plain run still reads and resumes with a key set: it stays plain
    (project.root / "marker").touch()
    assert project.cli("resume", "r-old", env=KEY).exit_code == 0
    assert project.cli("verify", "r-old").exit_code == 0
