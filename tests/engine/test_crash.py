"""Crash and resume with real processes: SIGKILL an `interlock run` and continue it.

Each node appends ``<pid> start|end <node>`` to a file; a node named in the
``CRASH_AT`` environment variable announces itself (a ``ready_<node>`` file) and
then blocks, so the test knows the process is inside that node when it kills it.
After ``interlock resume`` (a new process, without ``CRASH_AT``) we check: no
node whose completion was committed ran again, a journaled effect inside the
interrupted node was not repeated, the final state equals an uninterrupted
run's, and ``interlock verify`` passes.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

NODES = '''
import asyncio, os, time
from pathlib import Path

def _mark(what, node):
    with open("trace.txt", "a") as f:
        f.write(f"{os.getpid()} {what} {node}\\n")

def _block_if_asked(node):
    if os.environ.get("CRASH_AT", "") in (node, "fan" if node.startswith("c") else None):
        Path(f"ready_{node}").write_text("")
        while True:
            time.sleep(0.05)

async def _work(state, ctx, node, update):
    _mark("start", node)
    await asyncio.sleep(0.03)
    await asyncio.to_thread(_block_if_asked, node)
    _mark("end", node)
    return update

def _charge(key):
    with open("effects.txt", "a") as f:
        f.write(key + "\\n")
    return "receipt-" + key[-6:]

async def a(state, ctx):
    return await _work(state, ctx, "a", {"log": "a", "a": 1})

async def b(state, ctx):
    receipt = await ctx.once("charge", _charge, ctx.idempotency_key)
    return await _work(state, ctx, "b", {"log": "b", "receipt": receipt})

async def c1(state, ctx):
    return await _work(state, ctx, "c1", {"log": "c1", "c1": state["a"] + 1})

async def c2(state, ctx):
    return await _work(state, ctx, "c2", {"log": "c2", "c2": state["a"] + 2})

async def d(state, ctx):
    return await _work(state, ctx, "d", {"log": "d", "total": state["c1"] + state["c2"]})
'''

WORKFLOW = """
workflow: crashy
state:
  log: {reducer: append}
nodes:
  a: nodes:a
  b: nodes:b
  c1: nodes:c1
  c2: nodes:c2
  d: nodes:d
edges:
  - {from: START, to: a}
  - {from: a, to: b}
  - {from: b, to: [c1, c2]}
  - {from: [c1, c2], to: d}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "nodes.py").write_text(textwrap.dedent(NODES))
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    return tmp_path


def cli(project: Path, *args: str, env: dict[str, str] | None = None,
        check: bool = False) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=project,
                          env=full_env, capture_output=True, text=True, timeout=60,
                          check=check)


