"""Items of a map that wait for people (docs/semantics.md: several gates at once; map): a
map over a ``confirm: true`` node or over a sub-workflow whose child waits. Each item
waits on its own (gate ``NODE[i]``, or ``NODE[i]/child_gate`` for a child run's), is
decided on its own in any order -- from other processes, through the CLI and a server --
its item going on at once while the others wait; ``collect`` holds each item's outcome.
A rejected confirm item is collected as such and its body never runs; a crash while a
decided item runs leaves an ``unknown_outcome`` gate for that item (nothing runs twice
unasked), and a resume continues exactly the undecided items.

Real processes and real stores (SQLite; PostgreSQL too when INTERLOCK_TEST_POSTGRES
is set).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import serve, started_waiting, wait_for
from conftest import CliProject
from test_decision_race import store_urls

NODES = """
import os
import pathlib
import time


def _mark(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def plan(state):
    return {"targets": ["t0", "t1", "t2"], "env": "prod"}


def deploy(state):
    t = state["target"]
    _mark("deploy:" + t)
    pathlib.Path(f"started-{t}.marker").write_text("started")
    # a target named in HOLD waits for go-<target>.marker (a long action in flight)
    if t in os.environ.get("HOLD", "").split(","):
        deadline = time.monotonic() + 120
        while not os.path.exists(f"go-{t}.marker") and time.monotonic() < deadline:
            time.sleep(0.02)
    return {"deployed": t}


def report(state):
    _mark("report")
    return {"report": [d.get("deployed") or d.get("decision") or d["remediate"]["fixed"]
                       for d in state["deployed"]]}


def cleanup(state):
    _mark("cleanup")
    return {"cleaned": state["error"]["type"]}


def fix(state):
    return {"fixed": state["incident"]["id"]}


def check(state):
    _mark("check:" + state["fixed"])
    return {"ok": True}


def triage(state):
    _mark("triage")
    return {"triaged": state["error"]["message"]}
"""

ROLLOUT = """
workflow: rollout
nodes:
  plan: {mod}:plan
  deploy: {call: {mod}:deploy, confirm: true, reads: [env]}
  report: {mod}:report
edges:
  - {from: START, to: plan}
  - {from: plan, map: 'targets', to: deploy, as: target, collect: deployed}
  - {from: deploy, to: report}
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")]), **extra}


def _interlock(tmp_path: Path, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=tmp_path,
                          env=env or _env(tmp_path), capture_output=True, text=True,
                          timeout=120)


def _spawn(tmp_path: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "interlock", *args], cwd=tmp_path,
                            env=env or _env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def _pending(out: Any) -> list[tuple[str, str]]:
    return [(g["node"], g["kind"]) for g in (out["waiting"] or {}).get("pending", [])]


def _records(tmp_path: Path, store: str, run_id: str, rtype: str) -> list[dict[str, Any]]:
    trace = _interlock(tmp_path, "trace", run_id, "--store", store, "--json")
    assert trace.returncode == 0, trace.stderr
    return [r for r in json.loads(trace.stdout) if r["type"] == rtype]


def _count(tmp_path: Path, name: str) -> int:
    log = tmp_path / "executions.log"
    return log.read_text().split().count(name) if log.exists() else 0


def test_three_confirm_items_decided_out_of_order_from_other_processes(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """Each ``deploy[i]`` asks on its own; each decision comes from a process of its own,
    in the order 2, 0, 1: an approved item's body runs at once (the others keep
    waiting), a rejected one never runs and is collected as its rejection; the map's
    edges are decided once, after the last item."""
    p = make_project(NODES)
    wf = p.workflow(ROLLOUT)
    for n, store in enumerate(store_urls(tmp_path)):
        run_id = f"roll-{n}-{os.getpid()}"
        started = _interlock(tmp_path, "run", wf, "--run-id", run_id, "--store", store,
                             "--json")
        assert started.returncode == 3, started.stderr
        out = _json(started)
        assert out["status"] == "WAITING_APPROVAL"
        assert _pending(out) == [(f"deploy[{i}]", "confirm") for i in range(3)]
        assert [(g["item"], g["show"]["target"], g["show"]["env"])
                for g in out["waiting"]["pending"]] == [(i, f"t{i}", "prod") for i in range(3)]
        # asked first: nothing ran (of this run; the store before ran t1 and t2 once)
        assert [_count(tmp_path, f"deploy:t{i}") for i in range(3)] == [0, n, n]

        two = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[2]",
                         "--by", "carol", "--store", store, "--json")
        assert two.returncode == 3, two.stderr
        assert _pending(_json(two)) == [("deploy[0]", "confirm"), ("deploy[1]", "confirm")]
        assert _count(tmp_path, "deploy:t2") == n + 1  # it ran at once, once
        assert _count(tmp_path, "report") == n  # one node to the graph: not yet

        zero = _interlock(tmp_path, "resume", run_id, "--reject", "--gate", "deploy[0]",
                          "--by", "alice", "--comment", "frozen", "--store", store, "--json")
        assert zero.returncode == 3, zero.stderr  # an item's rejection is its outcome
        assert _pending(_json(zero)) == [("deploy[1]", "confirm")]
        twice = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[0]",
                           "--by", "alice", "--store", store)
        assert twice.returncode == 2, twice.stderr  # decided already
        assert "deploy[0]" in twice.stderr and "deploy[1]" in twice.stderr  # what waits

        one = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[1]",
                         "--by", "bob", "--store", store, "--json")
        assert one.returncode == 0, one.stderr
        done = _json(one)
        assert done["status"] == "COMPLETED"
        deployed = done["state"]["deployed"]  # in item order
        assert deployed[0]["decision"] == "rejected" and deployed[0]["by"] == "alice"
        assert deployed[0]["comment"] == "frozen" and deployed[0]["item"] == 0
        assert deployed[1:] == [{"deployed": "t1"}, {"deployed": "t2"}]
        assert done["state"]["report"] == ["rejected", "t1", "t2"]
        assert _count(tmp_path, "deploy:t0") == 0  # rejected: never ran
        assert _count(tmp_path, "deploy:t1") == n + 1 and _count(tmp_path, "report") == n + 1
        decided = _records(tmp_path, store, run_id, "approval.decided")
        assert [(r["item"], r["decision"], r["by"]) for r in decided] == [
            (2, "approved", "carol"), (0, "rejected", "alice"), (1, "approved", "bob")]
        assert _interlock(tmp_path, "verify", run_id, "--store", store).returncode == 0


