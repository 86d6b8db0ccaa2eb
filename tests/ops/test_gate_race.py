"""A rejection racing a decision on another gate of the same run (review finding 1), a
decision recorded for a worker while other gates wait (finding 2), and who closed the
gates a rejection closed (finding 21).

Three gates wait together (``legal``, ``security``, ``finance``); ``legal`` has no
rejection route, so rejecting it ends the run REJECTED and closes the others. Decided at
the same moment by two real processes, exactly one decision is recorded per gate, the run
ends REJECTED, and the decider whose gate was closed is refused, naming the rejection.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import released_together
from _workflows import detached
from conftest import CliProject
from test_decision_race import store_urls

NODES = """
def prep(state):
    return {"ready": True}


def after_legal(state):
    with open("executions.log", "a") as f:
        f.write("after_legal\\n")
    return {"legal_done": True}


def fix(state):
    with open("executions.log", "a") as f:
        f.write("fix\\n")
    return {"fixed": True}
"""

GATES = """
workflow: gates
input: [req]
nodes:
  prep: {mod}:prep
  legal: {approval: {show: [req]}}
  security: {approval: {show: [req]}}
  finance: {approval: {show: [req]}}
  fix: {mod}:fix
edges:
  - {from: START, to: prep}
  - {from: prep, to: [legal, security, finance]}
  - {from: [legal, security, finance], to: fix}
  - {from: fix, to: END}
"""


def _start(p: CliProject, run_id: str) -> None:
    started = p.cli("run", p.workflow(GATES), "--input", '{"req": 1}', "--run-id", run_id)
    assert started.exit_code == 3, started.output  # waiting at its three gates


def _cli(store: str, *args: str) -> Any:
    """The CLI in this process (a click Result): quicker than a process per look."""
    from click.testing import CliRunner

    from interlock.cli import cli

    return CliRunner().invoke(cli, [*args, "--store", store], catch_exceptions=False)


def _race(cwd: Path, store: str, run_id: str, deciders: list[list[str]]
          ) -> list[subprocess.CompletedProcess[str]]:
    return released_together(cwd, [["resume", run_id, *args, "--store", store]
                                   for args in deciders])


def _decided(store: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
    """Each gate's ``approval.decided`` records: (decision, by)."""
    trace = _cli(store, "trace", run_id, "--json")
    assert trace.exit_code == 0, trace.output
    out: dict[str, list[tuple[str, str]]] = {}
    for r in json.loads(trace.stdout):
        if r["type"] == "approval.decided":
            out.setdefault(r["node"], []).append((r["decision"], r.get("by")))
    return out


TRIALS = 10  # the old code wedged about one run in three (10 of 30 in the review)


def test_a_rejection_racing_an_approval_on_another_gate(
        make_project: Callable[..., CliProject]) -> None:
    """Two processes released together: ``--reject --gate legal`` and ``--approve --gate
    security``. Never a traceback or a stuck run: each gate has exactly one decision; the
    run ends REJECTED; security is approved (both recorded) or closed by the rejecter, and
    then its decider is refused (exit 2) with the rejection named."""
    p = make_project(NODES)
    import interlock

    wf = interlock.load(p.workflow(GATES))
    outcomes: Counter[str] = Counter()
    for n, store in enumerate(store_urls(p.root)):
        ids = [f"gr-{n}-{t}-{os.getpid()}" for t in range(TRIALS)]
        for run_id in ids:
            assert wf.run_sync({"req": 1}, store=store, run_id=run_id).status \
                == "WAITING_APPROVAL"
        for run_id in ids:
            y, z = _race(p.root, store, run_id, [
                ["--reject", "--gate", "legal", "--by", "y"],
                ["--approve", "--gate", "security", "--by", "z"]])
            said = [(r.returncode, r.stderr[-600:]) for r in (y, z)]
            assert "Traceback" not in y.stderr + z.stderr, said
            assert y.returncode in (0, 4), said  # its rejection recorded (0: handed over)
            decided = _decided(store, run_id)
            assert decided["legal"] == [("rejected", "y")], decided
            assert decided["finance"] == [("closed", "y")], decided
            assert len(decided["security"]) == 1, decided
            if decided["security"] == [("closed", "y")]:
                outcomes["security closed"] += 1
                assert z.returncode == 2, said
                assert f"gate 'security' of run {run_id!r} was closed when 'legal' was " \
                       "rejected by y at " in z.stderr, said
            else:
                outcomes["both recorded"] += 1
                assert decided["security"] == [("approved", "z")], decided
                assert z.returncode in (0, 3, 4), said
            status = _cli(store, "status", run_id, "--json")
            assert json.loads(status.stdout)["status"] == "REJECTED"
            assert _cli(store, "verify", run_id).exit_code == 0
            again = _cli(store, "resume", run_id)  # nothing wedged: a clear refusal
            assert again.exit_code == 2, again.output
    assert "fix" not in p.executions()
    print(dict(outcomes))


