"""Records another process appends to a PostgreSQL store reach a server's event stream
through ``LISTEN``/``NOTIFY`` (each append notifies the run it grew), not at the server's
slow poll; and when the server's ``LISTEN`` connection is killed mid-stream, it listens
again and delivers what was committed meanwhile (issue 34)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_server import Served, project, pythonpath, serve  # noqa: F401
from test_store_conformance import pg_schema_url  # noqa: F401

import interlock

NODES = '''
import time
from pathlib import Path

def gate(state):
    Path("gate.started").write_text("1")
    while not Path("gate.release").exists():
        time.sleep(0.01)
    return {}

def step(state):
    time.sleep(0.02)
    return {"n": state.get("n", 0) + 1}
'''

STEPS = 15


def _flow(root: Path) -> None:
    (root / "livenodes.py").write_text(NODES)
    nodes = "\n".join(f"  s{i}: livenodes:step" for i in range(STEPS))
    edges = "\n".join(f"  - {{from: s{i - 1}, to: s{i}}}" for i in range(1, STEPS))
    (root / "flows" / "live.yaml").write_text(
        f"workflow: live\nnodes:\n  gate: livenodes:gate\n{nodes}\nedges:\n"
        f"  - {{from: START, to: gate}}\n  - {{from: gate, to: s0}}\n{edges}\n"
        f"  - {{from: s{STEPS - 1}, to: END}}\n")


@pytest.fixture
def cli_run(project: Path, pg_schema_url: str) -> Iterator[Callable[[str], None]]:  # noqa: F811
    """Starts ``interlock run flows/live.yaml`` on the PostgreSQL store in another
    process and returns once its gate node runs (its first records committed)."""
    _flow(project)
    procs: list[subprocess.Popen[str]] = []

    def start(run_id: str) -> None:
        cli = subprocess.Popen(
            [sys.executable, "-m", "interlock", "run", "flows/live.yaml", "--run-id", run_id,
             "--store", pg_schema_url], cwd=project,
            env={**os.environ, "PYTHONPATH": pythonpath(project)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(cli)
        while not (project / "gate.started").exists():  # (no event across processes
            assert cli.poll() is None, cli.communicate()[1]  # to wait on)
            time.sleep(0.01)

    yield start
    for cli in procs:
        try:
            assert cli.wait(60) == 0, cli.communicate()[1]
        finally:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
            assert cli.stderr is not None
            cli.stderr.close()


def _stream(client: Any, run_id: str, before: int, release: Path,
            during: Callable[[], None] = lambda: None, at: int = 0) -> list[int]:
    """The seqs of the run's events until the stream ends. ``release`` is written once
    the stream has sent the ``before`` records committed before it opened (the rest are
    committed while it waits); ``during`` is called once the seq ``at`` has arrived. A
    client that hears nothing for 10 s gives up: the server's poll is once a minute and
    its keepalive every 15 s, so only a notification delivers in time."""
    seqs: list[int] = []
    with client.stream("GET", f"/api/runs/{run_id}/events", timeout=10) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("id: "):
                seqs.append(int(line[4:]))
                if seqs[-1] == before:
                    time.sleep(0.3)  # the stream waits (nothing to wait on across
                    release.write_text("go")  # processes): the rest is committed after
                if seqs[-1] == at:
                    during()
    return seqs


def _check(seqs: list[int], run_id: str, store: str) -> None:
    trace = asyncio.run(interlock.trace(run_id, store=store))
    assert trace[-1]["type"] == "run.completed"
    assert seqs == [rec["seq"] for rec in trace]  # all of them, no gap, no duplicate
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_stream_follows_a_cli_run_on_postgres_live_with_a_slow_poll(
        project: Path, serve: Any, pg_schema_url: str,  # noqa: F811
        cli_run: Callable[[str], None]) -> None:
    """The server polls once a minute; the CLI run's ~35 records committed while the
    stream is open arrive by NOTIFY, in order, once each (on the old code the client
    gave up: nothing arrived before the keepalive)."""
    server: Served = serve("--poll", "60", store=pg_schema_url)
    cli_run("pg-1")
    before = len(asyncio.run(interlock.trace("pg-1", store=pg_schema_url)))
    with server.client() as c:
        seqs = _stream(c, "pg-1", before, project / "gate.release")
    assert len(seqs) > before + 2 * STEPS
    _check(seqs, "pg-1", pg_schema_url)


def _listeners(url: str) -> set[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE "
                            "'LISTEN interlock_records%'").fetchall()
    return {int(pid) for (pid,) in rows}


def test_the_listen_connection_killed_mid_stream_listens_again_and_loses_nothing(
        project: Path, serve: Any, pg_schema_url: str,  # noqa: F811
        cli_run: Callable[[str], None]) -> None:
    """``pg_terminate_backend`` on the server's LISTEN connection while the CLI run
    commits: the server connects again, wakes the stream (what was committed in
    between was told to no one), and every record is delivered once, in order."""
    import psycopg

    server: Served = serve("--poll", "60", store=pg_schema_url)
    cli_run("pg-2")
    before = len(asyncio.run(interlock.trace("pg-2", store=pg_schema_url)))
    killed: set[int] = set()

    def kill() -> None:
        killed.update(_listeners(pg_schema_url))
        assert killed, "the server has no LISTEN connection while its stream waits"
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            for pid in killed:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with server.client() as c:
        seqs = _stream(c, "pg-2", before, project / "gate.release", kill, at=before + 4)
    _check(seqs, "pg-2", pg_schema_url)
    deadline = time.monotonic() + 30
    while not _listeners(pg_schema_url) - killed:  # listening again (no event to wait on
        assert time.monotonic() < deadline, "the server did not LISTEN again"
        time.sleep(0.05)  # in another process)