@pytest.mark.parametrize("through", ["store", "server"])
def test_an_item_decided_while_another_runs_goes_on_at_once(
        make_project: Callable[..., CliProject], tmp_path: Path, through: str) -> None:
    """deploy[0] is approved and its body runs (held) in one process; deploy[2] is
    decided from another process (the CLI on the store, or the API of a server that
    executes nothing): the decider exits 0, the executing process folds the decision in
    and runs t2 while t0 is still running; deploy[1] keeps waiting."""
    p = make_project(NODES)
    wf = p.workflow(ROLLOUT)
    store = p.store
    assert _interlock(tmp_path, "run", wf, "--run-id", "busy-1", "--store",
                      store).returncode == 3
    executor = _spawn(tmp_path, "resume", "busy-1", "--approve", "--gate", "deploy[0]",
                      "--by", "al", "--store", store, "--json", env=_env(tmp_path, HOLD="t0"))
    served = None
    try:
        wait_for(lambda: (tmp_path / "started-t0.marker").exists(), "t0 to start")
        if through == "server":
            from test_server import Served

            (tmp_path / "flows").mkdir()
            (tmp_path / "flows" / "rollout.yaml").write_text((tmp_path / wf).read_text())
            served = Served(tmp_path, "--workers", "0", store=store)
            where = ["--server", served.url]
        else:
            where = ["--store", store]
        decider = _spawn(tmp_path, "resume", "busy-1", "--approve", "--gate", "deploy[2]",
                         "--by", "bo", *where)
        # the executing process runs t2 while t0 is still held
        wait_for(lambda: _count(tmp_path, "deploy:t2") == 1, "t2 to run")
        assert executor.poll() is None and _count(tmp_path, "deploy:t0") == 1
        if through == "store":  # it said so and exited 0 without waiting for t0
            _, said = decider.communicate(timeout=60)
            assert decider.returncode == 0, said
            assert "recorded" in said and "being executed by" in said, said
        (tmp_path / "go-t0.marker").write_text("go")
        _, said = decider.communicate(timeout=120)
        # (--server: followed to the run's next stop, deploy[1] waiting)
        assert decider.returncode == (0 if through == "store" else 3), said
        out, err = executor.communicate(timeout=120)
    finally:
        if served is not None:
            served.stop()
        if executor.poll() is None:
            executor.kill()
            executor.communicate()
    assert executor.returncode == 3, err  # deploy[1] still waits
    waiting = json.loads(out)
    assert _pending(waiting) == [("deploy[1]", "confirm")]
    last = _interlock(tmp_path, "resume", "busy-1", "--approve", "--gate", "deploy[1]",
                      "--by", "cy", "--store", store, "--json")
    assert last.returncode == 0, last.stderr
    assert _json(last)["state"]["report"] == ["t0", "t1", "t2"]
    assert [_count(tmp_path, f"deploy:t{i}") for i in range(3)] == [1, 1, 1]
    decided = _records(tmp_path, store, "busy-1", "approval.decided")
    assert [(r["item"], r["by"]) for r in decided] == [(0, "al"), (2, "bo"), (1, "cy")]
    assert _interlock(tmp_path, "verify", "busy-1", "--store", store).returncode == 0


