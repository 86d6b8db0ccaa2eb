"""A server that executes runs itself refuses a run of an agent whose API key is unset
in its environment (review 40, finding 2), as ``interlock run`` does: 409 with the
variable, the node and its ``file:line:col``, nothing recorded and no node run. The
same for a conversation's message, a trigger's firing (a logged error per slot) and
``interlock mcp``'s tools; a server that records runs for workers (``--workers 0``)
accepts them. A run that failed for a missing key is told to set it where the run
executes before a resume."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_server import Served, pythonpath, wait_status

import interlock
from interlock.support import Firer, NotFired

pytest.importorskip("fastapi")

NODES = '''
def intake(state):
    with open("executions.log", "a") as f:
        f.write("intake\\n")
    return {"ticket": "t-1"}
'''

AI = """\
workflow: ai
nodes:
  intake: sknodes:intake
  rca:
    agent: {provider: openai, model: gpt-test, prompt: "{{ ticket }}"}
edges:
  - {from: START, to: intake}
  - {from: intake, to: rca}
  - {from: rca, to: END}
"""

TALK = """\
workflow: talk
chat: assistant
nodes:
  assistant:
    agent: {provider: openai, model: gpt-test}
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "sknodes.py").write_text(NODES)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "ai.yaml").write_text(AI)
    monkeypatch.syspath_prepend(str(tmp_path))  # (the runs in this process)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_start_is_refused_with_the_clis_text_and_nothing_recorded(root: Path) -> None:
    served = Served(root)
    try:
        with served.client() as c:
            r = c.post("/api/workflows/ai/runs", json={"input": {}, "run_id": "k1"})
            assert r.status_code == 409, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            detail = r.json()["detail"]
            assert detail.startswith("the run was not started (nothing is recorded): an "
                                     "agent node it may reach has no API key in this "
                                     "server's environment")
            assert "flows/ai.yaml:5:5: node 'rca': no API key: $OPENAI_API_KEY is not " \
                   "set" in detail
            assert "restart it, or serve with --workers 0" in detail
            assert c.get("/api/runs/k1").status_code == 404
            assert c.get("/api/runs").json()["runs"] == []
    finally:
        served.stop()
    assert not (root / "executions.log").exists()  # intake did not run
    said = "".join(served.lines)
    assert "this server refuses its runs (409, nothing recorded)" in said
    assert "a run executed here fails when it reaches 'rca'" in said


