"""``/api/approvals`` says who may decide each gate -- also a child run's gate, shown in
its parent as ``remediate/a`` (the parent's definition does not know the child's
``approvers:``), and a map item's, ``deploy[i]`` -- and a decision through the parent is
held to the child gate's approvers: a refused decider gets 403 naming them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _harness import write_folder
from test_server import Served

pytest.importorskip("fastapi")

NODES = '''
def plan(state):
    return {"targets": ["t0", "t1"]}
'''

KID = '''
workflow: kid
input: [n]
nodes:
  a: {approval: {show: [n], approvers: [alice, "role:admin"]}}
  b: {approval: {show: [n]}}
edges:
  - {from: START, to: [a, b]}
'''

FAMILY = '''
workflow: family
nodes:
  plan: fnodes:plan
  remediate: {workflow: kid.yaml, input: {n: 'targets'}}
  deploy: {approval: {show: [targets], approvers: [bob]}}
edges:
  - {from: START, to: plan}
  - {from: plan, to: remediate}
  - {from: plan, map: 'targets', to: deploy, as: target, collect: deployed}
'''

TOKENS = {"alice": ("tok-alice", ["approver"]), "bob": ("tok-bob", ["approver"]),
          "ada": ("tok-ada", ["admin"]), "olga": ("tok-olga", ["operator"])}


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    write_folder(tmp_path, {"fnodes": NODES}, {"kid": KID, "family": FAMILY}, TOKENS)
    server = Served(tmp_path, "--auth", "auth.yaml")
    yield server
    server.stop()


def _approvals(c: Any, want: int, row: tuple[str, str] | None = None
               ) -> dict[tuple[str, str], list[str]]:
    """The inbox's rows and their approvers, once it has ``want`` rows (and ``row``)."""
    until = time.monotonic() + 60
    while True:
        rows = c.get("/api/approvals").json()
        keys = {(r["run_id"], r["node"]) for r in rows}
        if (len(rows) >= want and (row is None or row in keys)) or time.monotonic() > until:
            return {(r["run_id"], r["node"]): r["approvers"] for r in rows}
        time.sleep(0.05)


def test_child_and_item_gates_show_and_enforce_their_approvers(served: Served) -> None:
    with served.client("tok-olga") as c:
        made = c.post("/api/workflows/family/runs", json={"run_id": "fam"})
        assert made.status_code in (200, 201, 202), made.text
        shown = _approvals(c, 4)
        kid = "fam.remediate.1"
        # the child's own gates: by its id (the whole list has them as the parent's rows)
        own = {r["node"]: r["approvers"]
               for r in c.get("/api/approvals", params={"run_id": kid}).json()}
    assert shown == {
        ("fam", "remediate/a"): ["alice", "role:admin"], ("fam", "remediate/b"): [],
        ("fam", "deploy[0]"): ["bob"], ("fam", "deploy[1]"): ["bob"]}
    assert own == {"a": ["alice", "role:admin"], "b": []}

    # through the parent: the child gate's approvers decide, not the parent's (none)
    with served.client("tok-bob") as c:
        refused = c.post("/api/runs/fam/decisions",
                         json={"decision": "approve", "node": "remediate/a"})
        assert refused.status_code == 403, refused.text
        detail = refused.json()["detail"]
        assert "'bob' may not decide 'a'; its approvers are: alice, role:admin" in detail
        assert "a gate of child run 'fam.remediate.1', whose workflow 'kid'" in detail
        # a map item's gate: its node's approvers
        assert c.post("/api/runs/fam/decisions",
                      json={"decision": "approve", "node": "deploy[1]"}).status_code == 200
    with served.client("tok-alice") as c:
        refused = c.post("/api/runs/fam/decisions",
                         json={"decision": "approve", "node": "deploy[0]"})
        assert refused.status_code == 403 and "bob" in refused.json()["detail"]
    with served.client("tok-ada") as c:  # role:admin
        decided = c.post("/api/runs/fam/decisions",
                         json={"decision": "approve", "node": "remediate/a"})
        assert decided.status_code == 200, decided.text
        child = c.get(f"/api/runs/{kid}").json()
        assert child["state"]["a"]["by"] == "ada"
        # (the parent runs its node again, which continues the child: it waits at b)
        assert sorted(_approvals(c, 2, ("fam", "remediate/b"))) == [
            ("fam", "deploy[0]"), ("fam", "remediate/b")]