ROLLOUT_CAUGHT = (ROLLOUT + "  - {from: deploy, to: cleanup, on_error: [UnknownOutcome]}\n"
                  ).replace("  report: {mod}:report\n",
                            "  report: {mod}:report\n  cleanup: {mod}:cleanup\n")


def _kill_while_t0_runs(tmp_path: Path, store: str, run_id: str) -> None:
    """Approve deploy[0] in a process that is SIGKILLed while t0's body runs (deploy[1]
    and deploy[2] waiting meanwhile)."""
    (tmp_path / "started-t0.marker").unlink(missing_ok=True)
    executor = _spawn(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[0]",
                      "--by", "al", "--store", store, env=_env(tmp_path, HOLD="t0"))
    try:
        wait_for(lambda: (tmp_path / "started-t0.marker").exists(), "t0 to start")
    finally:
        os.kill(executor.pid, signal.SIGKILL)
        executor.communicate()


def test_a_crash_while_a_decided_item_runs_leaves_its_outcome_to_a_person(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """SIGKILL while t0 (approved) runs and the other items wait: the resume does not run
    t0 again -- deploy[0] waits at an unknown_outcome gate beside the two undecided
    items; approving it runs t0 again (as asked), and each other item runs once."""
    p = make_project(NODES)
    wf = p.workflow(ROLLOUT)
    for n, store in enumerate(store_urls(tmp_path)):
        run_id = f"crash-{n}-{os.getpid()}"
        base = 2 * n  # t0 runs twice per store
        assert _interlock(tmp_path, "run", wf, "--run-id", run_id, "--store",
                          store).returncode == 3
        _kill_while_t0_runs(tmp_path, store, run_id)
        assert _count(tmp_path, "deploy:t0") == base + 1

        resumed = _interlock(tmp_path, "resume", run_id, "--store", store, "--json")
        assert resumed.returncode == 3, resumed.stderr
        out = _json(resumed)
        assert sorted(_pending(out)) == [("deploy[0]", "unknown_outcome"),
                                         ("deploy[1]", "confirm"), ("deploy[2]", "confirm")]
        unknown = next(g for g in out["waiting"]["pending"] if g["node"] == "deploy[0]")
        assert unknown["show"]["action"] == "deploy[0]" and unknown["show"]["started_at"]
        assert unknown["show"]["arguments"]["target"] == "t0"
        assert _count(tmp_path, "deploy:t0") == base + 1  # not run again unasked
        again = _interlock(tmp_path, "resume", run_id, "--store", store)
        assert again.returncode == 2  # waiting for decisions now: nothing re-run
        assert _count(tmp_path, "deploy:t0") == base + 1

        two = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[2]",
                         "--by", "bo", "--store", store, "--json")
        assert two.returncode == 3, two.stderr
        assert _count(tmp_path, "deploy:t2") == n + 1
        assert _count(tmp_path, "deploy:t0") == base + 1
        zero = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[0]",
                          "--by", "al", "--store", store, "--json")
        assert zero.returncode == 3, zero.stderr  # t0 ran again, as approved
        assert _count(tmp_path, "deploy:t0") == base + 2
        assert _pending(_json(zero)) == [("deploy[1]", "confirm")]
        one = _interlock(tmp_path, "resume", run_id, "--approve", "--gate", "deploy[1]",
                         "--by", "cy", "--store", store, "--json")
        assert one.returncode == 0, one.stderr
        assert _json(one)["state"]["report"] == ["t0", "t1", "t2"]
        assert [_count(tmp_path, f"deploy:t{i}") for i in (1, 2)] == [n + 1, n + 1]
        assert _interlock(tmp_path, "verify", run_id, "--store", store).returncode == 0


