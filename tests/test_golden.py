"""Golden logs: runs recorded by an earlier version must still verify and fold the same.

A change to the record format, the hash chain, or the fold's semantics that would
make old runs unreadable -- or resume differently -- fails here. To record a new
golden log on purpose, see how these were made in the stop-9 commit (a memory run,
its entries and definition written as JSON lines) and say why in the commit.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock._definition._spec import parse
from interlock._engine._fold import RunView
from interlock._log import Entry, verify_chain
from interlock._store import RunRow, Summary, open_store
from interlock._workflow import Workflow

GOLDEN = Path(__file__).parent / "golden"
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
