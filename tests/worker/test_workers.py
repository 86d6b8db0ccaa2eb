"""`interlock run --detach`, `interlock worker`, `serve --workers 0` (SPEC §9) with real
processes: workers on one SQLite file and on PostgreSQL, killed (SIGKILL) and stopped
(SIGTERM) mid-run, a decision recorded for a worker, a server that only records.

Every node appends ``RUN NODE`` to ``executions.log`` (one ``write`` of a short line in
append mode: whole lines, whichever process writes), so a node executed twice shows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import write_folder
from test_store_conformance import pg_schema_url  # noqa: F401 - a fixture used below

import interlock

NODES = '''
import os, time
from pathlib import Path

def _note(ctx, node):
    with open(os.environ["WK_DIR"] + "/executions.log", "a") as f:
        f.write(f"{ctx.run_id} {node}\\n")

def first(state, ctx):
    _note(ctx, "first")
    time.sleep(float(os.environ.get("WK_NAP", "0")))
    return {"n": state["n"] + 1}

def block(state, ctx):
    _note(ctx, "block")
    d = Path(os.environ["WK_DIR"])
    (d / f"{ctx.run_id}.block.started").write_text(str(os.getpid()))
    while not (d / f"{ctx.run_id}.release").exists():
        time.sleep(0.02)
    return {"n": state["n"] * 10}

def last(state, ctx):
    _note(ctx, "last")
    time.sleep(float(os.environ.get("WK_NAP", "0")))
    return {"n": state["n"] + 2}
'''

CHAIN = '''
workflow: chain
input: [n]
nodes:
  first: wknodes:first
  last: wknodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: last}
  - {from: last, to: END}
'''

BLOCKING = '''
workflow: blocking
input: [n]
nodes:
  first: wknodes:first
  block: wknodes:block
  last: wknodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: block}
  - {from: block, to: last}
  - {from: last, to: END}
'''

GATED = '''
workflow: gated
input: [n]
nodes:
  first: wknodes:first
  gate: {approval: {show: [n]}}
  last: wknodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: gate}
  - {from: gate, to: last, when: 'gate.decision == "approved"'}
  - {from: last, to: END}
'''

TIMED = GATED.replace("gated", "timed").replace("{show: [n]}", "{show: [n], timeout: 1s}")

RUN_KEYS = {"run_id", "workflow", "status", "state", "steps", "tokens", "error", "waiting"}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    write_folder(tmp_path, {"wknodes": NODES},
                 {"chain": CHAIN, "blocking": BLOCKING, "gated": GATED, "timed": TIMED})
    (tmp_path / "executions.log").write_text("")
    monkeypatch.setenv("WK_DIR", str(tmp_path))
    # (the tree under test first after the nodes, as the test process imports it)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, project: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{project / 'runs.db'}"
    url: str = request.getfixturevalue("pg_schema_url")  # a schema of its own
    return url


def cli(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=project,
                          capture_output=True, text=True, timeout=timeout)


class Worker:
    """A running ``interlock worker`` process; its stderr lines collected."""

    def __init__(self, project: Path, store: str, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock", "worker", "--store", store, "--poll", "0.05",
             *args], cwd=project, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            text=True, env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.wait_for("worker started")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end
            self._changed.notify_all()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, what: str, timeout: float = 60) -> None:
        """Block until a line holding ``what`` is logged (woken by each line read)."""
        with self._changed:
            ok = self._changed.wait_for(
                lambda: what in self.text or (self.lines and self.lines[-1] == ""), timeout)
        assert ok and what in self.text, f"no {what!r} in the worker's log:\n{self.text}"

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture
def workers(project: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(store: str, *args: str, env: dict[str, str] | None = None) -> Worker:
        started.append(Worker(project, store, *args, env=env))
        return started[-1]

    yield start
    for w in started:
        w.stop(signal.SIGKILL)


def get_row(store: str, run_id: str) -> Any:
    async def read() -> Any:
        st = interlock.open_store(store)
        try:
            return await st.get_run(run_id)
        finally:
            await st.close()

    return asyncio.run(read())


def run_status(store: str, run_id: str) -> interlock.RunResult:
    return asyncio.run(interlock.status(run_id, store=store))


def wait_until(what: Callable[[], bool], timeout: float = 60, every: float = 0.05) -> None:
    """Poll another process's effect (a run's status in the store, a file) until it
    shows: there is no event across processes to wait on here."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(every)