def spawn_run(project: Path, crash_at: str, store: str, run_id: str) -> subprocess.Popen[bytes]:
    """``interlock run wf.yaml`` in a process (group) of its own, blocking in ``crash_at``."""
    env = {**os.environ, "CRASH_AT": crash_at}
    return subprocess.Popen([sys.executable, "-m", "interlock", "run", "wf.yaml", "--store",
                             store, "--run-id", run_id], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def start_and_kill(project: Path, crash_at: str, ready: list[str], store: str) -> str:
    """Start a run that blocks in ``crash_at``, SIGKILL it once every ready file exists."""
    proc = spawn_run(project, crash_at, store, f"run-{crash_at}")
    try:
        deadline = time.monotonic() + 30
        while not all((project / f"ready_{n}").exists() for n in ready):
            assert proc.poll() is None, "the run ended before reaching the crash point"
            assert time.monotonic() < deadline, "the run never reached the crash point"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return f"run-{crash_at}"


def committed_completions(db: Path, run_id: str) -> set[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT data FROM records WHERE run_id = ? AND type = ?",
                            (run_id, "node.completed")).fetchall()
    return {json.loads(r[0])["node"] for r in rows}


def body_runs(project: Path) -> list[tuple[int, str, str]]:
    out = []
    for line in (project / "trace.txt").read_text().splitlines():
        pid, what, node = line.split()
        out.append((int(pid), what, node))
    return out


def reference_state(tmp_path: Path) -> dict:
    ref = tmp_path / "reference"
    ref.mkdir()
    (ref / "nodes.py").write_text(textwrap.dedent(NODES))
    (ref / "wf.yaml").write_text(WORKFLOW)
    out = cli(ref, "run", "wf.yaml", "--store", f"sqlite:///{ref}/runs.db", "--json",
              check=True)
    return json.loads(out.stdout)["state"]


def normalise(state: dict) -> dict:
    state = dict(state)
    state["log"] = sorted(state["log"])  # the fan-out's two appends may come in either order
    state.pop("receipt", None)  # derived from the run id
    return state


@pytest.mark.parametrize("crash_at, ready", [
    ("b", ["b"]),            # inside a node, after its journaled effect
    ("fan", ["c1", "c2"]),   # during a parallel fan-out, both branches in flight
    ("d", ["d"]),            # inside the join's target
])
def test_sigkill_then_resume_finishes_exactly_once(project: Path, tmp_path: Path,
                                                   crash_at: str, ready: list[str]) -> None:
    db = project / "runs.db"
    store = f"sqlite:///{db}"
    run_id = start_and_kill(project, crash_at, ready, store)
    done_before = committed_completions(db, run_id)
    killed_pid = {pid for pid, _, _ in body_runs(project)}.pop()

    status = cli(project, "status", run_id, "--store", store, "--json")
    assert status.stdout, status.stderr
    assert json.loads(status.stdout)["status"] == "RUNNING"  # what the log says: interrupted
    # its lease has not run out, but its process is gone: status says so, as resume sees it
    human = cli(project, "status", run_id, "--store", store)
    assert "interrupted: no process is executing it" in human.stdout, human.stdout
    assert "being executed by" not in human.stdout

    resumed = cli(project, "resume", run_id, "--store", store, "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "COMPLETED"

    # no node whose completion was committed before the kill ran again
    again = {node for pid, what, node in body_runs(project)
             if pid != killed_pid and what == "start"}
    assert not (again & done_before), f"completed nodes ran again: {again & done_before}"
    # the interrupted nodes did run again, and everything ran to completion
    assert set(ready) <= again
    assert committed_completions(db, run_id) == {"a", "b", "c1", "c2", "d"}
    # the journaled effect happened once, whether or not b was interrupted
    assert (project / "effects.txt").read_text().splitlines() == [f"{run_id}:b:1"]
    assert normalise(result["state"]) == normalise(reference_state(tmp_path))
    verified = cli(project, "verify", run_id, "--store", store)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_long_node_shows_in_the_log_while_it_runs_and_after_a_crash(project: Path) -> None:
    """``node.started`` rides with the next commit -- or the watcher's poll commits it: a
    node that runs on shows in status and trace (steps counts it), and a crash keeps it."""
    db = project / "runs.db"
    store = f"sqlite:///{db}"
    proc = spawn_run(project, "d", store, "run-long")
    try:
        deadline = time.monotonic() + 30
        seen: dict = {}
        while True:  # d blocks for good: its start must reach the store while it does
            assert proc.poll() is None, "the run ended; d should block"
            assert time.monotonic() < deadline, f"node.started for d never committed: {seen}"
            if (project / "ready_d").exists():
                status = cli(project, "status", "run-long", "--store", store, "--json")
                seen = json.loads(status.stdout) if status.stdout else {}
                if seen.get("steps") == 5:
                    break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    records = json.loads(cli(project, "trace", "run-long", "--store", store, "--json").stdout)
    assert [r["node"] for r in records if r["type"] == "node.started"][-1] == "d"
    assert not any(r["type"] == "node.completed" and r["node"] == "d" for r in records)
    resumed = cli(project, "resume", "run-long", "--store", store, "--json")
    assert json.loads(resumed.stdout)["status"] == "COMPLETED", resumed.stderr


TERM_NODES = """
import asyncio
from pathlib import Path

async def first(state):
    return {"x": 1}

async def slow(state):
    Path(f"ready_slow_{state.get('done', 0)}").write_text("")
    if not Path("go").exists():
        await asyncio.sleep(120)
    return {"done": 1}
"""

TERM_WORKFLOW = """
workflow: term
nodes:
  first: term_nodes:first
  slow: term_nodes:slow
edges:
  - {from: START, to: first}
  - {from: first, to: slow}
"""


def test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes_at_once(tmp_path: Path) -> None:
    (tmp_path / "term_nodes.py").write_text(TERM_NODES)
    (tmp_path / "wf.yaml").write_text(TERM_WORKFLOW)
    store = f"sqlite:///{tmp_path}/runs.db"
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "run", "wf.yaml", "--store",
                             store, "--run-id", "run-term"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready_slow_0").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated: run run-term stopped" in err and "interlock resume run-term" in err
    records = json.loads(cli(tmp_path, "trace", "run-term", "--store", store, "--json").stdout)
    assert [r["node"] for r in records
            if r["type"] in ("node.completed", "node.visited")] == ["first"]
    assert records[-1]["type"] in ("edge.taken", "node.started", "node.visited")  # no end
    # the lease was released: no waiting, no --force, whichever host resumes it
    status = cli(tmp_path, "status", "run-term", "--store", store)
    assert "interrupted: no process is executing it" in status.stdout, status.stdout
    (tmp_path / "go").write_text("")
    resumed = cli(tmp_path, "resume", "run-term", "--store", store, "--json")
    assert json.loads(resumed.stdout)["state"] == {"x": 1, "done": 1}, resumed.stderr


def test_sigkill_at_spread_out_moments_never_loses_or_repeats_work(project: Path) -> None:
    """Kills at spread-out times after the run started, landing between nodes as well as
    inside them (each node takes ~30 ms)."""
    db = project / "runs.db"
    store = f"sqlite:///{db}"
    for i, delay in enumerate([0.0, 0.04, 0.09, 0.15, 0.22]):
        run_id = f"chaos-{i}"
        proc = subprocess.Popen([sys.executable, "-m", "interlock", "run", "wf.yaml", "--store",
                                 store, "--run-id", run_id], cwd=project,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        assert proc.stderr is not None
        proc.stderr.readline()  # "run <id> started": its first record is committed
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
        if len(committed_completions(db, run_id)) < 5:
            resumed = cli(project, "resume", run_id, "--store", store, "--json")
            assert resumed.returncode == 0, resumed.stderr
            assert json.loads(resumed.stdout)["status"] == "COMPLETED"
        assert committed_completions(db, run_id) == {"a", "b", "c1", "c2", "d"}
        assert cli(project, "verify", run_id, "--store", store).returncode == 0
    effects = (project / "effects.txt").read_text().splitlines()
    assert sorted(effects) == sorted(f"chaos-{i}:b:1" for i in range(5))


def test_a_running_run_cannot_be_resumed_by_a_second_process(project: Path) -> None:
    db = project / "runs.db"
    store = f"sqlite:///{db}"
    proc = spawn_run(project, "b", store, "busy")
    try:
        deadline = time.monotonic() + 30
        while not (project / "ready_b").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = cli(project, "resume", "busy", "--store", store)
        assert second.returncode == 2
        assert "is being executed by" in second.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # once the owner is gone, a resume takes over at once (no lease wait)
    resumed = cli(project, "resume", "busy", "--store", store, "--json")
    assert resumed.returncode == 0, resumed.stderr


def test_resume_uses_the_definition_the_run_started_with(project: Path) -> None:
    db = project / "runs.db"
    store = f"sqlite:///{db}"
    run_id = start_and_kill(project, "b", ["b"], store)
    # someone edits the file while the run is stopped: d is removed, the edges change
    (project / "wf.yaml").write_text(WORKFLOW.replace("  - {from: [c1, c2], to: d}\n", "")
                                     .replace("  d: nodes:d\n", ""))
    resumed = cli(project, "resume", run_id, "--store", store, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"]["total"] == 5  # d still ran


SLOW_NODES = '''
import asyncio
from pathlib import Path

async def start(state):
    return {"started": True}

async def branch(state, ctx):
    Path(f"ready_{ctx.node}").write_text("")
    await asyncio.sleep(60)
    return {ctx.node: True}
'''

SLOW_WORKFLOW = """
workflow: slow
nodes:
  start: slow_nodes:start
  left: slow_nodes:branch
  right: slow_nodes:branch
  join: slow_nodes:start
edges:
  - {from: START, to: start}
  - {from: start, to: [left, right]}
  - {from: [left, right], to: join}
"""


def test_cancel_from_another_process_stops_a_run_mid_fan_out(tmp_path: Path) -> None:
    (tmp_path / "slow_nodes.py").write_text(SLOW_NODES)
    (tmp_path / "slow.yaml").write_text(SLOW_WORKFLOW)
    store = f"sqlite:///{tmp_path}/runs.db"
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "run", "slow.yaml", "--store",
                             store, "--run-id", "victim", "--json"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ((tmp_path / "ready_left").exists() and (tmp_path / "ready_right").exists()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        cancelled = cli(tmp_path, "cancel", "victim", "--by", "alice", "--store", store)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        out, _ = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    result = json.loads(out)
    assert result["status"] == "CANCELLED" and "alice" in result["error"]["message"]
    assert proc.returncode == 1
    trace = json.loads(cli(tmp_path, "trace", "victim", "--store", store, "--json").stdout)
    assert trace[-1]["type"] == "run.cancelled" and trace[-1]["by"] == "alice"
    cancelled_nodes = {r["node"] for r in trace if r["type"] == "node.failed"}
    assert cancelled_nodes == {"left", "right"}
    # cancelling twice is refused; the log is intact
    assert cli(tmp_path, "cancel", "victim", "--store", store).returncode == 2
    assert cli(tmp_path, "verify", "victim", "--store", store).returncode == 0


def test_cancel_a_waiting_run(tmp_path: Path) -> None:
    (tmp_path / "gate.yaml").write_text("""
workflow: gate
nodes:
  ask: {approval: {show: []}}
edges:
  - {from: START, to: ask}
""")
    store = f"sqlite:///{tmp_path}/runs.db"
    assert cli(tmp_path, "run", "gate.yaml", "--store", store, "--run-id", "w").returncode == 3
    assert cli(tmp_path, "cancel", "w", "--by", "bob", "--store", store).returncode == 0
    status = json.loads(cli(tmp_path, "status", "w", "--store", store, "--json").stdout)
    assert status["status"] == "CANCELLED"
