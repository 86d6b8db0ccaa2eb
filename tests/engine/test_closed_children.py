"""A child run nothing waits for any more is closed the way its parent's own gates are
(docs/semantics.md, several gates at once): when the parent is rejected (and its other
gates closed), cancelled, or an item of its map fails (and its siblings' gates closed),
each child that waited at gates of its own gets an ``approval.decided`` ``closed`` per
gate, saying why, and ends REJECTED (the parent was) or CANCELLED -- and so on down to
its own children. It no longer shows in ``runs --waiting`` or ``/api/approvals``, and
a decision on its gate is refused. A process killed between the parent's record and the
child's leaves the child to the next look: the lists of waiting runs close it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _workflows import toolchat
from conftest import CliProject
from test_child_gates import CHILD, GRANDCHILD, MIDDLE, NODES, PARENT, TOP
from test_mapped_gates import FLEET, GATED_CHILD
from test_mapped_gates import NODES as FLEET_NODES
from test_store_conformance import pg_schema_url  # noqa: F401 (a fixture)

import interlock
from interlock.server._reads import Approvals


def _status(p: CliProject, run_id: str) -> str:
    _, out = p.cli_json("status", run_id)
    return str(out["status"])


def _waiting(p: CliProject) -> list[tuple[str, str]]:
    result, rows = p.cli_json("runs", "--waiting")
    assert result.exit_code == 0, result.output
    return sorted((r["run_id"], r["waiting"]["node"]) for r in rows)


def _closed(p: CliProject, run_id: str) -> list[tuple[str, str | None]]:
    return [(r["node"], r.get("comment")) for r in p.records(run_id)
            if r["type"] == "approval.decided" and r["decision"] == "closed"]


def test_a_rejected_parent_closes_its_child_and_grandchild_gates(
        make_project: Callable[..., CliProject]) -> None:
    """``legal`` rejected with no rejection route: the parent ends REJECTED and closes its
    other gate, the one through ``remediate`` -- its child (gate ``b``) and grandchild
    (gate ``approval``) end REJECTED too, each gate closed with the reason."""
    p = make_project(NODES)
    p.workflow(GRANDCHILD, "grandchild.yaml")
    p.workflow(MIDDLE, "middle.yaml")
    assert p.cli("run", p.workflow(TOP, "top.yaml"), "--run-id", "rj").exit_code == 3
    child, grandchild = "rj.remediate.1", "rj.remediate.1.fix.1"
    # (the child's and grandchild's gates are listed once: as the parent's rows)
    assert [r for r, _ in _waiting(p)] == ["rj", "rj", "rj"]
    assert _status(p, child) == _status(p, grandchild) == "WAITING_APPROVAL"
    result, out = p.cli_json("resume", "rj", "--reject", "--gate", "legal", "--by", "lu")
    assert result.exit_code == 4, result.output
    assert out["status"] == "REJECTED"
    assert _status(p, child) == "REJECTED" and _status(p, grandchild) == "REJECTED"
    why = "not needed: the parent run 'rj' was rejected at 'legal'"
    assert sorted(_closed(p, child)) == [("b", why), ("fix", why)]
    assert _closed(p, grandchild) == [
        ("approval", "not needed: the parent run 'rj.remediate.1' was rejected at 'b'")]
    ends = [r for r in p.records(child) if r["type"] == "run.rejected"]
    assert len(ends) == 1 and ends[0]["error"]["message"] == why
    assert _waiting(p) == []
    # nothing to decide any more, through the parent or in the child
    assert p.cli("resume", "rj", "--approve", "--gate", "remediate/b").exit_code == 2
    assert p.cli("resume", child, "--approve", "--gate", "b").exit_code == 2
    for run in ("rj", child, grandchild):
        assert p.cli("verify", run).exit_code == 0
    assert p.executions() == []


def test_a_failed_item_closes_the_children_of_its_siblings(
        make_project: Callable[..., CliProject]) -> None:
    """A map over a sub-workflow whose children wait: item 0's child rejected fails the
    item, the other items' gates are closed and the map's error edge takes the run on --
    the children of items 1 and 2 are not needed and end CANCELLED, saying why."""
    p = make_project(FLEET_NODES)
    p.workflow(GATED_CHILD, "gated.yaml")
    assert p.cli("run", p.workflow(FLEET, "fleet.yaml"), "--run-id", "fl").exit_code == 3
    result, out = p.cli_json("resume", "fl", "--reject", "--gate", "remediate[0]/approval",
                             "--by", "al")
    assert result.exit_code == 0, result.output
    assert out["status"] == "COMPLETED" and p.executions() == ["triage"]
    assert _status(p, "fl.remediate.1.0") == "REJECTED"  # the rejected one, as before
    why = ("not needed: the parent run 'fl' closed the gate that waited through it "
           "(item 0 of 'remediate' failed)")
    for i in (1, 2):
        child = f"fl.remediate.1.{i}"
        assert _status(p, child) == "CANCELLED"
        assert _closed(p, child) == [("approval", why)]
        assert p.cli("verify", child).exit_code == 0
    assert _waiting(p) == []
    assert p.cli("verify", "fl").exit_code == 0


FLEET_LEGAL = FLEET.replace(
    "  triage: {mod}:triage\n",
    "  triage: {mod}:triage\n  legal: {approval: {show: [env]}}\n").replace(
    "  - {from: plan, map:", "  - {from: plan, to: legal}\n  - {from: plan, map:")


def test_a_rejected_parent_closes_the_children_of_its_map_items(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(FLEET_NODES)
    p.workflow(GATED_CHILD, "gated.yaml")
    assert p.cli("run", p.workflow(FLEET_LEGAL, "fl.yaml"), "--run-id", "fr").exit_code == 3
    assert len(_waiting(p)) == 4  # the parent's 4 gates (3 of them its children's)
    assert {r for r, _ in _waiting(p)} == {"fr"}
    assert {_status(p, f"fr.remediate.1.{i}") for i in range(3)} == {"WAITING_APPROVAL"}
    result = p.cli("resume", "fr", "--reject", "--gate", "legal", "--by", "lu")
    assert result.exit_code == 4, result.output
    for i in range(3):
        assert _status(p, f"fr.remediate.1.{i}") == "REJECTED"
        assert _closed(p, f"fr.remediate.1.{i}") == [
            ("approval", "not needed: the parent run 'fr' was rejected at 'legal'")]
    assert _waiting(p) == []
    # closing is idempotent: nothing is left to close, nothing is recorded again
    seqs = {i: p.seqs(f"fr.remediate.1.{i}") for i in range(3)}
    assert asyncio.run(_close(p, "fr")) == []
    assert {i: p.seqs(f"fr.remediate.1.{i}") for i in range(3)} == seqs


async def _close(p: CliProject, parent: str) -> list[str]:
    from interlock._ops._orphans import close_children

    store = interlock.open_store(p.store)
    try:
        return await close_children(store, parent)
    finally:
        await store.close()


def test_a_cancelled_parent_cancels_its_waiting_children(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    p.workflow(GRANDCHILD, "grandchild.yaml")
    p.workflow(MIDDLE, "middle.yaml")
    assert p.cli("run", p.workflow(TOP, "top.yaml"), "--run-id", "cx").exit_code == 3
    assert p.cli("cancel", "cx", "--by", "ops").exit_code == 0
    for run in ("cx", "cx.remediate.1", "cx.remediate.1.fix.1"):
        assert _status(p, run) == "CANCELLED"
        assert p.cli("verify", run).exit_code == 0
    assert _waiting(p) == []


# the parent's executor dies (SIGKILL) right after it committed the rejection, before
# it closed any child
KILLED = """
import os, signal, sys
import interlock._ops._execute as ex

