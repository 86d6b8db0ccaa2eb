"""Store outages (issue 26): a worker and a trigger firer live through them.

- A PostgreSQL server restarted (``pg_ctl stop``/``start``) under one worker process
  mid-run: every run completes, without a fresh worker (the worker releases a run whose
  execution met a store error and claims it again after a back-off; it never refuses
  it for good).
- A trigger slot whose start fails for a few seconds (the store refuses the run's
  creation) is fired once, within the grace window; a poll's cursor advances only after
  its items' runs exist, and is kept in the store (a restarted firer goes on from it).
- A SQLite store on a full (tmpfs) disk recovers once space is freed: the error names
  the full disk, and the WAL is truncated to give its space back.

The store wrapper here (`Flaky`) is this file's own: it fails the calls named while a
flag is up.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import interlock

NODES = '''
import os, time

def _note(ctx, node):
    with open(os.environ["OUT_DIR"] + "/executions.log", "a") as f:
        f.write(f"{ctx.run_id} {node}\\n")

def step(state, ctx):
    _note(ctx, ctx.node)
    time.sleep(float(os.environ.get("OUT_NAP", "0.2")))
    return {"n": state["n"] + 1}
'''

CHAIN = '''
workflow: chain
input: [n]
nodes:
  a: outnodes:step
  b: outnodes:step
  c: outnodes:step
  d: outnodes:step
edges:
  - {from: START, to: a}
  - {from: a, to: b}
  - {from: b, to: c}
  - {from: c, to: d}
  - {from: d, to: END}
'''


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Postgres:
    """A throwaway PostgreSQL server of this test's own, which it stops and starts."""

    def __init__(self, bindir: Path) -> None:
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="interlock-outage-pg."))
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_pg:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run([*self.as_pg, str(self.bin / "initdb"), "-D", str(self.dir / "data"),
                        "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
                        "--no-sync"], check=True, capture_output=True)

    def start(self) -> None:
        subprocess.run(
            [*self.as_pg, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l",
             str(self.dir / "server.log"), "-w", "-t", "60", "-o",
             f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
             "-c synchronous_commit=off -c full_page_writes=off", "start"],
            check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([*self.as_pg, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"),
                        "-m", "fast", "-w", "-t", "60", "stop"], check=True,
                       capture_output=True)

    def remove(self) -> None:
        if (self.dir / "data" / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    pytest.importorskip("psycopg")
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): .ci/postgres.sh installs it")
    try:
        pg = Postgres(bindir)
    except (subprocess.CalledProcessError, OSError, LookupError) as exc:
        pytest.skip(f"cannot run a PostgreSQL server of this test's own here: {exc}")
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outnodes.py").write_text(NODES)
    (tmp_path / "chain.yaml").write_text(textwrap.dedent(CHAIN))
    (tmp_path / "executions.log").write_text("")
    monkeypatch.setenv("OUT_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


async def _statuses(url: str) -> dict[str, str]:
    async with interlock.open_store(url) as st:
        return {r.run_id: r.summary.status for r in await st.list_runs(limit=1000)}


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def test_a_worker_completes_every_run_across_a_postgres_restart(
        project: Path, postgres: Postgres) -> None:
    """One worker; the server is stopped for ~3 s while it executes runs, then started:
    every run completes, by that same worker, and each node ran at most twice (a visit
    interrupted by the outage runs again; a completed node never does)."""
    url = postgres.url
    wf = interlock.load("chain.yaml")
    ids = [f"r{i}" for i in range(8)]

    async def submit() -> None:
        async with interlock.open_store(url) as st:
            for rid in ids:
                await wf.submit({"n": 0}, store=st, run_id=rid)

    asyncio.run(submit())
    worker = subprocess.Popen(
        [sys.executable, "-m", "interlock", "worker", "--store", url, "--workflows",
         "chain.yaml", "--concurrency", "4", "--poll", "0.1", "--lease", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # mid-run: some node of some run has executed, no run is finished
        _wait("the worker's first nodes", lambda: (project / "executions.log").read_text(),
              60)
        postgres.stop()
        time.sleep(3)
        postgres.start()
        try:
            _wait("every run COMPLETED", lambda: set(asyncio.run(_statuses(url)).values())
                  == {"COMPLETED"}, 120)
        except AssertionError:
            print(asyncio.run(_statuses(url)))
            raise
        assert worker.poll() is None, "the worker exited"
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=60)
        print(out)
    for rid in ids:
        result = asyncio.run(interlock.status(rid, store=url))
        assert result.state["n"] == 4
        assert asyncio.run(interlock.verify(rid, store=url)).ok
