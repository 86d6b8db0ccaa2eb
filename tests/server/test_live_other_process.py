"""Records another process commits reach a server's event stream when the store's
change detector tells of them (SQLite: ``PRAGMA data_version``), not at the server's
slow poll; and when the detector misses, the slow poll still delivers (issue 34)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_server import Served, project, pythonpath, serve  # noqa: F401

import interlock
from interlock._store import _sqlite_watch
from interlock.server._hub import Hub
from interlock.server._reads import Polls


def test_a_stream_follows_a_cli_run_live_with_a_slow_poll(project: Path,  # noqa: F811
                                                          serve: Any) -> None:  # noqa: F811
    """The server polls once a minute: the records a run the CLI executes commits while
    the stream is open are delivered by the detector, in order, once each (on the old
    code only the keepalive's re-read, 15 s later, found them: the client gave up)."""
    server: Served = serve("--poll", "60")
    store = f"sqlite:///{project / 'runs.db'}"
    cli = subprocess.Popen(  # test_server's `slow` waits for slow.release
        [sys.executable, "-m", "interlock", "run", "flows/slow.yaml", "--run-id", "cli-1",
         "--store", store],
        cwd=project, env={**os.environ, "PYTHONPATH": pythonpath(project)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (project / "slow.started").exists():  # (no event across processes
            assert cli.poll() is None, cli.communicate()[1]  # to wait on)
            time.sleep(0.01)
        before = len(asyncio.run(interlock.trace("cli-1", store=store)))
        with server.client() as c:
            seqs = _stream(c, "cli-1", before, project / "slow.release")
        assert cli.wait(30) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        assert cli.stderr is not None
        cli.stderr.close()
    trace = asyncio.run(interlock.trace("cli-1", store=store))
    assert seqs == [rec["seq"] for rec in trace]  # all of them, no gap, no duplicate
    assert seqs == list(range(1, len(seqs) + 1))


def _stream(client: Any, run_id: str, before: int, release: Path) -> list[int]:
    """The seqs of the run's events until the stream ends (after the run's final
    record); ``release`` is written once the stream has sent the ``before`` records
    committed before it opened. A client that hears nothing for 10 s gives up (the
    server's keepalive comes every 15 s, its poll here once a minute: only the
    detector delivers the records in time)."""
    seqs: list[int] = []
    with client.stream("GET", f"/api/runs/{run_id}/events", timeout=10) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("id: "):
                seqs.append(int(line[4:]))
                if seqs[-1] == before:  # all that was committed before: once the
                    time.sleep(0.5)      # stream waits (nothing to wait on in another
                    release.write_text("go")  # process), the rest is committed
    return seqs


def test_the_slow_poll_delivers_what_the_detector_missed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector that sees nothing (here: it cannot read the version) leaves the
    followers to the slow poll: the record is still found."""
    asyncio.run(_missed(tmp_path, monkeypatch))


async def _missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite_watch.Watch, "_data_version", lambda self: None)
    store = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    other = interlock.open_store(f"sqlite:///{tmp_path / 'runs.db'}")  # "elsewhere"
    try:
        monkeypatch.syspath_prepend(str(tmp_path))
        await interlock.load(str(_one_node(tmp_path))).run({}, run_id="w", store=other)
        hub = Hub()
        polls = Polls(lambda: store, hub, 0.05, lambda run_id: False)
        with polls.following("w", 0):
            waiter = hub.waiter("w")
            await asyncio.wait_for(waiter.wait(), 30)  # woken by the slow poll
        assert polls.reads >= 1
        await polls.close()
    finally:
        await store.close()
        await other.close()


def _one_node(root: Path) -> Path:
    (root / "one_node.py").write_text("def go(state):\n    return {'ok': True}\n")
    flow = root / "one.yaml"
    flow.write_text("workflow: one\nnodes:\n  go: one_node:go\nedges:\n"
                    "  - {from: START, to: go}\n  - {from: go, to: END}\n")
    return flow
