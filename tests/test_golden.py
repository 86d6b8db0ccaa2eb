"""Golden logs: runs recorded by an earlier version must still verify and fold the same.

Logs of every format are here (``_log.FORMAT``): ``*-format1`` were recorded by main
before log format 2 (3316f75; the older ones by stop 9's), ``*-format2`` by the version
that introduced it, ``*-format3`` by the one that introduced format 3 (a loop's visit
carries its ``when`` decision; ``gated-loop-format3`` waits at a gate, with a loop
after it). Each goes through ``trace``, ``verify`` and ``resume``: a waiting run is
continued in its own format (a run keeps the format it started with).

A change to the record format, the hash chain, or the fold's semantics that would
make old runs unreadable -- or resume differently -- fails here. To record a new
golden log on purpose, see how these were made in the stop-9 commit (a memory run,
its entries and definition written as JSON lines) and say why in the commit.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock._definition._spec import parse
from interlock._engine._expand import Expander
from interlock._engine._fold import RunView
from interlock._log import Entry, verify_chain
from interlock._store import RunRow, Summary, open_store
from interlock._workflow import Workflow

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).parent.parent  # (the examples the goldens ran import from there)
NAMES = sorted(p.name.removesuffix(".jsonl") for p in GOLDEN.glob("*.jsonl"))


def read(name: str) -> tuple[dict[str, Any], list[Entry], dict[str, Any]]:
    lines = (GOLDEN / f"{name}.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    # the files keep what the chain covers; a store's node column is derived from the data
    entries = [Entry(d["seq"], d["type"], d["data"].encode(), d["hash"],
                     json.loads(d["data"]).get("node"))
               for d in map(json.loads, lines[1:])]
    expected = json.loads((GOLDEN / f"{name}.expected.json").read_text())
    return head, entries, expected


@pytest.mark.parametrize("name", NAMES)
def test_golden_log_verifies_and_folds_to_the_same_run(name: str) -> None:
    head, entries, expected = read(name)
    assert verify_chain(entries) is None
    plan = Workflow.from_spec(parse(head["definition"])).reading_plan()
    view = RunView(plan)
    for e in entries:
        view.apply(e.record())
    assert view.status == expected["status"]
    assert view.state == expected["state"]
    assert (view.steps, view.tokens) == (expected["steps"], expected["tokens"])


@pytest.mark.parametrize("name", NAMES)
def test_golden_log_is_readable_from_a_store(name: str, tmp_path: Path) -> None:
    head, entries, expected = read(name)
    url = f"sqlite:///{tmp_path}/runs.db"
    run_id = entries[0].record().get("run_id") or f"golden-{name}"

    async def main() -> None:
        st = open_store(url)
        try:
            last = entries[-1]
            await st.create_run(RunRow(
                run_id=run_id, workflow=head["definition"]["workflow"],
                definition=head["definition"], definition_hash=head["definition_hash"],
                input={}, options={}, created_at=0.0,
                summary=Summary(status=expected["status"], last_seq=last.seq,
                                last_hash=last.hash, steps=expected["steps"],
                                tokens=expected["tokens"])), entries)
        finally:
            await st.close()

    asyncio.run(main())
    assert asyncio.run(interlock.verify(run_id, store=url)).ok
    status = asyncio.run(interlock.status(run_id, store=url))
    assert status.status == expected["status"] and status.state == expected["state"]


def _stored(name: str, url: str) -> str:
    """The golden run put into the store at ``url`` (its id)."""
    head, entries, expected = read(name)
    run_id = entries[0].record().get("run_id") or f"golden-{name}"

    async def main() -> None:
        st = open_store(url)
        try:
            last = entries[-1]
            await st.create_run(RunRow(
                run_id=run_id, workflow=head["definition"]["workflow"],
                definition=head["definition"], definition_hash=head["definition_hash"],
                input={}, options={}, created_at=0.0,
                summary=Summary(status=expected["status"], last_seq=last.seq,
                                last_hash=last.hash, steps=expected["steps"],
                                tokens=expected["tokens"])), entries)
        finally:
            await st.close()

    asyncio.run(main())
    return run_id


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    # (the goldens' nodes: the examples, from the root; tests/golden/golden_loop.py)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(GOLDEN)) if p)
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})


@pytest.mark.parametrize("name", NAMES)
def test_each_golden_log_goes_through_trace_verify_and_resume(name: str,
                                                              tmp_path: Path) -> None:
    _, entries, expected = read(name)
    url = f"sqlite:///{tmp_path}/runs.db"
    run_id = _stored(name, url)
    # trace: every stored record, in order, and what format 2 implies written out
    traced = json.loads(_cli("trace", run_id, "--store", url, "--json").stdout)
    assert [r["seq"] for r in traced] == [e.seq for e in entries]
    fmt = entries[0].record().get("format", 1)
    assert any(r.get("implies") for r in traced) == (fmt > 1)
    text = _cli("trace", run_id, "--store", url)
    assert text.returncode == 0 and "warning" not in text.stderr, text.stderr
    assert _cli("verify", run_id, "--store", url).returncode == 0
    resumed = _cli("resume", run_id, "--store", url, "--approve", "--by", "golden")
    if expected["status"] == "COMPLETED":  # refused, and nothing recorded
        # (refused before its code is loaded: the stop-9 logs name functions since renamed)
        assert resumed.returncode == 2 and "is COMPLETED" in resumed.stderr, resumed.stderr
        assert len(asyncio.run(interlock.trace(run_id, store=url))) == len(traced)
        return
    assert resumed.returncode in (0, 3), resumed.stderr  # on to its next gate, or done
    after = [e.record() for e in asyncio.run(_entries(url, run_id))]
    assert len(after) > len(entries)
    assert asyncio.run(interlock.verify(run_id, store=url)).ok
    # the run keeps its format: a format-1 log is continued in format 1, a format-3 one
    # in format 3 (the loop after the gate: its visits carry their decisions)
    assert all(r["type"] != "node.visited" for r in after) == (fmt == 1)
    assert any("when" in r for r in after[len(entries):]) == (fmt == 3)


async def _entries(url: str, run_id: str) -> list[Entry]:
    st = open_store(url)
    try:
        return await st.entries(run_id)
    finally:
        await st.close()


@pytest.mark.parametrize("names", [("loop-format1", "loop-format2"),
                                   ("loop-format2", "loop-format3")])
def test_a_log_and_its_twin_of_the_next_format_fold_to_the_same_run(
        names: tuple[str, str]) -> None:
    """The same workflow recorded in each format (the ``loop`` goldens): the same state,
    steps and visits; the newer format in fewer records, and read as format 1 writes
    them (`Expander`, start and completion split) the same records but for seqs and
    times."""
    views, logs = [], []
    for name in names:
        head, entries, _ = read(name)
        plan = Workflow.from_spec(parse(head["definition"])).reading_plan()
        view = RunView(plan)
        for e in entries:
            view.apply(e.record())
        views.append(view)
        logs.append(Expander(plan, split=True).expand([e.record() for e in entries]))
    old, new = views
    assert (new.status, new.state, new.steps, dict(new.visits), dict(new.takes)) == (
        old.status, old.state, old.steps, dict(old.visits), dict(old.takes))
    assert len(read(names[1])[1]) < len(read(names[0])[1])
    drop = {"seq", "at", "duration_ms", "implied", "format", "code", "definition_hash"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in logs[1]] == \
        [{k: v for k, v in r.items() if k not in drop} for r in logs[0]]