def test_an_unknown_outcome_rejected_fails_the_item_and_the_maps_error_edge_catches_it(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """After the crash, deploy[0]'s unknown outcome is rejected (recorded as not done): the
    item fails with UnknownOutcome, the map's error edge takes the run on, the gates of
    the items still waiting are closed -- and t0 never ran a second time."""
    p = make_project(NODES)
    wf = p.workflow(ROLLOUT_CAUGHT)
    store = p.store
    assert _interlock(tmp_path, "run", wf, "--run-id", "rej-1", "--store",
                      store).returncode == 3
    _kill_while_t0_runs(tmp_path, store, "rej-1")
    assert _interlock(tmp_path, "resume", "rej-1", "--store", store).returncode == 3
    rejected = _interlock(tmp_path, "resume", "rej-1", "--reject", "--gate", "deploy[0]",
                          "--by", "al", "--store", store, "--json")
    assert rejected.returncode == 0, rejected.stderr
    out = _json(rejected)
    assert out["status"] == "COMPLETED" and out["state"]["cleaned"] == "UnknownOutcome"
    assert out["waiting"] is None
    assert _count(tmp_path, "deploy:t0") == 1 and _count(tmp_path, "cleanup") == 1
    assert _count(tmp_path, "deploy:t1") == 0 and _count(tmp_path, "report") == 0
    decided = _records(tmp_path, store, "rej-1", "approval.decided")
    assert [(r["item"], r["decision"]) for r in decided] == [
        (0, "approved"), (0, "rejected"), (1, "closed"), (2, "closed")]
    late = _interlock(tmp_path, "resume", "rej-1", "--approve", "--gate", "deploy[1]",
                      "--store", store)
    assert late.returncode == 2
    assert _interlock(tmp_path, "verify", "rej-1", "--store", store).returncode == 0


GATED_CHILD = """
workflow: gated
input: [incident]
nodes:
  fix: {mod}:fix
  approval: {approval: {show: [fixed]}}
  check: {mod}:check
edges:
  - {from: START, to: fix}
  - {from: fix, to: approval}
  - {from: approval, to: check}
"""

FLEET = """
workflow: fleet
nodes:
  plan: {mod}:plan
  remediate: {workflow: gated.yaml, input: {incident: "{'id': target}"}, output: [fixed, ok]}
  report: {mod}:report
  triage: {mod}:triage
edges:
  - {from: START, to: plan}
  - {from: plan, map: 'targets', to: remediate, as: target, collect: deployed}
  - {from: remediate, to: report}
  - {from: remediate, to: triage, on_error: [ChildRunError]}
"""


def test_a_map_over_a_sub_workflow_whose_children_wait(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """Each item's child run waits at its approval: the parent lists them as
    ``remediate[i]/approval`` (the child gate's kind), each is decided through the parent
    from a process of its own, in any order, its child going on at once; ``collect``
    holds each child's final state (its ``output``)."""
    p = make_project(NODES)
    p.workflow(GATED_CHILD, "gated.yaml")
    wf = p.workflow(FLEET, "fleet.yaml")
    for n, store in enumerate(store_urls(tmp_path)):
        run_id = f"fleet-{n}-{os.getpid()}"
        started = _interlock(tmp_path, "run", wf, "--run-id", run_id, "--store", store,
                             "--json")
        assert started.returncode == 3, started.stderr
        out = _json(started)
        # (oldest first: the children asked concurrently, in no set order)
        assert sorted(_pending(out)) == [(f"remediate[{i}]/approval", "approval")
                                         for i in range(3)]
        assert sorted(g["show"]["fixed"] for g in out["waiting"]["pending"]) == ["t0", "t1",
                                                                                 "t2"]
        for k, i in enumerate([2, 0, 1]):
            decided = _interlock(tmp_path, "resume", run_id, "--approve", "--gate",
                                 f"remediate[{i}]/approval", "--by", f"u{i}", "--store",
                                 store, "--json")
            assert decided.returncode == (0 if k == 2 else 3), decided.stderr
            assert _count(tmp_path, f"check:t{i}") == n + 1  # its child went on at once
            left = [j for j in (2, 0, 1)[k + 1:]]
            assert sorted(_pending(_json(decided))) == [
                (f"remediate[{j}]/approval", "approval") for j in sorted(left)]
        done = _json(decided)
        assert done["status"] == "COMPLETED"
        assert done["state"]["deployed"] == [
            {"remediate": {"fixed": f"t{i}", "ok": True}} for i in range(3)]
        assert done["state"]["report"] == ["t0", "t1", "t2"]
        assert _count(tmp_path, "report") == n + 1
        twice = _interlock(tmp_path, "resume", run_id, "--approve", "--gate",
                           "remediate[1]/approval", "--store", store)
        assert twice.returncode == 2
        verify = _interlock(tmp_path, "verify", run_id, "--store", store)
        assert verify.returncode == 0 and f"{run_id}.remediate.1.2" in verify.stdout


def test_a_rejected_child_fails_its_item_and_the_maps_error_edge_applies(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """A child whose gate is rejected ends REJECTED, as a child that never waited could:
    its item fails (ChildRunError) and the map's error edge takes the run on."""
    p = make_project(NODES)
    p.workflow(GATED_CHILD, "gated.yaml")
    wf = p.workflow(FLEET, "fleet.yaml")
    store = p.store
    assert _interlock(tmp_path, "run", wf, "--run-id", "frej", "--store",
                      store).returncode == 3
    for i in (1, 2):
        assert _interlock(tmp_path, "resume", "frej", "--approve", "--gate",
                          f"remediate[{i}]/approval", "--store", store).returncode == 3
    rejected = _interlock(tmp_path, "resume", "frej", "--reject", "--gate",
                          "remediate[0]/approval", "--by", "al", "--store", store, "--json")
    assert rejected.returncode == 0, rejected.stderr
    out = _json(rejected)
    assert out["status"] == "COMPLETED" and _count(tmp_path, "triage") == 1
    assert "item 0" in out["state"]["triaged"] and "frej.remediate.1.0" in out["state"]["triaged"]
    assert _count(tmp_path, "report") == 0
    child = _interlock(tmp_path, "status", "frej.remediate.1.0", "--store", store, "--json")
    assert _json(child)["status"] == "REJECTED"
    assert _interlock(tmp_path, "verify", "frej", "--store", store).returncode == 0


def test_a_crash_while_a_decided_child_item_runs_continues_exactly_the_undecided(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """SIGKILL while the child of remediate[0] runs after its decision (the other items'
    children waiting): the resume continues that child from its log (nothing it
    completed runs again) and the other items keep waiting for their decisions."""
    nodes = NODES.replace('def check(state):\n',
                          'def check(state):\n'
                          '    pathlib.Path(f"started-check-{state[\'fixed\']}.marker")'
                          '.write_text("x")\n'
                          '    if state["fixed"] in os.environ.get("HOLD", "").split(","):\n'
                          '        deadline = time.monotonic() + 120\n'
                          '        while not os.path.exists("go.marker") and '
                          'time.monotonic() < deadline:\n'
                          '            time.sleep(0.02)\n')
    p = make_project(nodes)
    p.workflow(GATED_CHILD, "gated.yaml")
    wf = p.workflow(FLEET, "fleet.yaml")
    store = p.store
    assert _interlock(tmp_path, "run", wf, "--run-id", "fcrash", "--store",
                      store).returncode == 3
    executor = _spawn(tmp_path, "resume", "fcrash", "--approve", "--gate",
                      "remediate[0]/approval", "--by", "al", "--store", store,
                      env=_env(tmp_path, HOLD="t0"))
    try:
        wait_for(lambda: (tmp_path / "started-check-t0.marker").exists(), "t0's check")
    finally:
        os.kill(executor.pid, signal.SIGKILL)
        executor.communicate()
    resumed = _interlock(tmp_path, "resume", "fcrash", "--store", store, "--json")
    assert resumed.returncode == 3, resumed.stderr
    assert sorted(_pending(_json(resumed))) == [("remediate[1]/approval", "approval"),
                                                ("remediate[2]/approval", "approval")]
    assert _count(tmp_path, "check:t0") == 1  # the child's check completed once, on resume
    for i in (2, 1):
        last = _interlock(tmp_path, "resume", "fcrash", "--approve", "--gate",
                          f"remediate[{i}]/approval", "--store", store, "--json")
    assert last.returncode == 0, last.stderr
    assert _json(last)["state"]["deployed"] == [
        {"remediate": {"fixed": f"t{i}", "ok": True}} for i in range(3)]
    assert [_count(tmp_path, f"check:t{i}") for i in range(3)] == [1, 1, 1]
    child = _records(tmp_path, store, "fcrash.remediate.1.0", "approval.decided")
    assert [r["by"] for r in child] == ["al"]  # decided once, in the child
    assert _interlock(tmp_path, "verify", "fcrash", "--store", store).returncode == 0


def test_the_server_lists_each_item_gate_and_decides_each_through_the_api(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """A real server: `/api/approvals` has a row per item gate -- a confirm item's
    ``deploy[i]`` and a child run's ``remediate[i]/approval`` -- and the API's ``node``
    decides each (``via`` recorded); an item gate decided twice is 409."""
    p = make_project(NODES)
    served = serve(p, rollout=ROLLOUT, gated=GATED_CHILD, fleet=FLEET)
    try:
        with served.client() as http:
            for wf, run_id in (("rollout", "api-roll"), ("fleet", "api-fleet")):
                started_waiting(http, wf, run_id)

            def rows(run_id: str) -> list[str]:
                return sorted(r["node"] for r in http.get("/api/approvals").json()
                              if r["run_id"] == run_id)

            assert rows("api-roll") == [f"deploy[{i}]" for i in range(3)]
            assert rows("api-fleet") == [f"remediate[{i}]/approval" for i in range(3)]
            for run_id, gate in (("api-roll", "deploy[1]"), ("api-fleet", "remediate[1]/approval")):
                decided = http.post(f"/api/runs/{run_id}/decisions", json={
                    "decision": "approve", "node": gate, "by": "bob", "via": "dashboard"})
                assert decided.status_code == 200, decided.text
                wait_for(lambda r=run_id, g=gate: g not in rows(r), f"{gate} decided")
                again = http.post(f"/api/runs/{run_id}/decisions", json={
                    "decision": "reject", "node": gate, "by": "bob"})
                assert again.status_code == 409, again.text
            wait_for(lambda: _count(tmp_path, "deploy:t1") == 1, "t1 to run")
            wait_for(lambda: _count(tmp_path, "check:t1") == 1, "t1's child to go on")
            assert rows("api-roll") == ["deploy[0]", "deploy[2]"]
            assert rows("api-fleet") == ["remediate[0]/approval", "remediate[2]/approval"]
            for run_id, gates in (("api-roll", ["deploy[0]", "deploy[2]"]),
                                  ("api-fleet", ["remediate[2]/approval",
                                                 "remediate[0]/approval"])):
                for gate in gates:
                    http.post(f"/api/runs/{run_id}/decisions", json={
                        "decision": "approve", "node": gate, "by": "al"}).raise_for_status()
                    wait_for(lambda r=run_id, g=gate: g not in rows(r), f"{gate} decided")
                wait_for(lambda r=run_id: http.get(f"/api/runs/{r}").json()["status"]
                         == "COMPLETED", f"{run_id} to complete")
    finally:
        served.stop()
    assert [_count(tmp_path, f"deploy:t{i}") for i in range(3)] == [1, 1, 1]
    assert [_count(tmp_path, f"check:t{i}") for i in range(3)] == [1, 1, 1]
    decided = _records(tmp_path, p.store, "api-roll", "approval.decided")
    assert [(r["item"], r["by"], r.get("via")) for r in decided] == [
        (1, "bob", "dashboard"), (0, "al", "api"), (2, "al", "api")]


HELD_CHECK = NODES.replace(
    'def check(state):\n',
    'def check(state):\n'
    '    pathlib.Path(f"started-check-{state[\'fixed\']}.marker").write_text("x")\n'
    '    if state["fixed"] in os.environ.get("HOLD", "").split(","):\n'
    '        deadline = time.monotonic() + 120\n'
    '        while not os.path.exists("go.marker") and time.monotonic() < deadline:\n'
    '            time.sleep(0.02)\n')


def test_a_child_gate_decided_while_the_parent_runs_another_item_goes_on_at_once(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """remediate[0]'s child runs on after its decision (held) in one process; the gate of
    remediate[2]'s child is decided from another process: it is recorded in that child,
    the decider exits 0 (handed over), and the executing process continues item 2's child
    while item 0's still runs; remediate[1] keeps waiting."""
    p = make_project(HELD_CHECK)
    p.workflow(GATED_CHILD, "gated.yaml")
    wf = p.workflow(FLEET, "fleet.yaml")
    store = p.store
    assert _interlock(tmp_path, "run", wf, "--run-id", "fbusy", "--store",
                      store).returncode == 3
    executor = _spawn(tmp_path, "resume", "fbusy", "--approve", "--gate",
                      "remediate[0]/approval", "--by", "al", "--store", store, "--json",
                      env=_env(tmp_path, HOLD="t0"))
    try:
        wait_for(lambda: (tmp_path / "started-check-t0.marker").exists(), "t0's check")
        decider = _interlock(tmp_path, "resume", "fbusy", "--approve", "--gate",
                             "remediate[2]/approval", "--by", "bo", "--store", store)
        assert decider.returncode == 0, decider.stderr
        assert "being executed by" in decider.stderr, decider.stderr
        wait_for(lambda: _count(tmp_path, "check:t2") == 1, "item 2's child to go on")
        assert executor.poll() is None and _count(tmp_path, "check:t0") == 0
        (tmp_path / "go.marker").write_text("go")
        out, err = executor.communicate(timeout=120)
    finally:
        if executor.poll() is None:
            executor.kill()
            executor.communicate()
    assert executor.returncode == 3, err
    assert _pending(json.loads(out)) == [("remediate[1]/approval", "approval")]
    last = _interlock(tmp_path, "resume", "fbusy", "--approve", "--gate",
                      "remediate[1]/approval", "--by", "cy", "--store", store, "--json")
    assert last.returncode == 0, last.stderr
    assert _json(last)["state"]["report"] == ["t0", "t1", "t2"]
    assert [_count(tmp_path, f"check:t{i}") for i in range(3)] == [1, 1, 1]
    child = _records(tmp_path, store, "fbusy.remediate.1.2", "approval.decided")
    assert [(r["decision"], r["by"]) for r in child] == [("approved", "bo")]
    assert _interlock(tmp_path, "verify", "fbusy", "--store", store).returncode == 0


RACE_NODES = NODES + """

def act(state, ctx):
    _mark(f"{ctx.run_id}:{state['target']}")
    return {"done": state["target"]}
"""

RACE = """
workflow: race
nodes:
  plan: {mod}:plan
  act: {call: {mod}:act, confirm: true}
edges:
  - {from: START, to: plan}
  - {from: plan, map: 'targets', to: act, as: target, collect: acts}
"""

RACE_TRIALS = 5


@pytest.mark.parametrize("same", [True, False], ids=["same-item", "two-items"])
def test_racing_deciders_on_item_gates(make_project: Callable[..., CliProject],
                                       tmp_path: Path, same: bool) -> None:
    """Two deciders released together: on one item's gate exactly one wins (the other is
    refused, exit 2) and the item's body runs once; on two items' gates both win and
    each body runs once. The log always verifies."""
    from test_parallel_gates import _race

    p = make_project(RACE_NODES)
    wf = p.workflow(RACE)
    for n, store in enumerate(store_urls(tmp_path)):
        for t in range(RACE_TRIALS):
            run_id = f"irace-{'same' if same else 'two'}-{n}-{t}-{os.getpid()}"
            assert _interlock(tmp_path, "run", wf, "--run-id", run_id, "--store",
                              store).returncode == 3
            gates = ["act[0]", "act[0]"] if same else ["act[0]", "act[1]"]
            results = _race(tmp_path, store, run_id, [
                ["--approve", "--gate", gates[0], "--by", "alice"],
                ["--reject" if same else "--approve", "--gate", gates[1], "--by", "bob"]])
            codes = sorted(r.returncode for r in results)
            decided = [(r["item"], r["decision"]) for r in
                       _records(tmp_path, store, run_id, "approval.decided")]
            ran = [_count(tmp_path, f"{run_id}:t{i}") for i in range(3)]
            if same:
                assert codes == [2, 3], [(r.returncode, r.stderr) for r in results]
                assert len(decided) == 1 and decided[0][0] == 0
                assert ran == [1 if decided[0][1] == "approved" else 0, 0, 0]
            else:
                assert all(r.returncode in (0, 3) for r in results), \
                    [(r.returncode, r.stderr) for r in results]
                assert sorted(decided) == [(0, "approved"), (1, "approved")]
                assert ran == [1, 1, 0]
            assert _interlock(tmp_path, "verify", run_id, "--store", store).returncode == 0
