"""Where a durable step's time goes on the SQLite store: the floor of its design.

    python bench/store_hop.py                  # ~10 s
    python bench/store_hop.py --steps 5000 --trials 7

One SQLite file in WAL mode with `synchronous=NORMAL`, the store's own schema and SQL
(`interlock._store._sqlite`): each step is one append as a plain loop step makes it
(the summary's compare-and-set UPDATE, four records, a commit). The same steps are timed
four ways, medians of the trials, one JSON line each, then a summary:

- `sql_inline`: the append on the event loop's own thread (no hop);
- `hop_only`: an asyncio coroutine hands an empty job to a writer thread (a
  `queue.SimpleQueue`) and awaits its future (`call_soon_threadsafe`), as the store does;
- `hop_and_sql`: the append on that writer thread, awaited the same way -- the store's
  design with none of its Python around it;
- `engine`: `await wf.run(...)` of the bench loop (bench/adapters/interlock_adapter.py)
  on a new file, per step: everything.

`engine - hop_and_sql` is what the engine and the store's own code add. On a VM whose
idle vCPUs halt, a thread hop wakes one, and the append then runs on a cold core:
`hop_and_sql` is then well above `hop_only + sql_inline`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "adapters"))

from interlock._store import _sqlite_sql as q  # noqa: E402

RECORD = '{"at":1796156301.5867739,"attempt":1,"node":"step","seq":3,"type":"node.started"}'


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    for statement in q.SCHEMA_STATEMENTS:
        conn.execute(statement)
    conn.execute(q._INSERT_RUN, ["r", "wf", "RUNNING", "h", 0.0, 0.0, 0,
                                 "0" * 64, 0, 0, None, None, None, None, "me", None, "{}"])
    return conn


def appender(conn: sqlite3.Connection) -> Callable[[], None]:
    seq = 0
    digest = bytes(32)

    def append() -> None:
        nonlocal seq
        conn.execute("BEGIN IMMEDIATE")
        (key,), = conn.execute(q._UPDATE_SUMMARY_IF, (
            0.0, seq + 4, "0" * 64, 1, 0, None, None, "r", "RUNNING", seq or None)).fetchall()
        conn.executemany(q._INSERT_RECORD, [((key << 32) | (seq + k), RECORD, digest)
                                            for k in range(1, 5)])
        conn.execute("COMMIT")
        seq += 4

    return append


class Writer:
    """The store's hop, bare: a thread fed by a SimpleQueue, outcomes by
    call_soon_threadsafe."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        while (job := self.jobs.get()) is not None:
            loop, fut, fn = job
            fn()
            loop.call_soon_threadsafe(fut.set_result, None)

    async def call(self, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.jobs.put((loop, fut, fn))
        await fut

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()


async def per_step(steps: int, step: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        await step()
    return (time.perf_counter() - t0) / steps * 1e6


async def engine_step(steps: int, tmp: Path, k: int) -> float:
    import interlock_adapter as adapter

    wf = adapter.loop(steps)
    path = tmp / f"engine{k}.db"
    t0 = time.perf_counter()
    await wf.run({"i": 0}, store=f"sqlite:///{path}")
    return (time.perf_counter() - t0) / steps * 1e6


def measure(steps: int, trials: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="interlock-hop-"))
    results: dict[str, list[float]] = {"sql_inline": [], "hop_only": [], "hop_and_sql": [],
                                       "engine": []}
    writer = Writer()
    try:
        for k in range(trials + 1):  # the first round warms up
            conn = connect(tmp / f"inline{k}.db")
            append = appender(conn)

            async def inline(append: Callable[[], None] = append) -> None:
                append()

            got = {"sql_inline": asyncio.run(per_step(steps, inline)),
                   "hop_only": asyncio.run(per_step(steps, lambda: writer.call(lambda: None)))}
            conn.close()
            conn = connect(tmp / f"thread{k}.db")
            append = appender(conn)
            got["hop_and_sql"] = asyncio.run(per_step(
                steps, lambda append=append: writer.call(append)))
            conn.close()
            got["engine"] = asyncio.run(engine_step(steps, tmp, k))
            if k:
                for name, value in got.items():
                    results[name].append(value)
    finally:
        writer.stop()
        for thread in threading.enumerate():  # the engine's stores, closing
            if thread.name.startswith("interlock-sqlite"):
                thread.join()
        shutil.rmtree(tmp, ignore_errors=True)
    return {name: statistics.median(values) for name, values in results.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    got = measure(args.steps, args.trials)
    for name, value in got.items():
        print(json.dumps({"bench": "store_hop", "mode": name, "per_step_us": round(value, 1),
                          "steps": args.steps, "trials": args.trials}))
    print(f"per step: SQL inline {got['sql_inline']:.0f} us, a bare hop {got['hop_only']:.0f} "
          f"us, the SQL behind a hop {got['hop_and_sql']:.0f} us, the engine's durable step "
          f"{got['engine']:.0f} us (so the engine and the store's code add "
          f"{got['engine'] - got['hop_and_sql']:.0f} us)")


if __name__ == "__main__":
    main()
