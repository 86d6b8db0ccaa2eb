"""One open store per URL and event loop: concurrent runs given the same URL share it
(one SQLite writer thread), the last one done closes it, and a store is never handed to
another event loop (another thread's, the next ``asyncio.run``)."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import _store
from interlock._store import acquire_store, release_store

PG_ENV = "INTERLOCK_TEST_POSTGRES"


def writer_threads(db: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"interlock-sqlite:{db.name}"]


def writers_end(db: Path) -> bool:
    """The store's writer thread ends by itself once its last user is done (it closes
    the connection on its way out, without the user waiting for it)."""
    for t in writer_threads(db):
        t.join(30)
    return writer_threads(db) == []


def chain(n: int, body: Any) -> interlock.Workflow:
    wf = interlock.Workflow("shared")
    names = [f"n{k}" for k in range(n)]
    for name in names:
        wf.node(name, body)
    wf.edge("START", names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    wf.edge(names[-1], "END")
    return wf


def test_concurrent_runs_on_one_url_share_one_store_closed_by_the_last(tmp_path: Path) -> None:
    db = tmp_path / "same.db"
    url = f"sqlite:///{db}"
    seen: list[int] = []

    async def step(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(writer_threads(db)))
        await asyncio.sleep(0)
        return {"i": state["i"] + 1}

    wf = chain(5, step)

    async def main() -> list[interlock.RunResult]:
        return await asyncio.gather(*[wf.run({"i": 0, "tag": k}, store=url)
                                      for k in range(30)])

    results = asyncio.run(main())
    assert [r.status for r in results] == ["COMPLETED"] * 30
    assert all(r.state["i"] == 5 for r in results)
    assert seen and set(seen) == {1}  # one writer thread while 30 runs were executing
    assert writers_end(db)  # closed when the last run was done
    assert not Path(f"{db}-wal").exists()  # and closed whole: the WAL is in the file
    assert not _store._SHARED

    async def check() -> None:
        for r in results:
            assert (await interlock.verify(r.run_id, store=url)).ok

    asyncio.run(check())


def test_sequential_event_loops_each_get_their_own_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state["i"] + 1}

    wf = chain(3, step)
    first = wf.run_sync({"i": 0, "tag": 0}, store=url)  # asyncio.run: a loop, then closed
    second = wf.run_sync({"i": 1, "tag": 1}, store=url)  # another loop
    assert (first.state["i"], second.state["i"]) == (3, 4)
    assert not _store._SHARED


def test_a_store_is_not_shared_into_another_event_loop(tmp_path: Path) -> None:
    """Two threads, each with its own loop, running concurrently on one URL: each loop has
    its own store (and writer), both open at once; releasing one leaves the other open."""
    # a name no other test's store has: the writer threads are found by the file's name,
    # and a store another test left open on a ``runs.db`` is not this test's to wait for
    db = tmp_path / "two-loops.db"
    url = f"sqlite:///{db}"
    both_open = threading.Barrier(2, timeout=30)
    stores: dict[str, Any] = {}
    done = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    async def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state["i"] + 1}

    wf = chain(3, step)

    def in_thread(name: str) -> None:
        async def main() -> None:
            store = acquire_store(url)
            again = acquire_store(url)
            assert again is store  # the same loop: shared
            stores[name] = store
            await asyncio.to_thread(both_open.wait)  # the other loop holds its own now
            result = await wf.run({"i": 0, "tag": 0}, store=url)  # uses this loop's
            assert result.status == "COMPLETED"
            await release_store(again)
            await release_store(store)
            await asyncio.to_thread(done.wait)

        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=in_thread, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert stores["a"] is not stores["b"]
    assert writers_end(db)
    assert not _store._SHARED


@pytest.mark.skipif(not os.environ.get(PG_ENV), reason=f"${PG_ENV} is not set")
def test_postgres_store_is_bound_to_its_loop() -> None:
    url = os.environ[PG_ENV]

    async def one() -> Any:
        store = acquire_store(url)
        try:
            await store.list_runs(limit=1)
            return store
        finally:
            await release_store(store)

    first = asyncio.run(one())
    second = asyncio.run(one())
    assert first is not second  # a loop's connections are never used from the next
    assert not _store._SHARED


def test_memory_url_is_not_shared() -> None:
    async def main() -> None:
        a, b = acquire_store("memory://"), acquire_store("memory://")
        assert a is not b
        await release_store(a)
        await release_store(b)

    asyncio.run(main())


def test_a_script_that_exits_right_after_its_run_leaves_the_store_closed(
        tmp_path: Path) -> None:
    """The last user does not wait for the store's close, but the process does, at exit:
    the WAL is back in the file and the run reads back whole."""
    db = tmp_path / "runs.db"
    script = f"""
import interlock
async def step(state):
    return {{"i": state.get("i", 0) + 1}}
wf = interlock.Workflow("exit")
wf.node("a", step)
wf.edge("START", "a")
wf.edge("a", "END")
print(wf.run_sync({{}}, store="sqlite:///{db}").run_id)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(interlock.__file__).resolve().parent.parent),
                    os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    run_id = proc.stdout.strip()
    assert not Path(f"{db}-wal").exists()
    result = asyncio.run(interlock.status(run_id, store=f"sqlite:///{db}"))
    assert result.status == "COMPLETED" and result.state == {"i": 1}
