"""Through the API: a migration onto a changed definition after a deploy of a node's
module lists the changed module in the dry run's ``differences`` (the dashboard's run
page has just said the code changed), and keeps it drifted; the server's verify of the
migrated run lists the migration it checked (``migrations``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_server import Served, wait_status

import interlock

NODES = '''
def first(state):
    return {"x": 1}

def check(state):
    return {"checked": True}
'''

AFTER = '''
def bump(state):
    return {"y": state["x"] + 1}
'''

GATED = '''
workflow: drifting
nodes:
  a: madnodes:first
  gate: {approval: {show: [x]}}
  b: madafter:bump
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: b, to: END}
'''

V2 = GATED.replace("  b: madafter:bump", "  c: madnodes:check\n  b: madafter:bump") \
    .replace("to: b, when", "to: c, when").replace("  - {from: b, to: END}",
                                                   "  - {from: c, to: b}\n  - {from: b, to: END}")


def test_the_api_dry_run_lists_the_changed_module_and_verify_the_migration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "madnodes.py").write_text(NODES)
    (tmp_path / "madafter.py").write_text(AFTER)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "drifting.yaml").write_text(GATED)
    (tmp_path / "v2.yaml").write_text(V2)
    served = Served(tmp_path)
    try:
        with served.client() as c:
            r = c.post("/api/workflows/drifting/runs", json={"run_id": "m1"})
            assert r.status_code == 201, r.text
            wait_status(c, "m1", "WAITING_APPROVAL")
            (tmp_path / "madafter.py").write_text(AFTER.replace("+ 1", "+ 2"))  # a deploy
            assert c.get("/api/runs/m1").json()["code_changed"] == ["b"]
            monkeypatch.syspath_prepend(str(tmp_path))
            body = {"definition": interlock.load(tmp_path / "v2.yaml").definition(),
                    "by": "ops"}
            dry = c.post("/api/runs/m1/migrate", json={**body, "dry_run": True})
            assert dry.status_code == 200, dry.text
            said = [d for d in dry.json()["differences"] if "madafter" in d]
            assert said and said[0].startswith(
                "the code of module 'madafter' changed since the run started"), said
            moved = c.post("/api/runs/m1/migrate", json=body)
            assert moved.status_code == 200, moved.text
            seq = moved.json()["recorded"]
            # not accepted with the new definition: still said before anyone decides
            assert c.get("/api/runs/m1").json()["code_changed"] == ["b"]
            verified = c.get("/api/runs/m1/verify").json()
            assert verified["ok"], verified
            [migration] = verified["migrations"]
            assert migration["seq"] == seq and migration["by"] == "ops"
            assert migration["from_hash"] != migration["to_hash"]
    finally:
        served.stop()
