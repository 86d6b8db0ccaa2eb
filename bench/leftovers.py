"""What a run leaves behind in its process: N runs, then N more, and what grew between.

    python bench/leftovers.py [N]          # N = 200 by default
    python bench/leftovers.py --serve [RUNS] [--trace]   # RUNS = 1000 by default

For each surface (``wf.run`` on memory://, one SQLite file, a file per run, PostgreSQL
when ``INTERLOCK_TEST_POSTGRES`` is set; runs that wait at a gate and are resumed, runs
that fail, cancelled runs; a worker picking runs; a conversation's turns) it runs a
warm-up, N runs, takes the process's counts (threads, asyncio tasks, open file
descriptors, live objects by type after ``gc.collect()``, tracemalloc's total), runs N
more and prints what grew. A leak shows as a type whose count grows by about N (or a
multiple); a bounded cache as growth that stops when N is doubled again. Weak
references are counted apart: alive, dead, and dead ones held in a ``sqlite3``
connection's list of its cursors (CPython prunes that list every 200 cursors a
connection makes: bounded, not ours).

``--serve``: a real ``interlock serve`` (SQLite store in a temporary directory, a
loopback port, 4 workers), RUNS runs started through its HTTP API, 8 at a time: a
quarter of them wait at a gate and are approved through the API, a third are followed
on their event stream (SSE) to their end, the others polled to COMPLETED. After 100,
500 and RUNS runs (every run ended), the server process's RSS, peak RSS, threads and
open fds from /proc. ``--trace`` runs the server under tracemalloc (10 frames) and, at
each of those points, has it dump a snapshot (SIGUSR1); the traced growth between
each two is printed, and between the last two by traceback (about 10x slower: for
finding what holds memory).

See bench/README.md, "What a run leaves behind".
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sqlite3
import sys
import tempfile
import threading
import tracemalloc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import interlock
from interlock import END, START, Workflow
from interlock.support import Worker

Surface = Callable[[int], Awaitable[None]]


def _chain() -> Workflow:
    wf = Workflow("chain")
    wf.node("a", lambda s: {"x": 1})
    wf.node("b", lambda s: {"y": 2})
    wf.edge(START, "a").edge("a", "b").edge("b", END)
    return wf


def _gated() -> Workflow:
    wf = Workflow("gated")
    wf.node("a", lambda s: {"x": 1})
    wf.approval("ok")
    wf.edge(START, "a").edge("a", "ok").edge("ok", END)
    return wf


def _failing() -> Workflow:
    def boom(state: dict[str, Any]) -> None:
        raise ValueError("boom")

    wf = Workflow("failing")
    wf.node("a", boom)
    wf.edge(START, "a").edge("a", END)
    return wf


def _slow() -> Workflow:
    async def wait(state: dict[str, Any]) -> None:
        await asyncio.sleep(60)

    wf = Workflow("slow")
    wf.node("a", wait)
    wf.edge(START, "a").edge("a", END)
    return wf


def surfaces(tmp: str) -> dict[str, Surface]:
    one = f"sqlite:///{tmp}/one.db"
    counter = iter(range(10**9))

    def runs(wf: Workflow, url: Callable[[], str]) -> Surface:
        async def go(n: int) -> None:
            for _ in range(n):
                await wf.run({}, store=url())
        return go

    async def gated(n: int) -> None:
        wf = _gated()
        for _ in range(n):
            waiting = await wf.run({}, store=one)
            await wf.resume(waiting.run_id, interlock.approve(by="ann"), store=one)

    async def cancelled(n: int) -> None:
        wf = _slow()
        for _ in range(n):
            task = asyncio.ensure_future(wf.run({}, store=one))
            await asyncio.sleep(0.02)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    out: dict[str, Surface] = {
        "memory://": runs(_chain(), lambda: "memory://"),
        "sqlite, one file": runs(_chain(), lambda: one),
        "sqlite, a file per run": runs(_chain(), lambda: f"sqlite:///{tmp}/r{next(counter)}.db"),
        "gate, resumed (sqlite)": gated,
        "failing (memory://)": runs(_failing(), lambda: "memory://"),
        "cancelled (sqlite)": cancelled,
        **_long_lived(tmp, one),
    }
    pg = os.environ.get("INTERLOCK_TEST_POSTGRES")
    if pg:
        out["postgresql"] = runs(_chain(), lambda: pg)
    return out


def _long_lived(tmp: str, one: str) -> dict[str, Surface]:
    """A worker that picks the runs; one conversation's turns."""
    worker_store = interlock.open_store(f"sqlite:///{tmp}/worker.db")
    chain = _chain()
    worker = Worker(worker_store, workflows={"chain": chain}, concurrency=4, poll=0.05)

    async def picked(n: int) -> None:
        if not hasattr(picked, "task"):
            picked.task = asyncio.ensure_future(worker.run())  # type: ignore[attr-defined]
        target = worker.executed + n
        for _ in range(n):
            await chain.submit({}, store=worker_store)
        while worker.executed < target:
            await asyncio.sleep(0.01)

    talk = interlock.load({"workflow": "talk", "chat": "assistant", "nodes": {
        "assistant": {"agent": {"provider": "scripted", "replies": ["ok"] * 10**5}}}})

    async def turns(n: int) -> None:
        if not hasattr(turns, "run_id"):
            turns.run_id = (await talk.run({}, store=one)).run_id  # type: ignore[attr-defined]
        for k in range(max(1, n // 10)):  # (a turn reads its log: N/10 turns)
            await talk.send(turns.run_id, f"message {k}", store=one)  # type: ignore[attr-defined]

    return {"worker (sqlite)": picked, "conversation, N/10 turns (sqlite)": turns}


def counts() -> dict[str, int]:
    gc.collect()
    objects = gc.get_objects()
    kinds = collections.Counter(type(o).__name__ for o in objects)
    kinds["(threads)"] = threading.active_count()
    kinds["(tasks)"] = len(asyncio.all_tasks())
    kinds["(fds)"] = len(os.listdir("/proc/self/fd"))
    kinds.update(weakrefs(objects))
    return dict(kinds)


def weakrefs(objects: list[Any]) -> dict[str, int]:
    """Weak references alive and dead, and the dead ones a ``sqlite3.Connection`` holds
    (its list of the cursors it made, which CPython prunes every 200 cursors)."""
    refs = [o for o in objects if type(o) is weakref.ReferenceType]
    dead = {id(r) for r in refs if r() is None}
    in_sqlite = {id(x) for conn in objects if isinstance(conn, sqlite3.Connection)
                 for held in gc.get_referents(conn) if isinstance(held, list)
                 for x in held if id(x) in dead}
    return {"(weakrefs alive)": len(refs) - len(dead), "(weakrefs dead)": len(dead),
            "(weakrefs dead, sqlite3 cursor lists)": len(in_sqlite)}


async def main(n: int) -> None:
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        for name, surface in surfaces(tmp).items():
            await surface(10)
            await surface(n)
            before, traced = counts(), tracemalloc.get_traced_memory()[0]
            await surface(n)
            after, grown = counts(), tracemalloc.get_traced_memory()[0] - traced
            more = sorted(((k, after[k] - before.get(k, 0)) for k in after
                           if after[k] - before.get(k, 0) >= max(5, n // 10)),
                          key=lambda kv: -kv[1])
            print(f"{name:30} +{grown / n:8.0f} B/run traced; "
                  f"threads {before['(threads)']}->{after['(threads)']}, "
                  f"tasks {before['(tasks)']}->{after['(tasks)']}, "
                  f"fds {before['(fds)']}->{after['(fds)']}; "
                  f"grew by >= N/10: {more[:6] or 'nothing'}")
            print(" " * 31 + "weakrefs alive " + _then(before, after, "(weakrefs alive)")
                  + ", dead " + _then(before, after, "(weakrefs dead)") + " (of which in "
                  "sqlite3 cursor lists " + _then(before, after,
                                                  "(weakrefs dead, sqlite3 cursor lists)")
                  + ")")
    os._exit(0)  # (the worker's task and the slow runs' threads: nothing to wait for)


def _then(before: dict[str, int], after: dict[str, int], key: str) -> str:
    return f"{before.get(key, 0)}->{after.get(key, 0)}"


if __name__ == "__main__":
    if "--serve" in sys.argv:
        from _leftovers_serve import serve_main

        serve_main([a for a in sys.argv[1:] if a != "--serve"])
    else:
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
