"""A decision goes only to the gate the person meant: a mapped gate's bare name with
several items waiting is refused (the CLI, Python and the API each told how to name one
on their own surface: ``--gate 'deploy[0]'``, ``node='deploy[0]'``, the field ``node``);
with one item waiting it decides that item, and says which. A decision without ``--gate``
says which gate it decided (the oldest waiting). The API's refusals name its field, not a
CLI flag; a resume of a finished run is a state conflict (409); a body that is not JSON
says where it stops parsing.

Real CLI commands on a SQLite store; a real server on loopback for the API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import problem as _problem
from _harness import serve, started_waiting, wait_for
from click.testing import CliRunner
from conftest import CliProject
from test_parallel_gates import MAPPED, MAPPED_NODES, NODES, PARALLEL

from interlock.cli import cli

ITEMS = "deploy[0], deploy[1], deploy[2], deploy[3], deploy[4]"


def _decided(p: CliProject, run_id: str) -> list[dict[str, Any]]:
    return [r for r in p.records(run_id) if r["type"] == "approval.decided"]


def test_a_mapped_gates_bare_name_is_refused_while_several_items_wait(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(MAPPED_NODES)
    assert p.cli("run", p.workflow(MAPPED), "--run-id", "gn-1").exit_code == 3
    bare = p.cli("resume", "gn-1", "--gate", "deploy", "--approve", "--by", "ann")
    assert bare.exit_code == 2, bare.output
    assert (f"'deploy' is a mapped gate with 5 items waiting ({ITEMS}): name one, e.g. "
            "--gate 'deploy[0]'") in bare.output
    assert _decided(p, "gn-1") == []  # nothing recorded (it approved deploy[0] before)
    for i in (3, 0, 4, 1):
        assert p.cli("resume", "gn-1", "--gate", f"deploy[{i}]", "--approve",
                     "--by", "ann").exit_code == 3
    # one item left: the bare name decides it, and the output says which
    last = p.cli("resume", "gn-1", "--gate", "deploy", "--reject", "--by", "ann")
    assert last.exit_code == 0, last.output
    assert "rejected 'deploy[2]' (the one item of 'deploy' waiting)" in last.stderr
    assert [(r["item"], r["decision"]) for r in _decided(p, "gn-1")][-1] == (2, "rejected")
    # none waiting: what the name is, not "a gate that has asked for no decision"
    late = p.cli("resume", "gn-1", "--gate", "deploy", "--approve", "--by", "ann")
    assert late.exit_code == 2, late.output
    assert "'deploy' is a mapped gate, each of its items a gate of its own " \
        "(deploy[0]..deploy[4]), and none waits" in late.output


def test_python_is_told_how_python_names_an_item(
        make_project: Callable[..., CliProject]) -> None:
    from interlock import approve
    from interlock.support import GateNotWaiting, decide_gate

    p = make_project(MAPPED_NODES)
    assert p.cli("run", p.workflow(MAPPED), "--run-id", "gn-2").exit_code == 3
    with pytest.raises(GateNotWaiting) as refused:
        asyncio.run(decide_gate("gn-2", "deploy", approve("ann"), store=p.store))
    assert f"({ITEMS}): name one, e.g. node='deploy[0]'" in str(refused.value)
    assert _decided(p, "gn-2") == []


def test_a_decision_without_gate_says_which_gate_it_decided(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    result, out = p.cli_json("run", p.workflow(PARALLEL), "--run-id", "gn-3")
    assert result.exit_code == 3
    oldest, other = (g["node"] for g in out["waiting"]["pending"])
    who = {"legal": "alice", "finance": "bob"}  # (their approvers:)
    first = p.cli("resume", "gn-3", "--approve", "--by", who[oldest])
    assert first.exit_code == 3, first.output
    said = (f"approved '{oldest}', the oldest of 2 waiting gates (no --gate); still "
            f"waiting: '{other}': name it with --gate {other}")
    lines = first.stderr.splitlines()
    # said at the top, as it is recorded: before what the run then does
    assert lines[1:3] == [f"  {oldest:<8} approved   by {who[oldest]}", said], lines
    named = p.cli("resume", "gn-3", "--approve", "--gate", other, "--by", who[other])
    assert named.exit_code == 0, named.output
    assert "no --gate" not in named.stderr  # it named its gate
    assert [r["node"] for r in _decided(p, "gn-3")] == [oldest, other]


def test_a_decision_recorded_for_a_worker_says_which_gate_too(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(MAPPED_NODES)
    assert p.cli("run", p.workflow(MAPPED), "--run-id", "gn-6").exit_code == 3
    detached = p.cli("resume", "gn-6", "--approve", "--by", "ann", "--detach")
    assert detached.exit_code == 0, detached.output
    assert ("approved 'deploy[0]', the oldest of 5 waiting items of 'deploy' (no --gate); "
            "still waiting: 'deploy[1]', 'deploy[2]', 'deploy[3]', 'deploy[4]': name one "
            "with --gate 'deploy[1]'") in detached.stderr
    named = p.cli("resume", "gn-6", "--approve", "--gate", "deploy[3]", "--detach")
    assert named.exit_code == 0 and "oldest" not in named.stderr, named.output
    assert [r["item"] for r in _decided(p, "gn-6")] == [0, 3]


def test_the_api_names_its_field_and_the_cli_through_a_server_its_flag(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(MAPPED_NODES)
    served = serve(p, deploys=MAPPED, audit=PARALLEL)
    try:
        with served.client() as http:
            started_waiting(http, "deploys", "gn-4")
            detail = _problem(http.post("/api/runs/gn-4/decisions", json={
                "decision": "approve", "node": "deploy", "by": "bob"}), 409)
            assert (f"'deploy' is a mapped gate with 5 items waiting ({ITEMS}): name one "
                    '(the field node), e.g. "node": "deploy[0]" in the request body') \
                in detail
            assert "--gate" not in detail
            typo = _problem(http.post("/api/runs/gn-4/decisions", json={
                "decision": "approve", "node": "deplyo", "by": "bob"}), 422)
            assert "Did you mean 'deploy" in typo
            assert '(decide one with "node": "NAME" in the request body)' in typo
            assert "--gate" not in typo
            # the CLI through the server: told its own flag
            remote = CliRunner().invoke(cli, ["resume", "gn-4", "--approve", "--gate",
                                              "deploy", "--by", "bob", "--server", served.url])
            assert remote.exit_code == 2, remote.output
            assert "name one, e.g. --gate 'deploy[0]'" in remote.output
            # a decision without a gate through the server says which it decided
            oldest = CliRunner().invoke(cli, ["resume", "gn-4", "--approve", "--by", "bob",
                                              "--server", served.url])
            assert oldest.exit_code == 3, oldest.output
            said = ("approved 'deploy[0]', the oldest of 5 waiting items of 'deploy' (no "
                    "--gate); still waiting: 'deploy[1]', 'deploy[2]', 'deploy[3]', "
                    "'deploy[4]': name one with --gate 'deploy[1]'")
            assert oldest.stderr.splitlines()[0] == said, oldest.stderr  # before the trace

            # a resume of a finished run: 409, as a decision on it is
            started_waiting(http, "audit", "gn-5")
            for gate, by in (("finance", "bob"), ("legal", "alice")):
                http.post("/api/runs/gn-5/decisions", json={
                    "decision": "approve", "node": gate, "by": by}).raise_for_status()
            wait_for(lambda: http.get("/api/runs/gn-5").json()["status"] == "COMPLETED",
                     "run gn-5 to complete")
            ended = _problem(http.post("/api/runs/gn-5/resume", json={}), 409)
            assert "run 'gn-5' is COMPLETED" in ended
            _problem(http.post("/api/runs/gn-5/decisions", json={"decision": "approve"}), 409)

            # a body that is not JSON: what and where, in words
            bad = _problem(http.post("/api/runs/gn-4/decisions", content=b'{"decision":\n bad',
                                     headers={"Content-Type": "application/json"}), 422)
            assert bad.startswith("the request body is not valid JSON: Expecting value at "
                                  "line 2 column 2"), bad
            assert "body.1" not in bad
    finally:
        served.stop()
    assert [(r["node"], r.get("item"), r.get("via")) for r in _decided(p, "gn-4")] == [
        ("deploy", 0, "cli")]


def test_the_same_decision_run_twice_on_the_incident_example_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: "run twice, the same command is refused as a second decision instead of
    deciding the next gate" -- the guarded fix (code_fix) is not approved unseen."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    store = ["--store", f"sqlite:///{tmp_path / 'runs.db'}"]

    def interlock(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, *store], catch_exceptions=False)

    assert interlock("run", str(root / "examples/incident/workflow.yaml"), "--input-file",
                     str(root / "examples/incident/events/checkout-500.json"),
                     "--run-id", "twice").exit_code == 3
    decide = ("resume", "twice", "--gate", "approval", "--approve", "--by", "you")
    assert interlock(*decide).exit_code == 3  # now code_fix asks to confirm
    again = interlock(*decide)
    assert again.exit_code == 2, again.output
    assert "gate 'approval' of run 'twice' was decided already: approved by you" \
        in again.output
    assert "still waiting: code_fix" in again.output
    status = interlock("status", "twice", "--json")
    assert [g["node"] for g in json.loads(status.stdout)["waiting"]["pending"]] == ["code_fix"]
    assert not (tmp_path / ".interlock" / "fixes").exists()  # the fix did not run