def wait_status(store: str, run_id: str, status: str, timeout: float = 60
                ) -> interlock.RunResult:
    wait_until(lambda: run_status(store, run_id).status == status, timeout)
    return run_status(store, run_id)


def executions(project: Path) -> Counter[tuple[str, str]]:
    lines = (project / "executions.log").read_text().split()
    return Counter(zip(lines[::2], lines[1::2], strict=True))


def trace_types(store: str, run_id: str) -> list[tuple[str, str | None]]:
    return [(r["type"], r["node"]) for r in asyncio.run(interlock.trace(run_id, store=store))]


# -- run --detach, then a worker ------------------------------------------------------------


def test_a_detached_run_is_pending_until_a_worker_executes_it(project: Path,
                                                              workers: Any) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    done = cli(project, "run", "--detach", "flows/chain.yaml", "--input", '{"n": 1}',
               "--store", store, "--run-id", "d1", "--json")
    assert done.returncode == 0, done.stderr
    pending = json.loads(done.stdout)
    assert set(pending) == RUN_KEYS
    assert pending == {"run_id": "d1", "workflow": "chain", "status": "PENDING",
                       "state": {"n": 1}, "steps": 0, "tokens": 0, "error": None,
                       "waiting": None}
    status = cli(project, "status", "d1", "--store", store, "--json")
    assert status.returncode == 0, status.stderr  # not finished, not failed (issue 33)
    assert json.loads(status.stdout) == pending  # the same object as status --json
    plain = cli(project, "run", "--detach", "flows/chain.yaml", "--input", '{"n": 2}',
                "--store", store)
    assert plain.returncode == 0, plain.stderr
    second = plain.stdout.strip()  # the run id alone on stdout
    assert re.fullmatch(r"[0-9a-f]{20}", second), plain.stdout
    assert "interlock worker" in plain.stderr
    # another workflow's run, which a worker restricted to `chain` leaves alone
    other = cli(project, "run", "--detach", "flows/gated.yaml", "--input", '{"n": 3}',
                "--store", store, "--run-id", "g1")
    assert other.returncode == 0, other.stderr
    assert executions(project) == Counter()  # nothing executed yet
    taken = cli(project, "run", "--detach", "flows/chain.yaml", "--input", '{"n": 1}',
                "--store", store, "--run-id", "d1")
    assert taken.returncode == 2 and "d1" in taken.stderr, taken.stderr
    no_input = cli(project, "run", "--detach", "flows/chain.yaml", "--store", store)
    assert no_input.returncode == 2 and "declares input" in no_input.stderr
    assert run_status(store, "d1") == interlock.RunResult(**pending)  # untouched

    w = workers(store, "--workflows", "flows/chain.yaml")
    for rid in ("d1", second):
        w.wait_for(f"finished run {rid} (workflow chain): COMPLETED, 2 steps")
        assert f"claimed run {rid} (workflow chain, PENDING)" in w.text
    assert run_status(store, "d1").state == {"n": 4}
    assert executions(project) == Counter({("d1", "first"): 1, ("d1", "last"): 1,
                                           (second, "first"): 1, (second, "last"): 1})
    # the log says which worker executed it, after it was recorded detached
    records = asyncio.run(interlock.trace("d1", store=store))
    assert records[0]["type"] == "run.started" and records[0]["detached"] is True
    assert records[1]["type"] == "run.resumed" and records[1]["worker"].count(":") == 2
    assert asyncio.run(interlock.verify("d1", store=store)).ok
    assert run_status(store, "g1").status == "PENDING"  # not a workflow it takes
    assert w.stop() == 0
    assert "no run left claimed" in w.text
    row = asyncio.run(interlock.list_runs(store=store, status="COMPLETED"))
    assert {r.run_id for r in row} == {"d1", second} and all(r.owner is None for r in row)


