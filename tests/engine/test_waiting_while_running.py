"""A run is WAITING_APPROVAL while any gate waits (SPEC §3), also while other branches
still run in the process executing it: ``status --json``, the API's run object,
``runs --waiting`` and ``/api/approvals`` show the gate from the moment it is asked,
with ``waiting.running`` naming the branches still at work. The run keeps its executor:
no worker claims it while the executor's lease is alive, a plain ``resume`` says who
executes it, a decision from another process is folded in by the executor; the
executor's exit code is decided when it stops. If the executor dies, the run is taken
over (a worker, or ``resume``) like any run whose executor died.

Real processes on SQLite and PostgreSQL (when INTERLOCK_TEST_POSTGRES is set).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import wait_for
from test_decision_race import store_urls

from interlock._store import open_store

NODES = """
import os
import pathlib
import time


def _mark(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def start(state):
    return {"x": 1}


def after_gate(state):
    _mark("after_gate")
    pathlib.Path("after_gate.marker").write_text("ran")
    return {"after": True}


def slow(state):
    # blocks until the test has seen the gate from another process and lets it go
    pathlib.Path("slow_started.marker").write_text("started")
    deadline = time.monotonic() + 120
    while not os.path.exists("go.marker") and time.monotonic() < deadline:
        time.sleep(0.02)
    _mark("slow")
    return {"slow": True}


def done(state):
    _mark("done")
    return {"done": True}
"""

FLOW = """
workflow: busy_legal
nodes:
  start: wwr_nodes:start
  legal: {approval: {show: [x], approvers: [alice]}}
  after_gate: wwr_nodes:after_gate
  slow: wwr_nodes:slow
  done: wwr_nodes:done
edges:
  - {from: START, to: start}
  - {from: start, to: [legal, slow]}
  - {from: legal, to: after_gate, when: 'legal.decision == "approved"'}
  - {from: [after_gate, slow], to: done}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "wwr_nodes.py").write_text(NODES)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "busy_legal.yaml").write_text(FLOW)
    return tmp_path


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}


def _cli(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=root,
                          env=_env(root), capture_output=True, text=True, timeout=timeout)


def _wait_for(what: Callable[[], bool], why: str, timeout: float = 30) -> None:
    wait_for(what, why, timeout, every=0.05)


def _status(root: Path, store: str, run_id: str) -> dict[str, Any]:
    out = _cli(root, "status", run_id, "--store", store, "--json")
    assert out.stdout, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def _executions(root: Path) -> list[str]:
    log = root / "executions.log"
    return log.read_text().split() if log.exists() else []


def _start(root: Path, store: str, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", "flows/busy_legal.yaml", "--run-id", run_id,
         "--store", store, "--json"], cwd=root, env=_env(root), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _seen_waiting(root: Path, store: str, run_id: str) -> dict[str, Any]:
    """From another process: the run is WAITING_APPROVAL at ``legal`` while ``slow``
    still runs (it waits for go.marker, not written yet)."""
    _wait_for(lambda: (root / "slow_started.marker").exists(), "slow to start")
    seen: dict[str, Any] = {}

    def waiting() -> bool:
        seen.update(_status(root, store, run_id))
        return seen["status"] == "WAITING_APPROVAL"

    _wait_for(waiting, "status WAITING_APPROVAL while slow runs", timeout=20)
    assert "slow" not in _executions(root)  # (still blocked)
    w = seen["waiting"]
    assert w["node"] == "legal" and w["kind"] == "approval"
    assert [g["node"] for g in w["pending"]] == ["legal"]
    assert w["running"] == ["slow"]
    return seen