def test_decisions_the_old_code_wedged_on_are_folded_in(
        make_project: Callable[..., CliProject]) -> None:
    """The state the race left with the old code: both offers won their gates (security's
    approval offered first, legal's rejection second), nothing in the log -- every resume
    then died of a KeyError in the fold. Now the next resume folds both in, in order:
    security approved, legal rejected, finance closed by the rejecter, the run REJECTED."""
    from interlock._engine._approvals import approve, offer_of, reject
    from interlock._engine._gates import gate_slot
    from interlock._ops._load import load_run
    from interlock._store import open_store

    p = make_project(NODES)
    _start(p, "wedged")

    async def offer() -> None:
        st = open_store(p.store)
        try:
            view = (await load_run(st, "wedged")).view
            gates = {g.node: g for g in view.pending_gates()}
            for node, decision in (("security", approve("z", node="security")),
                                   ("legal", reject("y", node="legal"))):
                won = await st.offer_decision("wedged", gate_slot(gates[node]),
                                              offer_of(gates[node], decision))
                assert won is None
        finally:
            await st.close()

    asyncio.run(offer())
    resumed = p.cli("resume", "wedged")
    assert resumed.exit_code == 4, resumed.output  # REJECTED
    decided = [(r["node"], r["decision"], r.get("by"))
               for r in p.records("wedged") if r["type"] == "approval.decided"]
    assert decided == [("security", "approved", "z"), ("legal", "rejected", "y"),
                       ("finance", "closed", "y")]
    assert p.cli("verify", "wedged").exit_code == 0
    late = p.cli("resume", "wedged", "--gate", "finance", "--approve", "--by", "w")
    assert late.exit_code == 2
    assert "gate 'finance' of run 'wedged' was closed when 'legal' was rejected by y at " \
        in late.output, late.output
    assert "fix" not in p.executions()


def test_a_wedged_run_can_be_cancelled(make_project: Callable[..., CliProject]) -> None:
    """The same state, cancelled instead: CANCELLED, its log verifies."""
    from interlock._engine._approvals import approve, offer_of, reject
    from interlock._engine._gates import gate_slot
    from interlock._ops._load import load_run
    from interlock._store import open_store

    p = make_project(NODES)
    _start(p, "wedged2")

    async def offer() -> None:
        st = open_store(p.store)
        try:
            view = (await load_run(st, "wedged2")).view
            gates = {g.node: g for g in view.pending_gates()}
            for node, decision in (("security", approve("z", node="security")),
                                   ("legal", reject("y", node="legal"))):
                await st.offer_decision("wedged2", gate_slot(gates[node]),
                                        offer_of(gates[node], decision))
        finally:
            await st.close()

    asyncio.run(offer())
    assert p.cli("cancel", "wedged2", "--by", "ops").exit_code == 0
    assert p.cli_json("status", "wedged2")[1]["status"] == "CANCELLED"
    assert p.cli("verify", "wedged2").exit_code == 0


