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
import contextlib
import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_store_conformance import _url_for, pg_schema_url  # noqa: F401 - a fixture

import interlock
from interlock._errors import LogError
from interlock._store import RunNotFound, RunRow, Store, StoreError
from interlock._worker._triggers import GRACE, Firer, cursor_name, key_run_id, slot_run_id
from interlock.support import Worker

NODES = '''
import asyncio, json, os, time

def _note(ctx, node):
    with open(os.environ["OUT_DIR"] + "/executions.log", "a") as f:
        f.write(f"{ctx.run_id} {node}\\n")

def step(state, ctx):
    _note(ctx, ctx.node)
    time.sleep(float(os.environ.get("OUT_NAP", "0.2")))
    return {"n": state["n"] + 1}

def _effect(run_id, node):
    with open(os.environ["OUT_DIR"] + "/effects.log", "a") as f:
        f.write(f"{run_id} {node}\\n")
    return True

async def paying(state, ctx):
    """A node with a side effect: run once per visit however the store fails."""
    _note(ctx, ctx.node)
    await asyncio.sleep(float(os.environ.get("OUT_NAP", "0.2")))
    await ctx.once("pay", _effect, ctx.run_id, ctx.node)
    return {"n": state["n"] + 1}

def source(ctx):
    """A poll: the items from the cursor (0 at first) to the number in ``items``."""
    d = os.environ["OUT_DIR"]
    with open(d + "/cursors.log", "a") as f:
        f.write(json.dumps(ctx.cursor) + "\\n")
    with open(d + "/items") as f:
        upto = int(f.read())
    return {"items": [{"key": f"k{i}", "input": {"n": i}} for i in range(ctx.cursor or 0, upto)],
            "cursor": upto}
'''

TRIGGERED = '''
workflow: triggered
input: [n]
nodes:
  a: outnodes:step
edges:
  - {from: START, to: a}
  - {from: a, to: END}
triggers:
  - {every: 10s, id: ten, input: {n: 0}}
  - {poll: 'outnodes:source', every: 10s, id: src}
'''