def test_a_server_recording_runs_for_workers_accepts_them(root: Path) -> None:
    """It executes nothing, so its start-up warning does not say a run executed here
    fails (review 42, finding 4: it did); the pending run's ``status --server`` says
    when the server's resume would be refused."""
    served = Served(root, "--workers", "0")
    try:
        with served.client() as c:
            r = c.post("/api/workflows/ai/runs", json={"input": {}, "run_id": "k2"})
            assert r.status_code == 201, r.text
            assert r.json()["status"] == "PENDING"
        status = subprocess.run(
            [sys.executable, "-m", "interlock", "status", "k2", "--server", served.url],
            cwd=root, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": pythonpath(root)})
    finally:
        served.stop()
    said = "".join(served.lines)
    assert "records its runs for `interlock worker` processes" in said
    assert "a worker without it fails on a run when it reaches 'rca'" in said
    assert "executed here" not in said
    assert (f"have the server execute it with `interlock resume k2 --server {served.url}` "
            "(it refuses, 409, when an agent's API key the run needs is not set where it "
            "runs)") in status.stdout


def test_a_message_to_a_conversation_is_refused_and_not_recorded(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "flows" / "talk.yaml").write_text(TALK)
    store = f"sqlite:///{root / 'runs.db'}"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-here-only")  # started where the key was set
    started = interlock.load(str(root / "flows" / "talk.yaml")).run_sync(
        {}, store=store, run_id="c1")
    assert started.status == "WAITING_INPUT"
    monkeypatch.delenv("OPENAI_API_KEY")
    served = Served(root)
    try:
        with served.client() as c:
            before = c.get("/api/runs/c1").json()
            r = c.post("/api/runs/c1/messages", json={"text": "hello"})
            assert r.status_code == 409, r.text
            assert r.json()["detail"].startswith("the message was not taken (nothing is "
                                                 "recorded)")
            assert c.get("/api/runs/c1").json() == before
    finally:
        served.stop()


def test_a_failed_run_is_not_resumed_or_forked_here_and_its_hint_says_why(
        root: Path) -> None:
    """A run that failed at the agent for its key (executed elsewhere, or before this
    check): a resume or a fork through this server would fail the same way -- 409 --
    and ``status --server`` says to set the variable where the run executes."""
    store = f"sqlite:///{root / 'runs.db'}"
    failed = interlock.load(str(root / "flows" / "ai.yaml")).run_sync(
        {}, store=store, run_id="f1")
    assert failed.status == "FAILED"
    served = Served(root)
    try:
        with served.client() as c:
            before = c.get("/api/runs/f1").json()
            r = c.post("/api/runs/f1/resume", json={})
            assert r.status_code == 409, r.text
            assert r.json()["detail"].startswith("the resume was not started (nothing is "
                                                 "recorded)")
            r = c.post("/api/runs/f1/fork", json={"at": 2, "run_id": "f2"})
            assert r.status_code == 409 and "the fork was not started" in r.text
            assert c.get("/api/runs/f1").json() == before
            assert c.get("/api/runs/f2").status_code == 404
        status = subprocess.run(
            [sys.executable, "-m", "interlock", "status", "f1", "--server", served.url],
            cwd=root, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": pythonpath(root)})
    finally:
        served.stop()
    assert "the agent had no API key where the run executed: set $OPENAI_API_KEY" \
        in status.stdout + status.stderr
    assert "run the failed node again" not in status.stdout + status.stderr
    assert (root / "executions.log").read_text() == "intake\n"  # the first run's only


def test_a_trigger_of_such_a_workflow_logs_each_refused_firing(root: Path) -> None:
    (root / "flows" / "ai.yaml").write_text(AI + "triggers:\n  - {id: tick, every: 1s}\n")
    served = Served(root)
    try:
        deadline = time.monotonic() + 30
        while not any("was not fired" in line for line in served.lines):
            assert time.monotonic() < deadline, "".join(served.lines)
            time.sleep(0.05)  # (a line the server writes: nothing to wait on but it)
        with served.client() as c:
            assert c.get("/api/runs").json()["runs"] == []
    finally:
        served.stop()
    [line, *_] = [line for line in served.lines if "was not fired" in line]
    assert "trigger tick of workflow ai: its slot" in line
    assert "the run was not started (nothing is recorded)" in line
    assert not (root / "executions.log").exists()


def test_a_refused_firing_is_said_once_per_slot(caplog: pytest.LogCaptureFixture) -> None:
    spec = interlock.WorkflowSpec.model_validate(
        {"workflow": "w", "nodes": {"a": "m:a"}, "edges": [{"from": "START", "to": "a"}],
         "triggers": [{"id": "t", "every": "10s"}]})
    calls: list[str] = []

    async def start(workflow: str, run_id: str, data: object) -> None:
        calls.append(run_id)
        raise NotFired("no key here")

    async def main() -> None:
        firer = Firer({"w": spec}, start)
        t0 = 1_800_000_000.0
        for now in (t0, t0 + 1, t0 + 9):  # one slot: refused once, not again each tick
            assert await firer.tick(now) == []
        assert await firer.tick(t0 + 10) == []  # the next slot: refused again
        assert len(calls) == 2

    with caplog.at_level(logging.ERROR, logger="interlock.triggers"):
        asyncio.run(main())
    refused = [r.getMessage() for r in caplog.records if "was not fired" in r.getMessage()]
    assert len(refused) == 2 and refused[0].endswith(": no key here")


def test_interlock_mcp_refuses_too(root: Path) -> None:
    pytest.importorskip("mcp")
    from interlock.mcp import LocalRuns
    from interlock.support import NoKey

    async def main() -> None:
        store = interlock.open_store(f"sqlite:///{root / 'runs.db'}")
        try:
            runs = LocalRuns({"ai": interlock.load(str(root / "flows" / "ai.yaml"))}, store)
            with pytest.raises(NoKey, match="in the environment of `interlock mcp`"):
                await runs.start("ai", {}, None)  # type: ignore[arg-type]
            assert await store.list_runs() == []
        finally:
            await store.close()

    asyncio.run(main())


def test_a_run_failed_for_its_key_is_not_told_to_resume_as_it_is(root: Path) -> None:
    from interlock.cli._gate_hints import failed_hint

    result = interlock.load(str(root / "flows" / "ai.yaml")).run_sync({}, store="memory://")
    assert result.status == "FAILED"
    remote = failed_hint("k3", result.error, " --server http://h:1", remote=True)
    assert remote.startswith("the agent had no API key where the run executed: set "
                             "$OPENAI_API_KEY in the environment of the process that "
                             "executes it -- `interlock serve`")
    assert remote.endswith("then `interlock resume k3 --server http://h:1`")
    assert "run the failed node again" not in failed_hint("k3", result.error, "")


PASSED_NODES = '''
import os

def finish(state):
    if not os.path.exists("finish.ok"):
        raise RuntimeError("not yet")
    return {"done": True}
'''

# the agent on a branch the run did not take; `finish` fails until finish.ok exists
PASSED = """\
workflow: passed
nodes:
  intake: sknodes:intake
  rca:
    agent: {provider: openai, model: gpt-test, prompt: "{{ ticket }}"}
  finish: pknodes:finish
edges:
  - {from: START, to: intake}
  - {from: intake, to: rca, when: 'ticket == "never"'}
  - {from: intake, to: finish, otherwise: true}
  - {from: rca, to: END}
  - {from: finish, to: END}
"""


def test_a_resume_that_no_longer_reaches_the_agent_is_taken(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's resume counts only the agents the run may still reach, as a
    foreground ``interlock resume`` does: a run that failed past its agent's branch is
    resumed here without the key."""
    (root / "pknodes.py").write_text(PASSED_NODES)
    (root / "flows" / "passed.yaml").write_text(PASSED)
    store = f"sqlite:///{root / 'runs.db'}"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-here-only")
    failed = interlock.load(str(root / "flows" / "passed.yaml")).run_sync(
        {}, store=store, run_id="p1")
    monkeypatch.delenv("OPENAI_API_KEY")
    assert failed.status == "FAILED"
    (root / "finish.ok").write_text("")
    served = Served(root)
    try:
        with served.client() as c:
            r = c.post("/api/runs/p1/resume", json={})
            assert r.status_code == 200, r.text
            run = wait_status(c, "p1", "COMPLETED")
            assert run["state"]["done"] is True
    finally:
        served.stop()


def test_the_start_line_names_the_stores_file_and_a_new_one(root: Path) -> None:
    """``--store sqlite:///tmp/...`` (three slashes) is a path under the current folder:
    the start line and ``/api/health`` name the absolute file, the line says the store
    is new and names the four-slash URL of the file the path names read as absolute
    (review 42, finding 5: the server said nothing and served an empty store)."""
    (root / "flows" / "ai.yaml").unlink()
    real = root / "real.db"
    sqlite3.connect(real).close()  # a store at the absolute path
    rel = str(real).lstrip("/")
    made = root / rel
    served = Served(root, "--allow-empty", store=f"sqlite:///{rel}")
    try:
        with served.client() as c:
            assert c.get("/api/health").json()["store_file"] == str(made)
    finally:
        served.stop()
    assert (f"store: sqlite:///{rel} (file {made}; new: no store is there yet, the first "
            f"run recorded makes it; sqlite:///{real} is the absolute path)"
            ) in "".join(served.lines)
    again = Served(root, "--allow-empty", store=f"sqlite:///{real}")
    again.stop()
    assert f"store: sqlite:///{real} (file {real})\n" in "".join(again.lines)