def test_the_python_api_submits_and_a_worker_in_process_executes(project: Path) -> None:
    from interlock.support import Worker as EngineWorker

    store_url = f"sqlite:///{project / 'api.db'}"
    wf = interlock.load(project / "flows" / "chain.yaml")
    pending = wf.submit_sync({"n": 5}, store=store_url, run_id="api1")
    assert (pending.status, pending.steps, pending.state) == ("PENDING", 0, {"n": 5})
    assert run_status(store_url, "api1") == pending

    async def main() -> interlock.RunResult:
        st = interlock.open_store(store_url)
        try:
            w = EngineWorker(st, concurrency=2, poll=0.01)
            task = asyncio.create_task(w.run())
            while (await interlock.status("api1", store=st)).status != "COMPLETED":
                await asyncio.sleep(0.01)
            w.stop()
            await task
            return await interlock.status("api1", store=st)
        finally:
            await st.close()

    done = asyncio.run(main())
    assert (done.status, done.state) == ("COMPLETED", {"n": 8})
    with pytest.raises(interlock.UsageError, match="declares input"):
        wf.submit_sync({}, store=store_url)


def test_a_workers_log_counts_one_step_in_the_singular(project: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """It said "COMPLETED, 1 steps"."""
    from interlock.support import Worker as EngineWorker

    (project / "flows" / "solo.yaml").write_text(textwrap.dedent("""
        workflow: solo
        input: [n]
        nodes: {first: wknodes:first}
        edges: [{from: START, to: first}, {from: first, to: END}]
    """))
    store_url = f"sqlite:///{project / 'one.db'}"
    wf = interlock.load(project / "flows" / "solo.yaml")
    wf.submit_sync({"n": 1}, store=store_url, run_id="one1")

    async def main() -> None:
        st = interlock.open_store(store_url)
        try:
            w = EngineWorker(st, poll=0.01)
            task = asyncio.create_task(w.run())
            while (await interlock.status("one1", store=st)).status != "COMPLETED":
                await asyncio.sleep(0.01)
            w.stop()
            await task
        finally:
            await st.close()

    with caplog.at_level(logging.INFO, logger="interlock"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "one1" in r.getMessage()]
    assert "finished run one1 (workflow solo): COMPLETED, 1 step" in said, said


# -- many workers, one store ------------------------------------------------------------------


def test_three_workers_execute_each_of_24_runs_exactly_once(project: Path, workers: Any,
                                                            store_url: str) -> None:
    nap = {"WK_NAP": "0.02"}
    started = [workers(store_url, "--concurrency", "2", env=nap) for _ in range(3)]
    wf = interlock.load(project / "flows" / "chain.yaml")

    async def submit() -> list[str]:
        st = interlock.open_store(store_url)
        try:
            return [(await wf.submit({"n": i}, store=st)).run_id for i in range(24)]
        finally:
            await st.close()

    ids = asyncio.run(submit())

    async def all_done() -> bool:
        rows = await interlock.list_runs(store=store_url, status="COMPLETED", limit=100)
        return len(rows) == len(ids)

    wait_until(lambda: asyncio.run(all_done()), timeout=120)
    ran = executions(project)
    assert ran == Counter({(rid, node): 1 for rid in ids for node in ("first", "last")})
    by: Counter[str] = Counter()
    for rid in ids:
        records = asyncio.run(interlock.trace(rid, store=store_url))
        completed = Counter(r["node"] for r in records if r["type"] == "node.completed")
        assert completed == Counter({"first": 1, "last": 1}), rid
        resumed = [r for r in records if r["type"] == "run.resumed"]
        assert len(resumed) == 1, rid  # claimed once
        by[resumed[0]["worker"].split(":")[1]] += 1
        assert run_status(store_url, rid).state["n"] == 3 + int(
            records[0]["input"]["n"])
    assert set(by) <= {str(w.proc.pid) for w in started}
    assert len(by) >= 2, by  # the work was shared
    for w in started:
        assert w.stop() == 0
        finished = w.text.count("finished run ")
        assert finished == by[str(w.proc.pid)], w.text  # one line per run it finished


# -- a worker killed, a worker stopped -------------------------------------------------------


def test_a_worker_killed_mid_run_is_continued_by_another_after_the_lease(
        project: Path, workers: Any, store_url: str) -> None:
    a = workers(store_url, "--lease", "2")
    b = workers(store_url, "--lease", "2")
    wf = interlock.load(project / "flows" / "blocking.yaml")
    asyncio.run(wf.submit({"n": 1}, store=store_url, run_id="k1"))
    wait_until(lambda: (project / "k1.block.started").exists())
    # `first` is committed before `block` starts (SPEC §2)
    assert ("node.completed", "first") in trace_types(store_url, "k1")
    row = get_row(store_url, "k1")
    assert row.owner is not None
    holder, other = (a, b) if row.owner.split(":")[1] == str(a.proc.pid) else (b, a)
    assert holder.stop(signal.SIGKILL) == -signal.SIGKILL
    (project / "k1.release").write_text("")
    other.wait_for("finished run k1 (workflow blocking): COMPLETED, 3 steps", timeout=60)
    assert "claimed run k1 (workflow blocking, RUNNING)" in other.text
    assert run_status(store_url, "k1").state == {"n": 22}
    # the completed node was not run again; the interrupted one was
    assert executions(project) == Counter({("k1", "first"): 1, ("k1", "block"): 2,
                                           ("k1", "last"): 1})
    assert Counter(t for t in trace_types(store_url, "k1"))[("node.completed", "first")] == 1
    assert asyncio.run(interlock.verify("k1", store=store_url)).ok
    assert other.stop() == 0


def test_sigterm_finishes_the_node_in_hand_releases_and_the_next_worker_continues(
        project: Path, workers: Any, store_url: str) -> None:
    first = workers(store_url)
    wf = interlock.load(project / "flows" / "blocking.yaml")
    asyncio.run(wf.submit({"n": 1}, store=store_url, run_id="t1"))
    wait_until(lambda: (project / "t1.block.started").exists())
    first.proc.send_signal(signal.SIGTERM)
    first.wait_for("SIGTERM: claiming nothing more")
    (project / "t1.release").write_text("")  # the node in hand ends now
    assert first.stop() == 0
    assert "released at a node boundary after 2 steps" in first.text
    row = get_row(store_url, "t1")
    assert row.owner is None and row.lease_until is None  # no lease left held
    assert row.summary.status == "RUNNING"
    types = trace_types(store_url, "t1")
    assert ("node.completed", "block") in types and ("node.started", "last") not in types

    second = workers(store_url)
    second.wait_for("finished run t1 (workflow blocking): COMPLETED, 3 steps")
    assert run_status(store_url, "t1").state == {"n": 22}
    assert executions(project) == Counter({("t1", "first"): 1, ("t1", "block"): 1,
                                           ("t1", "last"): 1})
    assert asyncio.run(interlock.verify("t1", store=store_url)).ok
    assert second.stop() == 0


def test_a_node_still_running_after_the_drain_is_stopped_and_run_again_by_the_next(
        project: Path, workers: Any) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    first = workers(store, "--drain", "0.5")
    wf = interlock.load(project / "flows" / "blocking.yaml")
    asyncio.run(wf.submit({"n": 1}, store=store, run_id="c1"))
    wait_until(lambda: (project / "c1.block.started").exists())
    assert first.stop() == 0  # SIGTERM; the node does not end within --drain
    assert "stopped with its nodes in flight" in first.text
    row = get_row(store, "c1")
    assert row.owner is None and row.summary.status == "RUNNING"
    types = trace_types(store, "c1")  # as a process stopped with Ctrl-C leaves it:
    assert types[-1] == ("node.started", "block")  # the visit begun, not completed
    (project / "c1.release").write_text("")
    second = workers(store)
    second.wait_for("finished run c1 (workflow blocking): COMPLETED")
    assert executions(project) == Counter({("c1", "first"): 1, ("c1", "block"): 2,
                                           ("c1", "last"): 1})
    assert asyncio.run(interlock.verify("c1", store=store)).ok
    assert second.stop() == 0


# -- decisions for a worker ----------------------------------------------------------------------


def test_a_decision_recorded_through_the_cli_is_continued_by_a_running_worker(
        project: Path, workers: Any) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    w = workers(store)
    done = cli(project, "run", "--detach", "flows/gated.yaml", "--input", '{"n": 1}',
               "--store", store, "--run-id", "a1")
    assert done.returncode == 0, done.stderr
    w.wait_for("run a1 (workflow gated): WAITING_APPROVAL after")
    decided = cli(project, "resume", "a1", "--approve", "--by", "alice", "--detach",
                  "--store", store, "--json")
    assert decided.returncode == 0, decided.stderr
    assert json.loads(decided.stdout)["status"] == "PENDING"
    w.wait_for("finished run a1 (workflow gated): COMPLETED")
    assert run_status(store, "a1").state["n"] == 4
    records = asyncio.run(interlock.trace("a1", store=store))
    decision = next(r for r in records if r["type"] == "approval.decided")
    assert decision["by"] == "alice"
    assert executions(project) == Counter({("a1", "first"): 1, ("a1", "last"): 1})
    assert w.stop() == 0


def test_a_gate_past_its_deadline_is_decided_by_a_running_worker(project: Path,
                                                                   workers: Any) -> None:
    store = f"sqlite:///{project / 'runs.db'}"
    w = workers(store)
    done = cli(project, "run", "--detach", "flows/timed.yaml", "--input", '{"n": 1}',
               "--store", store, "--run-id", "late")
    assert done.returncode == 0, done.stderr
    w.wait_for("run late (workflow timed): WAITING_APPROVAL after")
    # nobody decides: a second after the request, the worker applies on_timeout (reject)
    w.wait_for("finished run late (workflow timed): REJECTED")
    assert "claimed run late (workflow timed, WAITING_APPROVAL)" in w.text
    decided = [r for r in asyncio.run(interlock.trace("late", store=store))
               if r["type"] == "approval.decided"]
    assert [(r["decision"], r["by"]) for r in decided] == [("rejected", "interlock (deadline)")]
    assert w.stop() == 0


# -- serve --workers 0 -------------------------------------------------------------------------


def test_a_server_with_no_workers_records_and_a_worker_executes(project: Path,
                                                                 workers: Any) -> None:
    pytest.importorskip("fastapi")
    from test_server import Served, events

    store = f"sqlite:///{project / 'runs.db'}"
    server = Served(project, "--workers", "0", store=store)
    try:
        with server.client() as client:
            assert client.get("/api/health").json()["workers"] == 0
            started = client.post("/api/workflows/gated/runs",
                                  json={"input": {"n": 1}, "run_id": "s1"})
            assert started.status_code == 201, started.text
            assert started.json()["status"] == "PENDING"
            assert client.get("/api/runs/s1").json() == started.json()
            w = workers(store)
            seen = [e["event"] for e in events(client, "s1", until="run.waiting")]
            assert seen[:2] == ["run.started", "run.resumed"] and "node.completed" in seen
            decided = client.post("/api/runs/s1/decisions",
                                  json={"decision": "approve", "by": "alice"})
            assert decided.status_code == 200, decided.text
            # recorded, not executed here: PENDING -- or already taken by the worker,
            # which picks a pending run up within milliseconds (who executed it: below)
            assert decided.json()["status"] in ("PENDING", "RUNNING", "COMPLETED")
            rest = [e for e in events(client, "s1", params={"after": len(seen)},
                                      until="run.completed")]
            assert [e["event"] for e in rest][-1] == "run.completed"
            assert client.get("/api/runs/s1").json()["state"]["n"] == 4
        w.wait_for("finished run s1 (workflow gated): COMPLETED")
        assert w.text.count("claimed run s1") == 2  # started, then decided
        assert executions(project) == Counter({("s1", "first"): 1, ("s1", "last"): 1})
    finally:
        assert server.stop() in (0, -signal.SIGTERM)



TICKING = """
workflow: ticking
input: [n]
nodes:
  first: wknodes:first
  last: wknodes:last
edges:
  - {from: START, to: first}
  - {from: first, to: last}
triggers:
  - {every: 1s, input: {n: 1}, id: tick}
"""


def _tick_runs(store: str) -> list[interlock.RunResult]:
    rows = asyncio.run(interlock.list_runs(store=store, workflow="ticking"))
    return [run_status(store, r.run_id) for r in rows]


def test_workers_fire_a_trigger_once_per_slot_and_execute_its_runs(project: Path,
                                                                    workers: Any) -> None:
    """Two `interlock worker` processes given a workflow with an every-second trigger:
    each slot starts one run (the slot's id), which one of them executes."""
    (project / "flows" / "ticking.yaml").write_text(textwrap.dedent(TICKING))
    store = f"sqlite:///{project / 'runs.db'}"
    a = workers(store, "--workflows", "flows/ticking.yaml")
    b = workers(store, "--workflows", "flows/ticking.yaml")
    wait_until(lambda: sum(r.status == "COMPLETED" for r in _tick_runs(store)) >= 3)
    assert a.stop() == 0 and b.stop() == 0
    runs = _tick_runs(store)
    assert all(r.run_id.startswith("ticking.trigger-tick.") for r in runs)
    stamps = sorted(r.run_id.rsplit(".", 1)[1] for r in runs)
    assert len(stamps) == len(set(stamps))  # one run per second, never two
    done = [r for r in runs if r.status == "COMPLETED"]
    assert {r.state["n"] for r in done} == {4}  # 1, then first (+1) and last (x2)
    # each completed run's nodes ran once, by whichever worker claimed it
    counts = executions(project)
    assert all(counts[(r.run_id, "first")] == 1 for r in done)


def test_a_server_fires_its_workflows_triggers(project: Path) -> None:
    pytest.importorskip("fastapi")
    from test_server import Served

    (project / "flows" / "ticking.yaml").write_text(textwrap.dedent(TICKING))
    store = f"sqlite:///{project / 'runs.db'}"
    server = Served(project, store=store)
    try:
        wait_until(lambda: sum(r.status == "COMPLETED" for r in _tick_runs(store)) >= 2)
        out = cli(project, "triggers", "flows/ticking.yaml", "--store", store)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("tick  every 1s, input {\"n\": 1}: next ")
        assert "last run ticking.trigger-tick." in out.stdout
    finally:
        assert server.stop() in (0, -signal.SIGTERM)


# -- errors for people -------------------------------------------------------------------------



def test_a_workflows_folder_skips_its_data_files_but_a_named_one_is_refused(
        project: Path) -> None:
    """`--workflows FOLDER` takes the workflows in it: an example's data file beside them
    (`scenarios.json`) is skipped; named on its own, it is an error with its file:line."""
    from interlock.support import load_workflows

    (project / "flows" / "scenarios.json").write_text('{"disk-full": {"disk": 97}}')
    (project / "flows" / "broken.yaml").write_text("workflow: broken\nnodes: {}\n")
    with pytest.raises(interlock.UsageError, match=r"broken\.yaml"):
        load_workflows([str(project / "flows")])  # a workflow with an error: still shown
    (project / "flows" / "broken.yaml").unlink()
    assert set(load_workflows([str(project / "flows")])) == {"chain", "blocking", "gated",
                                                             "timed"}
    with pytest.raises(interlock.UsageError, match=r"scenarios\.json:1:"):
        load_workflows([str(project / "flows" / "scenarios.json")])


def test_a_worker_refuses_what_it_cannot_use(project: Path) -> None:
    missing = cli(project, "worker", "--store", f"sqlite:///{project}/nowhere/runs.db")
    assert missing.returncode == 2
    assert f"the folder {project}/nowhere does not exist" in missing.stderr
    (project / "junk.db").write_text("not a database")
    junk = cli(project, "worker", "--store", f"sqlite:///{project}/junk.db")
    assert junk.returncode == 2 and "error:" in junk.stderr, junk.stderr
    bad = cli(project, "worker", "--workflows", "flows/nope.yaml")
    assert bad.returncode == 2
    assert "--workflows flows/nope.yaml: no such file or folder" in bad.stderr
    (project / "empty").mkdir()
    empty = cli(project, "worker", "--workflows", "empty")
    assert empty.returncode == 2 and "no workflow files there" in empty.stderr
    unreachable = cli(project, "worker", "--store", "postgresql://nobody@127.0.0.1:1/none")
    assert unreachable.returncode == 2 and "PostgreSQL store" in unreachable.stderr, \
        unreachable.stderr
    both = cli(project, "resume", "x", "--detach", "--server", "http://127.0.0.1:1")
    assert both.returncode == 2 and "--detach goes with --store" in both.stderr