@pytest.mark.parametrize("n", [0, 1], ids=["sqlite", "postgres"])
def test_waiting_approval_while_a_branch_runs_in_another_process(
        project: Path, n: int) -> None:
    stores = store_urls(project)
    if n >= len(stores):
        pytest.skip("INTERLOCK_TEST_POSTGRES is not set")
    store = stores[n]
    run_id = f"wwr-{uuid.uuid4().hex[:8]}"
    executor = _start(project, store, run_id)
    served = None
    try:
        _seen_waiting(project, store, run_id)
        # every surface: runs --waiting, a server's run object and inbox (it executes
        # nothing: --workers 0)
        listed = _cli(project, "runs", "--waiting", "--store", store, "--json")
        rows = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
        assert [r["waiting"]["node"] for r in rows] == ["legal"], listed.stdout
        from test_server import Served

        served = Served(project, "--workers", "0", store=store)
        with served.client() as http:
            run = http.get(f"/api/runs/{run_id}").json()
            assert run["status"] == "WAITING_APPROVAL", run
            assert run["waiting"]["running"] == ["slow"]
            inbox = [a for a in http.get("/api/approvals").json() if a["run_id"] == run_id]
            assert [(a["node"], a["kind"]) for a in inbox] == [("legal", "approval")]
        # the run keeps its executor: no worker gets it, a plain resume says who has it
        claimed = asyncio.run(_claim_next(store))
        assert claimed != run_id
        plain = _cli(project, "resume", run_id, "--store", store)
        assert plain.returncode == 2, plain.stderr
        assert "executed by" in plain.stderr or "being executed" in plain.stderr, plain.stderr
        # decided from another process: recorded for the executor, which goes on with it
        decider = _cli(project, "resume", run_id, "--approve", "--gate", "legal", "--by",
                       "alice", "--store", store)
        assert decider.returncode == 0, decider.stderr
        _wait_for(lambda: (project / "after_gate.marker").exists(), "after_gate")
        after = _status(project, store, run_id)
        assert after["status"] == "RUNNING" and after["waiting"] is None, after
        assert "slow" not in _executions(project)
        (project / "go.marker").write_text("go")
        out, err = executor.communicate(timeout=60)
    finally:
        if served is not None:
            served.stop()
        if executor.poll() is None:
            executor.kill()
            executor.communicate(timeout=30)
    assert executor.returncode == 0, err
    assert json.loads(out)["status"] == "COMPLETED"
    assert _executions(project).count("done") == 1
    assert _executions(project).count("slow") == 1
    assert _cli(project, "verify", run_id, "--store", store).returncode == 0


async def _claim_next(store_url: str) -> str | None:
    store = open_store(store_url)
    try:
        got = await store.claim_next("a-test-worker", 5.0)
        if got is not None:
            await store.release(got, "a-test-worker")
        return got
    finally:
        await store.close()


def test_the_executor_exits_3_when_its_branches_are_done_and_the_gate_still_waits(
        project: Path) -> None:
    store = store_urls(project)[0]
    run_id = f"wwr-{uuid.uuid4().hex[:8]}"
    executor = _start(project, store, run_id)
    try:
        _seen_waiting(project, store, run_id)
        (project / "go.marker").write_text("go")
        out, err = executor.communicate(timeout=60)
    finally:
        if executor.poll() is None:
            executor.kill()
            executor.communicate(timeout=30)
    assert executor.returncode == 3, err
    stopped = json.loads(out)
    assert stopped["status"] == "WAITING_APPROVAL"
    assert "running" not in stopped["waiting"]  # stopped at its gate: nothing else to do
    assert "running" not in _status(project, store, run_id)["waiting"]
    assert asyncio.run(_claim_next(store)) is None  # nothing for a worker
    result = _cli(project, "resume", run_id, "--approve", "--by", "alice", "--store", store,
                  "--json")
    assert result.returncode == 0, result.stderr
    assert _executions(project).count("done") == 1


def test_a_waiting_run_whose_executor_died_is_taken_over_by_a_worker(
        project: Path) -> None:
    """SIGKILL the executor while the gate waits and ``slow`` runs: the run still shows
    WAITING_APPROVAL (with ``running``), and a worker continues it -- ``slow`` runs again,
    the gate keeps waiting -- instead of leaving it stranded."""
    store = store_urls(project)[0]
    run_id = f"wwr-{uuid.uuid4().hex[:8]}"
    executor = _start(project, store, run_id)
    try:
        _seen_waiting(project, store, run_id)
    finally:
        executor.send_signal(signal.SIGKILL)
        executor.communicate(timeout=30)
    assert _status(project, store, run_id)["waiting"]["running"] == ["slow"]
    (project / "go.marker").write_text("go")
    worker = subprocess.Popen(
        [sys.executable, "-m", "interlock", "worker", "--store", store, "--poll", "0.05"],
        cwd=project, env=_env(project), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        _wait_for(lambda: "slow" in _executions(project), "the worker to run slow again")
        _wait_for(lambda: "running" not in (_status(project, store, run_id)["waiting"]
                                            or {}), "the run to stop at its gate")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    stopped = _status(project, store, run_id)
    assert stopped["status"] == "WAITING_APPROVAL" and stopped["waiting"]["node"] == "legal"
    assert "after_gate" not in _executions(project)
    result = _cli(project, "resume", run_id, "--approve", "--by", "alice", "--store", store)
    assert result.returncode == 0, result.stderr
    assert _executions(project).count("done") == 1