def test_the_records_the_old_code_staged_fold(
        make_project: Callable[..., CliProject]) -> None:
    """The batch the old code built from those two offers -- each decided against the
    same view, so legal's rejection closed security, whose approval comes first in the
    batch -- folds (it raised KeyError): the closing of a gate already decided changes
    nothing, and the run is REJECTED with one decision per gate."""
    from interlock._engine._approvals import approve, decide, reject
    from interlock._engine._fold import RunView
    from interlock._ops._load import load_run
    from interlock._store import open_store

    p = make_project(NODES)
    _start(p, "old")

    async def read() -> tuple[Any, list[dict[str, Any]]]:
        st = open_store(p.store)
        try:
            return await load_run(st, "old"), [e.record() for e in await st.entries("old")]
        finally:
            await st.close()

    loaded, records = asyncio.run(read())
    view = RunView(loaded.plan)
    for rec in records:
        view.apply(rec)
    assert {g.node for g in view.pending_gates()} == {"legal", "security", "finance"}
    # the two offers decided as the old code did, each against the same view (without
    # expired=, which now names the decisions staged before): legal's rejection closes
    # security, decided just before it in the same batch
    batch = decide(loaded.spec, view, approve("z", node="security")) \
        + decide(loaded.spec, view, reject("y", node="legal"))
    closed = [f["node"] for t, f in batch if f.get("decision") == "closed"]
    assert closed == ["security", "finance"]
    for seq, (rtype, fields) in enumerate(batch, start=records[-1]["seq"] + 1):
        view.apply({"seq": seq, "type": rtype, "at": 0.0,
                    **{k: v for k, v in fields.items() if v is not None}})
    assert view.status == "REJECTED"
    assert {k[0]: g.decision for k, g in view.gates.items()} == {"finance": "closed"}


DETACHED = detached("{mod}")


def test_a_decision_recorded_for_a_worker_while_another_gate_waits_verifies(
        make_project: Callable[..., CliProject]) -> None:
    """``resume --gate legal --approve --detach`` while security still waits: the run's row
    says WAITING_APPROVAL (people are still needed) and its log folds to a run a worker
    has to continue -- ``verify`` agrees with the row (it called the log tampered with),
    an export verifies, and a worker continues legal's branch."""
    p = make_project(NODES)
    assert p.cli("run", p.workflow(DETACHED), "--run-id", "det").exit_code == 3
    decided = p.cli("resume", "det", "--gate", "legal", "--approve", "--by", "al", "--detach")
    assert decided.exit_code == 0, decided.output
    verified = p.cli("verify", "det")
    assert verified.exit_code == 0, verified.output
    _, status = p.cli_json("status", "det")
    assert status["status"] == "WAITING_APPROVAL"
    assert [g["node"] for g in status["waiting"]["pending"]] == ["security"]
    exported = p.cli("export", "det")
    assert exported.exit_code == 0
    (p.root / "det.jsonl").write_text(exported.stdout)
    from_file = p.cli("verify", "--file", str(p.root / "det.jsonl"))
    assert from_file.exit_code == 0, from_file.output

    worker = subprocess.Popen([sys.executable, "-m", "interlock", "worker", "--store", p.store,
                               "--poll", "0.05"], cwd=p.root, stderr=subprocess.PIPE,
                              text=True)
    watchdog = threading.Timer(90, worker.kill)  # (a worker that never finishes it)
    watchdog.start()
    try:
        assert worker.stderr is not None
        for line in worker.stderr:  # one line per run claimed and per run finished
            if "det" in line and "claimed" not in line:
                break
    finally:
        watchdog.cancel()
        worker.terminate()
        worker.communicate(timeout=60)
    assert p.executions() == ["after_legal"]
    _, status = p.cli_json("status", "det")
    assert status["status"] == "WAITING_APPROVAL"
    assert [g["node"] for g in status["waiting"]["pending"]] == ["security"]
    assert p.cli("verify", "det").exit_code == 0
    assert p.cli("resume", "det", "--gate", "security", "--approve").exit_code == 0


TIMED = """
workflow: timed
nodes:
  prep: {mod}:prep
  legal: {approval: {show: [], timeout: 30s}}
  security: {approval: {show: [], timeout: 30s}}
edges:
  - {from: START, to: prep}
  - {from: prep, to: [legal, security]}
"""


def test_two_gates_past_their_deadlines_end_the_run_once(
        make_project: Callable[..., CliProject], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both deadlines passed when the run is resumed: the first gate's timeout rejects it
    and closes the other (by the engine), once -- the old code decided the second one too,
    after the run had ended, and the resume failed with an internal error."""
    import time

    import interlock

    p = make_project(NODES)
    wf = interlock.load(p.workflow(TIMED))
    first = wf.run_sync(store=p.store, run_id="timed")
    assert first.status == "WAITING_APPROVAL"
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)
    done = wf.resume_sync("timed", store=p.store)
    assert done.status == "REJECTED"
    decided = [(r["node"], r["decision"], r.get("by")) for r in p.records("timed")
               if r["type"] == "approval.decided"]
    assert decided == [("legal", "rejected", "interlock (deadline)"),
                       ("security", "closed", "interlock (deadline)")]
    assert p.cli("verify", "timed").exit_code == 0
