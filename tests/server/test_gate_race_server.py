"""A decision made through a server that records decisions for workers (``serve
--workers 0``) while another gate still waits: the run's row (WAITING_APPROVAL) and the
status its log folds to agree for ``verify`` (review finding 2: it called the log
tampered with until a worker ran the branch)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _workflows import detached
from test_server import Served

import interlock

FLOW = detached("detached_nodes")

NODES = """
def prep(state):
    return {"ready": True}


def after_legal(state):
    return {"legal_done": True}
"""


def test_a_decision_recorded_for_workers_while_another_gate_waits_verifies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "detached.yaml").write_text(FLOW)
    (tmp_path / "detached_nodes.py").write_text(NODES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = interlock.load(str(tmp_path / "flows" / "detached.yaml"))
    assert wf.run_sync(store=store, run_id="w2").status == "WAITING_APPROVAL"
    server = Served(tmp_path, "--workers", "0", store=store)
    try:
        with server.client() as c:
            decided = c.post("/api/runs/w2/decisions",
                             json={"decision": "approve", "node": "legal", "by": "al"})
            assert decided.status_code == 200, decided.text
            run = c.get("/api/runs/w2").json()
    finally:
        server.stop()
    assert run["status"] == "WAITING_APPROVAL"
    assert [g["node"] for g in run["waiting"]["pending"]] == ["security"]
    verified = asyncio.run(interlock.verify("w2", store=store))
    assert verified.ok, verified.message
    records = asyncio.run(interlock.trace("w2", store=store))
    assert [r["node"] for r in records if r["type"] == "approval.decided"] == ["legal"]
