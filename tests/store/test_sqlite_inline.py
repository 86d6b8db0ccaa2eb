"""The SQLite store's writes on the event loop's thread when its writer is idle
(`interlock._store._sqlite_inline`): a lone run commits there, without the hop to the
writer thread; concurrent runs still share the writer's group commits; a lock held by
another process is waited for on the thread, never on the loop; a refused write fails
exactly as it does on the thread; several event loops share one store; a process killed
amid inline commits loses no committed completion."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_store_conformance import claimed, log, new_row, summary_of

import interlock
from interlock._log import LogWriter
from interlock._store import ClaimLost, ConflictError, RunNotFound, open_store
from interlock._store._sqlite import SQLiteStore

REPO = Path(interlock.__file__).resolve().parent.parent


def chain(n: int, name: str = "inline-chain") -> interlock.Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state["i"] + 1}

    wf = interlock.Workflow(name)
    names = [f"n{k}" for k in range(n)]
    for node in names:
        wf.node(node, inc)
    wf.edge("START", names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    wf.edge(names[-1], "END")
    return wf


@contextlib.contextmanager
def batches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every transaction of writes the SQLite store commits: the thread it ran on and how
    many writes it held."""
    seen: list[tuple[str, int]] = []
    inner = SQLiteStore._write_batch

    def spy(self: SQLiteStore, batch: list[Any]) -> Any:
        seen.append((threading.current_thread().name, len(batch)))
        return inner(self, batch)

    monkeypatch.setattr(SQLiteStore, "_write_batch", spy)
    yield seen


def test_a_lone_run_commits_on_its_loops_thread_and_concurrent_runs_share_group_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = chain(20)

    async def main() -> None:
        store = open_store(url)
        try:
            with batches(monkeypatch) as seen:
                result = await wf.run({"i": 0}, store=store)
                assert result.status == "COMPLETED" and result.state["i"] == 20
                here = threading.current_thread().name
                # the run's first write opens the file, on the writer thread; after it,
                # nothing else being queued, every commit is made right here
                lone = seen[1:]
                assert len(lone) >= 20 and all(t == here for t, _ in lone), seen
                seen.clear()
                results = await asyncio.gather(*(wf.run({"i": 0}, store=store)
                                                 for _ in range(30)))
                assert all(r.status == "COMPLETED" and r.state["i"] == 20 for r in results)
                grouped = [n for t, n in seen if t.startswith("interlock-sqlite") and n > 1]
                assert grouped, seen  # the writer still commits concurrent runs together
                for r in [result, *results]:
                    assert (await interlock.verify(r.run_id, store=store)).ok
        finally:
            await store.close()

    asyncio.run(main())


HOLDER = r"""
import select, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # the file's write lock, until told to let go
print("held", flush=True)
told, _, _ = select.select([sys.stdin], [], [], 10)
conn.execute("COMMIT")
print("released" if told else "never told", flush=True)
sys.exit(0 if told else 1)
"""


def test_with_an_fsync_per_commit_a_lone_runs_writes_stay_on_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``synchronous=full`` waits for the disk at every commit: never on the event loop."""
    wf = chain(5)

    async def main() -> None:
        with batches(monkeypatch) as seen:
            result = await wf.run({"i": 0},
                                  store=f"sqlite:///{tmp_path / 'runs.db'}?synchronous=full")
        assert result.status == "COMPLETED"
        assert len(seen) >= 5 and all(t.startswith("interlock-sqlite") for t, _ in seen), seen

    asyncio.run(main())


def test_a_write_lock_held_by_another_process_is_waited_for_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock is let go when a timer on the event loop says so: a write that waited for
    it on the loop (busy_timeout 30 s) would hold that timer back until the holder gave
    up on being told (10 s), and then be made on the loop."""
    db = tmp_path / "runs.db"
    tried: list[bool] = []
    inner = SQLiteStore._write_here

    def spy(self: SQLiteStore, *args: Any) -> Any:
        done = inner(self, *args)
        tried.append(done is not None)
        return done

    monkeypatch.setattr(SQLiteStore, "_write_here", spy)

    async def main() -> None:
        store = open_store(f"sqlite:///{db}?busy_timeout=30000")
        try:
            row, w, entries = new_row()
            await store.create_run(row, entries)  # opens the file
            holder = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLDER, str(db), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE)
            assert holder.stdin is not None and holder.stdout is not None
            assert await holder.stdout.readline() == b"held\n"
            await asyncio.sleep(0.05)  # (nothing else ready on the loop: an inline try)
            tried.clear()
            let_go = asyncio.get_running_loop().call_later(
                0.3, holder.stdin.write, b"go\n")
            w, more = log(2, w)
            await store.append(row.run_id, more, summary_of(w))
            assert tried == [False]  # tried here, found the lock held, made on the thread
            assert await holder.stdout.readline() == b"released\n"
            let_go.cancel()
            assert await holder.wait() == 0
            assert await store.entries(row.run_id) == entries + more
        finally:
            await store.close()

    asyncio.run(main())


