"""What a person reads when a decision names a gate that does not wait: a wrong name gets
the waiting gates and a "did you mean"; a gate decided already says who decided it, how,
when (UTC) and where -- through the CLI, the API (problem+json detail) and `--server`.
A gate that lists ``approvers:`` refuses a decision without ``--by``, naming them.

Real CLI commands on a SQLite store; a real server on loopback for the API.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from _harness import serve, started_waiting
from click.testing import CliRunner
from conftest import CliProject
from test_parallel_gates import NODES, PARALLEL

from interlock.cli import cli


def _decided(p: CliProject, run_id: str) -> list[dict[str, Any]]:
    return [r for r in p.records(run_id) if r["type"] == "approval.decided"]


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_a_wrong_gate_name_lists_the_waiting_gates_and_the_nearest(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "msg-1").exit_code == 3
    typo = p.cli("resume", "msg-1", "--approve", "--gate", "legl", "--by", "alice")
    assert typo.exit_code == 2, typo.output
    assert "workflow 'audit' has no node 'legl'" in typo.output
    assert "Did you mean 'legal'?" in typo.output
    assert "Waiting: finance, legal" in typo.output
    assert "decided already" not in typo.output
    # a node that is not a gate says so (and suggests no name it would take for one)
    start = p.cli("resume", "msg-1", "--approve", "--gate", "start", "--by", "alice")
    assert start.exit_code == 2, start.output
    assert "'start' is not a gate" in start.output and "Did you mean" not in start.output
    assert "Waiting: finance, legal" in start.output
    assert _decided(p, "msg-1") == []  # nothing recorded


def test_a_gate_decided_already_says_who_how_when_and_where(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "msg-2").exit_code == 3
    assert p.cli("resume", "msg-2", "--approve", "--gate", "finance",
                 "--by", "bob").exit_code == 3
    [first] = _decided(p, "msg-2")
    said = f"decided already: approved by bob at {_utc(first['at'])} via cli"
    again = p.cli("resume", "msg-2", "--reject", "--gate", "finance", "--by", "bob")
    assert again.exit_code == 2, again.output
    assert said in again.output and "still waiting: legal" in again.output
    assert "Did you mean" not in again.output
    # after the run ended: the same words, and that nothing else waits
    assert p.cli("resume", "msg-2", "--approve", "--gate", "legal",
                 "--by", "alice").exit_code == 0
    late = p.cli("resume", "msg-2", "--approve", "--gate", "finance", "--by", "bob")
    assert late.exit_code == 2, late.output
    assert said in late.output and "the run is COMPLETED" in late.output
    assert len(_decided(p, "msg-2")) == 2


def test_a_gate_decided_for_a_worker_says_so_too(
        make_project: Callable[..., CliProject]) -> None:
    """A decision recorded with --detach leaves the run PENDING for a worker: the same
    decision again is refused as decided already, not as 'not waiting'."""
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "msg-6").exit_code == 3
    for gate, by in (("finance", "bob"), ("legal", "alice")):
        assert p.cli("resume", "msg-6", "--approve", "--gate", gate, "--by", by,
                     "--detach").exit_code == 0
    again = p.cli("resume", "msg-6", "--approve", "--gate", "legal", "--by", "alice")
    assert again.exit_code == 2, again.output
    assert "gate 'legal' of run 'msg-6' was decided already: approved by alice at " \
        in again.output
    assert "the run is PENDING" in again.output


def test_a_gate_closed_by_a_rejection_says_so(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "msg-3").exit_code == 3
    assert p.cli("resume", "msg-3", "--reject", "--gate", "finance",
                 "--by", "bob").exit_code == 4
    late = p.cli("resume", "msg-3", "--approve", "--gate", "legal", "--by", "alice")
    assert late.exit_code == 2, late.output
    # (the rejection that closed it, by whom and when: `_ops._gate_closed`)
    assert re.search(r"gate 'legal' of run 'msg-3' was closed when 'finance' was rejected "
                     r"by bob at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", late.output), \
        late.output
    assert "the run ended REJECTED" in late.output


def test_a_gate_with_approvers_refuses_an_anonymous_decision(
        make_project: Callable[..., CliProject]) -> None:
    """``--by`` stays optional, but not where the gate names who may decide."""
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "msg-4").exit_code == 3
    anonymous = p.cli("resume", "msg-4", "--approve", "--gate", "legal")
    assert anonymous.exit_code == 2, anonymous.output
    assert "no --by" in anonymous.output and "approvers are: alice" in anonymous.output
    assert _decided(p, "msg-4") == []


def test_a_child_runs_gate_is_refused_by_its_path_from_the_parent(
        make_project: Callable[..., CliProject]) -> None:
    from test_child_gates import CHILD, PARENT
    from test_child_gates import NODES as KID_NODES

    p = make_project(KID_NODES)
    p.workflow(CHILD, "child.yaml")
    assert p.cli("run", p.workflow(PARENT, "parent.yaml"), "--run-id", "kid-1").exit_code == 3
    assert p.cli("resume", "kid-1", "--approve", "--gate", "remediate/b",
                 "--by", "bea").exit_code == 3
    again = p.cli("resume", "kid-1", "--approve", "--gate", "remediate/b", "--by", "bea")
    assert again.exit_code == 2, again.output
    assert re.search(r"gate 'remediate/b' of child run '[^']+' was decided already: approved "
                     r"by bea at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC via cli", again.output), \
        again.output
    assert "still waiting: remediate/a" in again.output
    typo = p.cli("resume", "kid-1", "--approve", "--gate", "remediate/bb", "--by", "bea")
    assert typo.exit_code == 2, typo.output
    assert "workflow 'child' has no node 'bb'" in typo.output
    assert "Did you mean 'remediate/a'?" in typo.output
    # the child done (its last gate decided): the child's record still answers
    assert p.cli("resume", "kid-1", "--approve", "--gate", "remediate/a",
                 "--by", "al").exit_code == 3
    late = p.cli("resume", "kid-1", "--approve", "--gate", "remediate/b", "--by", "bea")
    assert late.exit_code == 2, late.output
    assert "gate 'remediate/b' of child run" in late.output
    assert "decided already: approved by bea at " in late.output


def test_a_mapped_sub_workflow_node_is_no_gate_name(
        make_project: Callable[..., CliProject]) -> None:
    """``--gate NODE`` of a mapped sub-workflow names no gate (each item's child has its
    own, ``NODE[i]/GATE``): refused, nothing recorded -- it recorded an approval the
    child never saw, and the child asked again."""
    from test_mapped_gates import FLEET, GATED_CHILD
    from test_mapped_gates import NODES as MAP_NODES

    p = make_project(MAP_NODES)
    p.workflow(GATED_CHILD, "gated.yaml")
    assert p.cli("run", p.workflow(FLEET, "fleet.yaml"), "--run-id", "kid-2").exit_code == 3
    whole = p.cli("resume", "kid-2", "--approve", "--gate", "remediate", "--by", "dan")
    assert whole.exit_code == 2, whole.output
    assert "'remediate' is a sub-workflow node" in whole.output
    assert "Waiting: remediate[0]/approval, remediate[1]/approval, remediate[2]/approval" \
        in whole.output
    assert _decided(p, "kid-2") == []


def test_the_api_and_server_path_give_the_same_refusals(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    served = serve(p, audit=PARALLEL)
    try:
        with served.client() as http:
            started_waiting(http, "audit", "msg-5")
            http.post("/api/runs/msg-5/decisions", json={
                "decision": "approve", "node": "finance", "by": "bob"}).raise_for_status()
            [first] = _decided(p, "msg-5")
            again = http.post("/api/runs/msg-5/decisions", json={
                "decision": "reject", "node": "finance", "by": "bob"})
            assert again.status_code == 409, again.text
            assert again.headers["content-type"].startswith("application/problem+json")
            said = f"decided already: approved by bob at {_utc(first['at'])} via api"
            assert said in again.json()["detail"]
            typo = http.post("/api/runs/msg-5/decisions", json={
                "decision": "approve", "node": "lgal", "by": "alice"})
            assert typo.status_code == 422, typo.text  # the request's mistake
            assert "Did you mean 'legal'?" in typo.json()["detail"]
        remote = CliRunner().invoke(cli, ["resume", "msg-5", "--reject", "--gate", "finance",
                                          "--by", "bob", "--server", served.url])
        assert remote.exit_code == 2, remote.output
        assert said in remote.output
    finally:
        served.stop()
    assert len(_decided(p, "msg-5")) == 1


# -- the node table of run/resume: a decided gate's row says how it was decided ----------


def _row(output: str, node: str) -> str:
    """The status column of ``node``'s row in the node table ``output`` holds."""
    for line in output.splitlines():
        cells = line.split()
        if cells and cells[0] == node and len(cells) >= 5 and cells[1].isdigit():
            return " ".join(cells[4 if cells[2] == "-" else 5:])
    raise AssertionError(f"no row for {node!r} in:\n{output}")