async def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

ex.close_children = die
from interlock.cli import main
main()
"""


def _killed_reject(tmp_path: Path, p: CliProject, run_id: str) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"}
    done = subprocess.run([sys.executable, str(script), "resume", run_id, "--reject",
                           "--gate", "legal", "--store", p.store], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert _status(p, run_id) == "REJECTED"
    assert _status(p, f"{run_id}.remediate.1") == "WAITING_APPROVAL"  # not closed yet


def test_a_crash_between_the_parent_and_the_child_is_closed_by_the_next_look(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    p = make_project(NODES)
    p.workflow(CHILD, "child.yaml")
    wf = p.workflow(PARENT, "parent.yaml")
    for run_id in ("k1", "k2"):
        assert p.cli("run", wf, "--run-id", run_id).exit_code == 3
        _killed_reject(tmp_path, p, run_id)
    # the CLI's look: runs --waiting
    assert _waiting(p) == []
    assert _status(p, "k1.remediate.1") == "REJECTED"
    assert _status(p, "k2.remediate.1") == "REJECTED"
    assert [n for n, _ in _closed(p, "k1.remediate.1")] == ["a", "b"]

    # the server's look: the inbox (a third run, killed the same way)
    assert p.cli("run", wf, "--run-id", "k3").exit_code == 3
    inbox = Approvals()

    async def listed() -> list[dict[str, Any]]:
        store = interlock.open_store(p.store)
        try:
            return await inbox.list(store)
        finally:
            await store.close()

    # (the child's gates are the parent's rows while the parent waits through it)
    assert {a["run_id"] for a in asyncio.run(listed())} == {"k3"}
    assert _status(p, "k3.remediate.1") == "WAITING_APPROVAL"
    _killed_reject(tmp_path, p, "k3")
    assert asyncio.run(listed()) == []
    assert _status(p, "k3.remediate.1") == "REJECTED"
    for run in ("k1.remediate.1", "k3.remediate.1"):
        assert p.cli("verify", run).exit_code == 0
    json.dumps(p.records("k3.remediate.1"))


TRIAGE = """
workflow: triage
input: [service]
nodes:
  approval: {approval: {show: [service]}}