CHAIN = '''
workflow: chain
input: [n]
nodes:
  a: outnodes:step
  b: outnodes:paying
  c: outnodes:step
  d: outnodes:paying
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
    (tmp_path / "triggered.yaml").write_text(textwrap.dedent(TRIGGERED))
    (tmp_path / "items").write_text("0")
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
    # the log names the cause, and the runs were retried rather than refused
    assert "the server is unreachable" in out
    assert "could not be executed here" not in out
    runs = Counter((project / "executions.log").read_text().splitlines())
    assert set(runs) == {f"{rid} {node}" for rid in ids for node in "abcd"}
    assert max(runs.values()) <= 2, runs  # only a visit the outage interrupted ran again
    # and no side effect ran twice: a ctx.once result whose commit met the outage was
    # committed by the journal's retry, not run again
    effects = Counter((project / "effects.log").read_text().splitlines())
    assert effects == Counter({f"{rid} {node}": 1 for rid in ids for node in "bd"}), effects
    for rid in ids:
        result = asyncio.run(interlock.status(rid, store=url))
        assert result.state["n"] == 4
        assert asyncio.run(interlock.verify(rid, store=url)).ok


# -- triggers ----------------------------------------------------------------------------

T0 = 1_796_000_000.0  # a multiple of 10 s: a slot of the 10 s triggers


class Down:
    """Makes a store's ``create_run`` fail (as an unreachable store's does) while up, or
    for the run ids given."""

    def __init__(self, st: Store) -> None:
        self.down = False
        self.refuse: set[str] = set()
        self.calls = 0
        inner = st.create_run

        async def create_run(row: RunRow, entries: list[Any]) -> None:
            self.calls += 1
            if self.down or row.run_id in self.refuse:
                raise StoreError(f"cannot connect to the store (test: down, run {row.run_id})")
            await inner(row, entries)

        st.create_run = create_run  # type: ignore[method-assign]


def _firer(st: Store) -> Firer:
    wf = interlock.load("triggered.yaml")

    async def start(workflow: str, run_id: str, data: dict[str, Any]) -> Any:
        return await wf.submit(data, store=st, run_id=run_id)

    return Firer({"triggered": wf.spec}, start, st)


async def _tick(firer: Firer, at: float) -> list[str]:
    try:
        return await firer.tick(at)
    except StoreError:  # (f074fc7's tick raised the store's error)
        return []


def test_a_slot_whose_start_fails_for_3s_is_fired_once_within_the_grace(
        project: Path) -> None:
    """The store refuses the slot's run for 3 s (ticks every second): the slot is fired
    at the first tick after, once. f074fc7 marked the slot fired before starting it: the
    slot was lost."""

    async def main() -> None:
        async with interlock.open_store(f"sqlite:///{project}/runs.db") as st:
            down = Down(st)
            firer = _firer(st)
            ten = firer.workflows["triggered"].triggers[0]
            down.down = True
            for i in range(3):
                assert await _tick(firer, T0 + 0.5 + i) == []
            assert down.calls >= 3, "every tick tried the slot again"
            down.down = False
            rid = slot_run_id("triggered", ten, T0)
            assert await _tick(firer, T0 + 3.5) == [rid]
            assert await _tick(firer, T0 + 4.5) == []
            runs = [r.run_id for r in await st.list_runs(limit=100)]
            assert runs.count(rid) == 1 and len([r for r in runs if ".trigger-ten." in r]) == 1
            # a slot still failing at the end of the grace window is given up (as a slot
            # missed by a process that was not running): the next one fires
            down.down = True
            assert await _tick(firer, T0 + 10.5) == []
            down.down = False
            later = T0 + 10 + GRACE + 1
            assert await _tick(firer, later) == [slot_run_id("triggered", ten, later - 1)]

    asyncio.run(main())


def test_a_polls_cursor_moves_on_only_once_its_runs_exist_and_is_kept_in_the_store(
        project: Path) -> None:
    """The poll's second item cannot be started (the store refuses it): the cursor stays,
    and the next tick starts it. A new firer on the same store (a restarted worker) polls
    from the stored cursor, not from None (f074fc7 kept it in the process only)."""
    url = f"sqlite:///{project}/runs.db"
    (project / "items").write_text("2")

    def cursors() -> list[Any]:
        return [json.loads(line) for line in
                (project / "cursors.log").read_text().splitlines()]

    async def first() -> None:
        async with interlock.open_store(url) as st:
            down = Down(st)
            firer = _firer(st)
            src = firer.workflows["triggered"].triggers[1]
            down.refuse = {key_run_id("triggered", src, "k1")}
            await _tick(firer, T0 + 0.5)
            assert (await st.get_run(key_run_id("triggered", src, "k0"))).workflow
            assert await st.get_cursor(cursor_name("triggered", src)) is None
            down.refuse = set()
            got = await _tick(firer, T0 + 1.5)  # the same slot, again: k1 now
            assert got == [key_run_id("triggered", src, "k1")]
            assert cursors() == [None, None]  # the cursor did not move on without k1
            assert await st.get_cursor(cursor_name("triggered", src)) == "2"

    asyncio.run(first())
    (project / "items").write_text("3")

    async def restarted() -> None:
        async with interlock.open_store(url) as st:
            firer = _firer(st)
            src = firer.workflows["triggered"].triggers[1]
            got = await _tick(firer, T0 + 10.5)
            assert cursors()[-1] == 2, "a new firer polls from the cursor in the store"
            assert [r for r in got if ".trigger-src." in r] == \
                [key_run_id("triggered", src, "k2")]
            assert await st.get_cursor(cursor_name("triggered", src)) == "3"

    asyncio.run(restarted())


# -- cursors in the store ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_a_store_keeps_cursors_by_name_and_one_opened_later_reads_them(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = _url_for(kind, request, tmp_path)

    async def main() -> None:
        st = interlock.open_store(url)
        try:
            assert await st.get_cursor("wf.trigger-a") is None
            await st.set_cursor("wf.trigger-a", '{"after": 1}')
            await st.set_cursor("wf.trigger-b", "7")
            await st.set_cursor("wf.trigger-a", '{"after": 2}')  # replaces
            assert await st.get_cursor("wf.trigger-a") == '{"after": 2}'
            assert await st.get_cursor("wf.trigger-b") == "7"
        finally:
            await st.close()
        if kind == "memory":
            return
        async with interlock.open_store(url) as again:  # another process, or a restart
            assert await again.get_cursor("wf.trigger-a") == '{"after": 2}'

    asyncio.run(main())


def test_a_sqlite_file_without_the_cursors_table_gets_it_when_opened(tmp_path: Path) -> None:
    """A version-2 file written before cursors were kept (f074fc7) gains the table on its
    next open; nothing else changes, and its version stays 2."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"

    async def make() -> None:
        async with interlock.open_store(url) as st:
            await st.set_cursor("x", "0")

    asyncio.run(make())
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE cursors")
        version = dict(conn.execute("SELECT key, value FROM interlock_meta"))["version"]

    async def use() -> None:
        async with interlock.open_store(url) as st:
            await st.set_cursor("c", "1")
            assert await st.get_cursor("c") == "1"

    asyncio.run(use())
    with sqlite3.connect(path) as conn:
        assert dict(conn.execute("SELECT key, value FROM interlock_meta"))["version"] == version


def test_a_postgres_store_without_the_cursors_table_gets_it_when_opened(
        request: pytest.FixtureRequest) -> None:
    pg_url: str = request.getfixturevalue("pg_schema_url")
    import psycopg

    async def make() -> None:
        async with interlock.open_store(pg_url) as st:
            await st.list_runs()

    asyncio.run(make())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE cursors")

    async def use() -> None:
        async with interlock.open_store(pg_url) as st:
            await st.set_cursor("c", "1")
            assert await st.get_cursor("c") == "1"

    asyncio.run(use())


# -- a full SQLite disk ------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of this test's own (root only), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not shutil.which("mount") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (mount -t tmpfs)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _threads_giving_space_back(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the SQLite store gives its WAL's space back on, as it
    does (a checkpoint, with fsyncs)."""
    from interlock._store._sqlite import SQLiteStore

    gave_back = SQLiteStore._give_space_back
    where: list[str] = []

    def spy(self: SQLiteStore, *args: Any, **kw: Any) -> None:
        where.append(threading.current_thread().name)
        gave_back(self, *args, **kw)

    monkeypatch.setattr(SQLiteStore, "_give_space_back", spy)
    return where


def test_a_full_sqlite_disk_recovers_once_1_mib_is_freed(
        small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose WAL has grown to ~2.5 MB, on a disk filled up: runs fail ("the disk
    is full"). 1 MiB freed: the store checkpoints its WAL into the file and truncates it
    before any other write (the space freed goes to that, not to the WAL), which gives
    the WAL's megabytes back: 40 new runs all complete, and so do the runs the full
    disk stopped, resumed. On f074fc7 the WAL took the freed MiB at once and the writes
    failed again (9 runs of 40 completed)."""
    url = f"sqlite:///{small_disk}/runs.db"
    where = _threads_giving_space_back(monkeypatch)

    async def blob(state: dict[str, Any]) -> dict[str, Any]:
        return {"blob": os.urandom(1000).hex(), "n": state["n"] + 1}

    wf = interlock.Workflow("fill", input=["n"])
    for name in ("a", "b", "c"):
        wf.node(name, blob)
    wf.edge("START", "a")
    wf.edge("a", "b")
    wf.edge("b", "c")
    wf.edge("c", "END")
    said = _Said()
    logging.getLogger("interlock").addHandler(said)

    async def main() -> None:
        async with interlock.open_store(url) as st:
            # a WAL of ~2.5 MB, all of it in the file (as after a checkpoint in an idle
            # moment; its size bounds what the disk can take before a write fails)
            for i in range(60):
                await wf.run({"n": 0}, store=st, run_id=f"warm{i}")
            conn = sqlite3.connect(small_disk / "runs.db")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            for i in range(25):
                await wf.run({"n": 0}, store=st, run_id=f"more{i}")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            conn.close()
            assert (small_disk / "runs.db-wal").stat().st_size > 2 << 20
            ballast = 0
            try:
                while True:  # fill the disk
                    with open(small_disk / f"ballast-{ballast:04d}", "wb") as f:
                        ballast += 1
                        f.write(b"\0" * (256 << 10))
            except OSError:
                pass
            assert ballast > 8
            stopped: list[str] = []
            for i in range(400):  # until 3 runs failed (the WAL, reset, holds ~25)
                try:
                    await wf.run({"n": 0}, store=st, run_id=f"full{i}")
                except StoreError as exc:
                    assert "the disk is full" in str(exc)
                    stopped.append(f"full{i}")
                    if len(stopped) == 3:
                        break
            else:
                raise AssertionError("no run failed on the full disk")
            for j in range(4):  # free 1 MiB
                (small_disk / f"ballast-{j:04d}").unlink()
            completed = 0
            for i in range(40):
                with contextlib.suppress(StoreError):
                    result = await wf.run({"n": 0}, store=st, run_id=f"after{i}")
                    completed += result.status == "COMPLETED"
            assert completed == 40, f"{completed} runs of 40 completed after 1 MiB was freed"
            # the store's checkpointer thread lived through it (one that fails for want
            # of space goes on; here it may not have been asked for a checkpoint then)
            checkpointer = getattr(st, "_checkpointer", None)
            assert checkpointer is not None and checkpointer.failed is None
            resumed = 0
            for rid in stopped:  # (their lease is this process's: taken by force)
                try:
                    await st.get_run(rid)
                except RunNotFound:
                    continue  # its creation was refused: nothing of it was stored
                resumed += 1
                result = await interlock.resume(rid, store=st, workflow=wf, force=True)
                assert result.status == "COMPLETED" and result.state["n"] == 3
                assert (await interlock.verify(rid, store=st)).ok
            print(f"{resumed} of {len(stopped)} runs stopped by the full disk resumed")
        assert any("truncated, giving back" in line for line in said.lines), said.lines
        # a checkpoint's fsyncs never on the event loop's thread, even when the write
        # that found the disk full was made there (`_sqlite_inline`)
        assert where and not [t for t in where if not t.startswith("interlock-sqlite")]

    try:
        asyncio.run(main())
    finally:
        logging.getLogger("interlock").removeHandler(said)


def test_a_worker_fires_a_slot_the_store_was_down_for_once_it_is_back(
        project: Path, postgres: Postgres) -> None:
    """A worker firing an ``every: 5s`` trigger; PostgreSQL is stopped 1 s before a slot
    and started 3 s later: the slot's run is created then, once, well within the grace
    window. f074fc7 marked the slot fired before its start failed: it was lost."""
    url = postgres.url
    (project / "five.yaml").write_text(
        textwrap.dedent(TRIGGERED).replace("workflow: triggered", "workflow: five")
        .replace("every: 10s, id: ten", "every: 5s, id: five"))
    worker = subprocess.Popen(
        [sys.executable, "-m", "interlock", "worker", "--store", url, "--workflows",
         "five.yaml", "--poll", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    spec = interlock.load("five.yaml").spec
    five = next(t for t in spec.triggers if t.id == "five")
    try:
        _wait("the worker's first trigger run", lambda: any(
            ".trigger-five." in r for r in asyncio.run(_statuses(url))), 60)
        slot = (int(time.time()) // 5 + 1) * 5.0
        if slot - time.time() < 1.5:
            slot += 5
        time.sleep(slot - 1 - time.time())
        postgres.stop()  # down from 1 s before the slot ...
        time.sleep(3)
        postgres.start()  # ... to 2 s after it
        rid = slot_run_id("five", five, slot)
        statuses = _wait(f"run {rid}", lambda: (lambda s: s if rid in s else None)(
            asyncio.run(_statuses(url))), 30)
        assert statuses[rid] in ("PENDING", "RUNNING", "COMPLETED")
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=60)
        print(out)

    async def created() -> float:
        async with interlock.open_store(url) as st:
            return (await st.get_run(rid)).created_at

    late = asyncio.run(created()) - slot
    assert 2 <= late < GRACE, f"the slot's run was created {late:.1f}s after the slot"
    assert "firing its slot" in out and "tried again at the next tick" in out


# -- a worker's refusals ----------------------------------------------------------------


def _one_node() -> interlock.Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    wf = interlock.Workflow("one", input=["n"])
    wf.node("a", inc)
    wf.edge("START", "a")
    wf.edge("a", "END")
    return wf


async def _until_completed(st: Store, run_id: str, seconds: float) -> str:
    for _ in range(int(seconds / 0.05)):
        status = (await st.get_run(run_id)).summary.status
        if status == "COMPLETED":
            return status
        await asyncio.sleep(0.05)
    return status


@pytest.mark.parametrize("fails", ["get_run", "append"])
def test_a_worker_releases_a_run_after_a_store_error_and_executes_it_again(
        tmp_path: Path, fails: str) -> None:
    """The store fails once (the worker's first read of the run it claimed, or the run's
    first append): the claim is given up and the same worker executes the run again
    after a back-off. f074fc7 held the claim after a failed read (for the whole lease:
    30 s here), and refused the run for ever after a failed append."""
    wf = _one_node()

    async def main() -> None:
        async with interlock.open_store(f"sqlite:///{tmp_path}/runs.db") as st:
            await wf.submit({"n": 1}, store=st, run_id="r1")
            real = getattr(st, fails)
            calls = 0

            async def once(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls == 1:
                    raise StoreError("the store is unreachable (test)")
                return await real(*args, **kwargs)

            setattr(st, fails, once)
            worker = Worker(st, workflows={"one": wf}, poll=0.05, lease=30)
            task = asyncio.create_task(worker.run())
            try:
                async with interlock.open_store(f"sqlite:///{tmp_path}/runs.db") as look:
                    assert await _until_completed(look, "r1", 10) == "COMPLETED"
            finally:
                worker.stop()
                await task
            assert calls >= 2 and "r1" not in worker.refused
            assert (await interlock.status("r1", store=st)).state == {"n": 2}

    asyncio.run(main())


def test_a_worker_refuses_a_run_whose_log_does_not_verify_instead_of_retrying_it(
        tmp_path: Path) -> None:
    """A `LogError` (here: the stored definition changed after the run started) is a
    `StoreError` that no retry cures: the worker refuses the run -- it stays as it is,
    for `interlock verify` -- and does not claim it again at every back-off."""
    wf = _one_node()
    db = tmp_path / "runs.db"

    async def main() -> None:
        async with interlock.open_store(f"sqlite:///{db}") as st:
            await wf.submit({"n": 1}, store=st, run_id="r1")
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            (text,) = con.execute("SELECT definition FROM run_specs").fetchone()
            changed = json.loads(text)
            changed["description"] = "changed behind the run's back"
            con.execute("UPDATE run_specs SET definition = ?", (json.dumps(changed),))
        async with interlock.open_store(f"sqlite:///{db}") as st:
            claims = 0
            real = st.claim_next

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal claims
                got = await real(*args, **kwargs)
                claims += got is not None
                return got

            st.claim_next = counted  # type: ignore[method-assign]
            worker = Worker(st, workflows={"one": wf}, poll=0.05, lease=30)
            task = asyncio.create_task(worker.run())
            try:
                for _ in range(400):
                    if "r1" in worker.refused.current():
                        break
                    await asyncio.sleep(0.025)
                await asyncio.sleep(1.2)  # two back-offs' worth: no claim again
            finally:
                worker.stop()
                await task
            assert "r1" in worker.refused.current() and claims == 1
            with pytest.raises(LogError, match="definition"):
                await interlock.status("r1", store=st)

    asyncio.run(main())


def test_a_workers_refusals_are_bounded_and_expire() -> None:
    from interlock._worker._workers import _Refusals

    refused = _Refusals(3, 600)
    for rid in ("a", "b", "c", "d"):
        refused.add(rid)
    assert refused.current() == {"b", "c", "d"}  # the oldest forgotten first
    refused.add("b")  # refused again: the newest now
    refused.add("e")
    assert refused.current() == {"b", "d", "e"}
    refused.add("f", 0)  # for no time at all
    assert "f" not in refused and len(refused) == 2


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_an_append_after_a_gap_says_so_not_another_writer(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """An append whose first record is past the log's end (the append before it failed:
    a full disk, an outage) is refused saying the records before it were never stored;
    f074fc7 said "another writer got there first", and there was none. A record that is
    taken still says that."""
    url = _url_for(kind, request, tmp_path)
    wf = _one_node()

    async def main() -> None:
        st = interlock.open_store(url)
        try:
            await wf.run({"n": 1}, store=st, run_id="g1")
            row = await st.get_run("g1")
            last = (await st.entries("g1"))[-1]
            with pytest.raises(StoreError) as gap:
                await st.append("g1", [last._replace(seq=last.seq + 2)], row.summary)
            assert "never stored" in str(gap.value)
            assert "another writer" not in str(gap.value)
            with pytest.raises(StoreError) as taken:
                await st.append("g1", [last], row.summary)
            assert "another writer got there first" in str(taken.value)
        finally:
            await st.close()

    asyncio.run(main())