def test_the_node_table_shows_a_gate_approved_or_rejected(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "tab-1").exit_code == 3
    approved = p.cli("resume", "tab-1", "--approve", "--gate", "finance", "--by", "bob")
    assert approved.exit_code == 3, approved.output
    assert _row(approved.stdout, "finance") == "approved"
    assert _row(approved.stdout, "legal") == "waiting"
    rejected = p.cli("resume", "tab-1", "--reject", "--gate", "legal", "--by", "alice")
    assert rejected.exit_code == 4, rejected.output
    assert _row(rejected.stdout, "legal") == "rejected"
    assert _row(rejected.stdout, "finance") == "approved"  # (replayed from the log)
    assert _row(rejected.stdout, "start") == "completed"


def test_the_node_table_counts_a_mapped_gates_decisions(
        make_project: Callable[..., CliProject]) -> None:
    from test_parallel_gates import MAPPED, MAPPED_NODES

    p = make_project(MAPPED_NODES)
    assert p.cli("run", p.workflow(MAPPED), "--run-id", "tab-2").exit_code == 3
    for i in (3, 0, 4, 1, 2):
        last = p.cli("resume", "tab-2", "--reject" if i in (1, 4) else "--approve",
                     "--gate", f"deploy[{i}]", "--by", "carol")
        if i == 3:  # the other items still wait: so does the row
            assert _row(last.stdout, "deploy") == "waiting"
            assert "deploy[3]  approved   by carol" in last.stderr
    assert last.exit_code == 0, last.output
    assert _row(last.stdout, "deploy") == "3 approved, 2 rejected"
    assert _row(last.stdout, "report") == "completed"