edges:
  - {from: START, to: approval}
"""

TOOLCHAT = toolchat("triage approved")


def test_a_cancelled_conversation_cancels_the_child_of_its_workflow_tool(
        make_project: Callable[..., CliProject]) -> None:
    """An agent's workflow tool waits at its child's gate (``assistant/run_triage/
    approval``); the conversation cancelled, the child is cancelled too (it stayed
    waiting: only ``workflow:`` nodes' children were cancelled with their parent)."""
    p = make_project(NODES)
    p.workflow(TRIAGE, "triage.yaml")
    assert p.cli("run", p.workflow(TOOLCHAT, "toolchat.yaml"), "--run-id", "tc").exit_code \
        in (0, 3)
    sent = p.cli("send", "tc", "sweep the db")
    assert sent.exit_code == 3, sent.output
    # the child's gate is listed once, as the conversation's row
    assert _waiting(p) == [("tc", "assistant/run_triage/approval")]
    _, rows = p.cli_json("runs", "--status", "WAITING_APPROVAL")
    [child] = [r["run_id"] for r in rows if r["run_id"] != "tc"]
    assert p.cli("cancel", "tc", "--by", "ops").exit_code == 0
    assert _status(p, child) == "CANCELLED"
    assert _closed(p, child) == [("approval", "not needed: the parent run 'tc' was cancelled")]
    assert _waiting(p) == [] and p.cli("verify", child).exit_code == 0


def test_a_rejected_parent_closes_its_children_on_postgresql(
        make_project: Callable[..., CliProject], pg_schema_url: str) -> None:  # noqa: F811
    from click.testing import CliRunner

    from interlock.cli import cli

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--store", pg_schema_url],
                                  catch_exceptions=False)

    p = make_project(NODES)
    p.workflow(GRANDCHILD, "grandchild.yaml")
    p.workflow(MIDDLE, "middle.yaml")
    assert run("run", p.workflow(TOP, "top.yaml"), "--run-id", "pg").exit_code == 3
    assert run("resume", "pg", "--reject", "--gate", "legal").exit_code == 4
    for child in ("pg.remediate.1", "pg.remediate.1.fix.1"):
        assert json.loads(run("status", child, "--json").stdout)["status"] == "REJECTED"
        assert run("verify", child).exit_code == 0
    assert json.loads(run("runs", "--waiting", "--json").stdout) == []