def test_a_refused_write_fails_on_the_loop_exactly_as_on_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same refused appends (a forked seq, a stale claim, a run that is not there),
    once made inline and once on the thread (something else ready on the loop): the same
    error, the same words, nothing stored either way; the writes after them go in."""
    seen: list[str] = []

    async def main() -> None:
        store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        try:
            row, w, entries = new_row()
            await store.create_run(row, entries)
            mine = await claimed(store, row.run_id, "a:1:x")
            await store.claim(row.run_id, "b:2:y", 60, force=True)
            fork = LogWriter(entries[0].seq, entries[0].hash)
            _, forked = log(2, fork, node="fork")
            _, late = log(2, LogWriter(w.seq, w.hash))
            refused: list[tuple[Callable[[], Any], type[Exception]]] = [
                (lambda: store.append(row.run_id, forked, summary_of(fork)), ConflictError),
                (lambda: store.append(row.run_id, late, summary_of(w), claim=mine),
                 ClaimLost),
                (lambda: store.append("no-such-run", late, summary_of(w)), RunNotFound)]
            for make, kind in refused:
                errors = []
                for busy_loop in (False, True):
                    if busy_loop:  # a callback ready: the write goes to the thread
                        asyncio.get_running_loop().call_soon(lambda: None)
                    with pytest.raises(kind) as err:
                        await make()
                    errors.append((type(err.value), str(err.value)))
                assert errors[0] == errors[1]
            assert await store.entries(row.run_id) == entries  # nothing of them stored
            theirs = await claimed(store, row.run_id, "c:3:z", force=True)
            await store.append(row.run_id, late, summary_of(w), claim=theirs)
            assert await store.entries(row.run_id) == entries + late
        finally:
            await store.close()

    with batches(monkeypatch) as spied:
        asyncio.run(main())
        seen = [t for t, _ in spied]
    here = threading.current_thread().name
    assert here in seen and any(t.startswith("interlock-sqlite") for t in seen)


def test_runs_on_several_event_loops_share_one_store_and_every_log_verifies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the server's run loops do: four threads, each with an event loop of its own
    running runs one after another on one store object -- each loop idle, so each tries
    its writes inline, and the one connection is lent to one thread at a time."""
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    wf = chain(8)
    ids: list[str] = []
    failures: list[BaseException] = []

    def loop_thread() -> None:
        async def runs() -> None:
            for _ in range(12):
                result = await wf.run({"i": 0}, store=store)
                assert result.status == "COMPLETED" and result.state["i"] == 8, result.error
                ids.append(result.run_id)
        try:
            asyncio.run(runs())
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    with batches(monkeypatch) as seen:
        threads = [threading.Thread(target=loop_thread, name=f"run-loop-{k}")
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not failures, failures
    assert len(ids) == 48
    # how many of the writes ran inline depends on how often each loop was idle, which a
    # busy machine decides (CI saw none beyond the first per run): not asserted here --
    # the lone-run test above pins inline commits
    assert seen

    async def check() -> None:
        try:
            for run_id in ids:
                verification = await interlock.verify(run_id, store=store)
                assert verification.ok, verification.message
        finally:
            await store.close()

    asyncio.run(check())


FLOW = r"""
import asyncio, os
import interlock

OUT = os.environ.get("INLINE_PROGRESS")

async def step(state):
    if OUT:
        with open(OUT, "a") as f:
            f.write(f"{state['i']}\n")
    return {"i": state["i"] + 1}

wf = interlock.Workflow("inline-loop")
wf.node("step", step)
wf.edge("START", "step")
wf.edge("step", "step", when="i < 3000")
wf.edge("step", "END", otherwise=True)
"""

CHILD = r"""
import asyncio, os, sys, threading
from interlock._store._sqlite import SQLiteStore
import flow

inner = SQLiteStore._write_batch
out = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT)

def spy(self, batch):
    os.write(out, f"{threading.current_thread().name}\n".encode())
    return inner(self, batch)

SQLiteStore._write_batch = spy
asyncio.run(flow.wf.run({"i": 0}, store=sys.argv[1], run_id="lone"))
"""


def test_sigkill_amid_inline_commits_loses_no_committed_completion_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone run's steps each start after the previous completion was committed (on the
    loop's thread now): killed mid-run, its log verifies, holds every completion whose
    successor had started, and a resume finishes it."""
    (tmp_path / "flow.py").write_text(FLOW)
    url, progress, threads = (f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "progress",
                              tmp_path / "threads")
    env = {**os.environ, "INLINE_PROGRESS": str(progress), "PYTHONPATH": os.pathsep.join(
        p for p in (str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, url, str(threads)], env=env,
                            cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if progress.exists() and len(progress.read_text().splitlines()) >= 500:
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()[1].decode()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    started = [int(i) for i in progress.read_text().split()]
    assert threads.read_text().splitlines().count("MainThread") >= 400  # inline commits
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("INLINE_PROGRESS", raising=False)
    import flow  # type: ignore[import-not-found]  # the file written above

    async def check() -> None:
        store = open_store(url)
        try:
            entries = await store.entries("lone")
            # (log format 2: a step that never waits is one node.visited)
            completed = sum(e.type in ("node.completed", "node.visited") for e in entries)
            assert completed >= max(started)  # step i started after i completions
            assert completed < 3000  # killed mid-run
            assert (await interlock.verify("lone", store=store)).ok
            result = await interlock.resume("lone", store=store, workflow=flow.wf,
                                            force=True)
            assert result.status == "COMPLETED" and result.state["i"] == 3000
            assert (await interlock.verify("lone", store=store)).ok
        finally:
            await store.close()

    asyncio.run(check())
