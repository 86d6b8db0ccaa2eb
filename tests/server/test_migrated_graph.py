"""A migrated run's graph (SPEC §14, docs/versions.md) through a real server: after a
migrate that adds a node, ``GET /api/runs/{id}/graph`` is the definition the run is on
now (the new node in it, ``migrated`` naming the record), and every edge record after
the migration names an edge of that graph, from and to the nodes it says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _harness import write_folder
from _workflows import gated_double, with_check
from test_server import Served, wait_status

NODES = '''
def first(state):
    return {"x": 1}

def check(state):
    return {"checked": True}

def double(state):
    return {"y": state["x"] * 2}
'''

GATED = gated_double("mnodes")
# v2: a node ``c`` between the gate and ``b`` (so the edges after the gate renumber)
GATED_V2 = with_check(GATED, "mnodes")


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    write_folder(tmp_path, {"mnodes": NODES}, {"gated": GATED})
    server = Served(tmp_path)
    yield server
    server.stop()


def _ends(edge: dict[str, Any]) -> tuple[list[str], list[str]]:
    def names(v: Any) -> list[str]:
        return [v] if isinstance(v, str) else list(v)
    return names(edge["from"]), names(edge["to"])


def test_a_migrated_runs_graph_is_the_definition_it_is_on(served: Served,
                                                          tmp_path: Path) -> None:
    with served.client() as c:
        for rid in ("moved", "kept"):
            assert c.post("/api/workflows/gated/runs", json={"run_id": rid}).status_code == 201
            wait_status(c, rid, "WAITING_APPROVAL")
        before = c.get("/api/runs/moved/graph").json()  # read (and remembered) before
        assert "c" not in [n["name"] for n in before["nodes"]]
        assert before.get("migrated") is None

        (tmp_path / "flows" / "gated.yaml").write_text(GATED_V2)
        moved = c.post("/api/runs/moved/migrate",
                       json={"definition": _definition(GATED_V2), "by": "ops"})
        assert moved.status_code == 200, moved.text
        at = moved.json()["recorded"]

        graph = c.get("/api/runs/moved/graph").json()
        assert "c" in [n["name"] for n in graph["nodes"]]
        assert graph["migrated"]["seq"] == at and graph["migrated"]["by"] == "ops"
        assert graph["migrated"]["to_hash"] == moved.json()["to_hash"]
        assert "c" in {n["name"] for n in graph["layout"]["nodes"]}  # and drawn
        # a run not migrated keeps the graph it started with
        kept = c.get("/api/runs/kept/graph").json()
        assert "c" not in [n["name"] for n in kept["nodes"]] and kept.get("migrated") is None

        decided = c.post("/api/runs/moved/decisions", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        run = wait_status(c, "moved", "COMPLETED")
        assert run["state"]["checked"] is True
        records = c.get("/api/runs/moved/records").json()
        after = [r for r in records
                 if r["type"] in ("edge.taken", "edge.skipped") and r["seq"] > at]
        assert after, records
        graph = c.get("/api/runs/moved/graph").json()  # the same, read incrementally
        assert graph["migrated"]["seq"] == at
        nodes = {n["name"] for n in graph["nodes"]} | {"START", "END"}
        for rec in after:  # each edge record names an edge of the graph drawn
            sources, targets = _ends(graph["edges"][rec["edge"]])
            assert rec["from"] in sources, (rec, graph["edges"])
            assert set(rec.get("to") or []) <= set(targets) and set(targets) <= nodes
        assert any(rec.get("to") == ["c"] for rec in after if rec["type"] == "edge.taken")


def _definition(text: str) -> dict[str, Any]:
    import yaml

    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded
