"""What a run leaves behind in its process: N runs, then N more, and what grew between.

    python bench/leftovers.py [N]          # N = 200 by default

For each surface (``wf.run`` on memory://, one SQLite file, a file per run, PostgreSQL
when ``INTERLOCK_TEST_POSTGRES`` is set; runs that wait at a gate and are resumed, runs
that fail, cancelled runs; a worker picking runs; a conversation's turns) it runs a
warm-up, N runs, takes the process's counts (threads, asyncio tasks, open file
descriptors, live objects by type after ``gc.collect()``, tracemalloc's total), runs N
more and prints what grew. A leak shows as a type whose count grows by about N (or a
multiple); a bounded cache as growth that stops when N is doubled again. See
bench/README.md, "What a run leaves behind".
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import tempfile
import threading
import tracemalloc
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
    kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
    kinds["(threads)"] = threading.active_count()
    kinds["(tasks)"] = len(asyncio.all_tasks())
    kinds["(fds)"] = len(os.listdir("/proc/self/fd"))
    return dict(kinds)


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
    os._exit(0)  # (the worker's task and the slow runs' threads: nothing to wait for)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
