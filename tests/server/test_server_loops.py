"""A bad node cannot stall `interlock serve`: node bodies run on event loops of their
own, a watchdog names the node that blocks one, and its timeout is enforced (a real
server on a loopback port, as in test_server.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _harness import write_folder
from test_decision_race import store_urls
from test_server import GATED, NODES, Served, events

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

HOG_NODES = NODES + '''

async def hog(state):
    """Computes without ever awaiting until the test says so (at most 15 s)."""
    Path("hog.started").write_text("1")
    cap = time.monotonic() + 15
    while not Path("hog.release").exists() and time.monotonic() < cap:
        pass
    return {"hogged": True}
'''

HOG = '''
workflow: hog
nodes:
  hog: {call: snodes:hog, timeout: 1s}
edges:
  - {from: START, to: hog}
  - {from: hog, to: END}
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return write_folder(tmp_path, {"snodes": HOG_NODES}, {"hog": HOG, "gated": GATED})


def wait_for(what: Any, why: str) -> Any:
    """``what()`` once it is true (the server is another process: its files and its
    log are looked at again until then, for at most 30 s)."""
    import time

    end = time.monotonic() + 30
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {why}")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_node_that_blocks_its_loop_stalls_neither_the_api_nor_other_runs_and_times_out(
        project: Path, kind: str) -> None:
    """An async def node computing without awaiting, timeout 1s: it ended COMPLETED and
    held the whole server (health 7.9 s). Now, while it computes, health, reads and
    another run's decision are answered (the node only ends when the test releases it,
    after those answers); the watchdog names it in the log; it fails as timed out."""
    stores = store_urls(project)  # SQLite, and PostgreSQL when the tests have one
    if kind == "postgres" and len(stores) < 2:
        pytest.skip("INTERLOCK_TEST_POSTGRES is not set")
    # (a shared PostgreSQL may hold other tests' runs: this server takes none over)
    h1, g1 = (f"{name}-{os.getpid()}-{os.urandom(3).hex()}" for name in ("h1", "g1"))
    server = Served(project, "--workers", "2", "--no-take-over",
                    store=stores[kind == "postgres"])
    try:
        with server.client() as c:
            c.timeout = httpx.Timeout(20)
            assert c.post("/api/workflows/hog/runs", json={"run_id": h1}).status_code == 201
            wait_for((project / "hog.started").exists, "the hog node to start")

            # the API answers while the node holds its loop (it cannot end before the
            # test creates hog.release below)
            health = c.get("/api/health")
            assert health.status_code == 200 and health.json()["running"] == 1
            assert c.get(f"/api/runs/{h1}").json()["status"] == "RUNNING"
            assert c.get(f"/api/runs/{h1}/records").status_code == 200
            # another run starts, waits and is decided meanwhile, on a loop of its own
            assert c.post("/api/workflows/gated/runs",
                          json={"input": {"n": 1}, "run_id": g1}).status_code == 201
            for _ in events(c, g1, until="run.waiting"):
                pass
            decided = c.post(f"/api/runs/{g1}/decisions",
                             json={"decision": "approve", "by": "alice"})
            assert decided.status_code == 200, decided.text
            for _ in events(c, g1, until="run.completed"):
                pass
            assert c.get(f"/api/runs/{g1}").json()["state"]["last"] == 4
            assert not (project / "hog.release").exists()

            # the watchdog names the node and its run
            line = wait_for(lambda: next((ln for ln in server.lines
                                          if "blocked its event loop" in ln), None),
                            "the watchdog's warning")
            assert f"node 'hog' of run {h1}" in line, line
            assert "make it a sync def" in line, line

            (project / "hog.release").write_text("1")
            last = list(events(c, h1, until="run.failed"))[-1]
            assert last["event"] == "run.failed", last
            run = c.get(f"/api/runs/{h1}").json()
            assert run["status"] == "FAILED", run
            assert "timed out after 1s" in run["error"]["message"], run["error"]
            assert "hogged" not in run["state"], run["state"]
            records = c.get(f"/api/runs/{h1}/records").json()
            assert "node.completed" not in [r["type"] for r in records]
            # the loop turns again once the body has returned
            wait_for(lambda: any("turns again" in ln for ln in server.lines),
                     "the watchdog to see the loop turn again")
    finally:
        (project / "hog.release").write_text("1")
        server.stop()


def test_sigterm_while_a_node_blocks_its_loop_ends_the_server_and_the_run_is_taken_over(
        project: Path) -> None:
    """The drain cannot cancel a body that holds its loop: the server still ends (the
    run left to its lease), and the next start takes the run over and finishes it."""
    server = Served(project, "--drain", "0.5")
    try:
        with server.client() as c:
            assert c.post("/api/workflows/hog/runs", json={"run_id": "h2"}).status_code == 201
            wait_for((project / "hog.started").exists, "the hog node to start")
        server.stop()  # (waits for the process to end)
        assert any("not stopped" in ln and "node 'hog' of run h2" in ln
                   for ln in server.lines), "".join(server.lines)
    finally:
        (project / "hog.release").write_text("1")
        server.stop()
    again = Served(project)
    try:
        with again.client() as c:
            for _ in events(c, "h2", until="run.completed"):
                pass
            run = c.get("/api/runs/h2").json()
            assert run["status"] == "COMPLETED" and run["state"]["hogged"] is True, run
    finally:
        again.stop()


def test_a_memory_store_server_still_executes_runs(project: Path) -> None:
    """memory:// is one process's dictionaries: its runs stay on the API's loop."""
    server = Served(project, store="memory://")
    try:
        with server.client() as c:
            assert c.post("/api/workflows/gated/runs",
                          json={"input": {"n": 2}, "run_id": "m1"}).status_code == 201
            for _ in events(c, "m1", until="run.waiting"):
                pass
            decided = c.post("/api/runs/m1/decisions", json={"decision": "approve",
                                                             "by": "alice"})
            assert decided.status_code == 200, decided.text
            for _ in events(c, "m1", until="run.completed"):
                pass
            assert c.get("/api/runs/m1").json()["state"]["last"] == 6
    finally:
        server.stop()
