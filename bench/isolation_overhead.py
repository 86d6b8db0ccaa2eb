"""Per-call overhead of ``isolation: process`` against an in-process call.

    python bench/isolation_overhead.py                # ~1 min
    python bench/isolation_overhead.py --calls 50 --cold 5

A trivial node (``return {"y": state["x"] + 1}``) is called N times each way and the
median is reported:

- ``inproc_direct``  -- ``fn(state)``: the floor;
- ``inproc_thread``  -- ``await asyncio.to_thread(fn, state)``: how the runner calls a sync
  node in-process (its ``isolation: thread`` default);
- ``inproc_async``   -- ``await afn(state)``: an async node in-process;
- ``warm_sync`` / ``warm_async`` -- `ProcessPool.call` on a warm, reused worker;
- ``warm_state_10kB`` / ``warm_state_1MB`` -- the same with a bigger state (serialisation
  both ways);
- ``cold``            -- a fresh worker every call (spawn, import, call, kill, reap): what
  a ``memory:``-limited call, or the first isolated call of a run, costs;
- ``run_inproc`` / ``run_isolated`` -- a one-node workflow run end to end (memory store):
  each run has its own pool, so an isolated run pays one cold start.

Each measurement is one JSON line on stdout ({"bench", "metric", "value", "unit", "n"});
the last line is a one-line summary. Standard library and interlock only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

NODES = textwrap.dedent('''
    def inc(state):
        return {"y": state["x"] + 1}

    async def ainc(state):
        return {"y": state["x"] + 1}

    def size(state):
        return {"n": len(state["blob"])}

    def where(state):
        import os

        return {"pid": os.getpid()}
''')


def emit(metric: str, value: float, unit: str = "us", **extra: Any) -> None:
    print(json.dumps({"bench": "isolation_overhead", "metric": metric,
                      "value": round(value, 2), "unit": unit, **extra}), flush=True)


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def timed(n: int, fn: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def main(calls: int, cold: int, runs: int) -> dict[str, float]:
    from interlock import END, START, Workflow
    from interlock._engine._isolation import ChildContext, ProcessPool

    module = sys.modules["isobench_nodes"]
    state = {"x": 1}
    ctx = ChildContext("bench", "n", 1, 1, "bench:n:1")
    res: dict[str, float] = {}

    def record(metric: str, samples: list[float]) -> None:
        res[metric] = median_us(samples)
        emit(metric, res[metric], n=len(samples),
             p90=round(statistics.quantiles(samples, n=10)[-1] * 1e6, 2)
             if len(samples) >= 10 else None)

    async def direct() -> Any:
        return module.inc(state)

    async def thread() -> Any:
        return await asyncio.to_thread(module.inc, state)

    async def inproc_async() -> Any:
        return await module.ainc(state)

    for _ in range(20):  # warm the thread pool and caches
        await thread()
    record("inproc_direct", await timed(calls, direct))
    record("inproc_thread", await timed(calls, thread))
    record("inproc_async", await timed(calls, inproc_async))

    async with ProcessPool() as pool:
        async def warm(fn: str, st: dict[str, Any]) -> None:
            r = await pool.call(f"isobench_nodes:{fn}", st, ctx, timeout=60)
            assert r.error is None, r.error

        for _ in range(10):
            await warm("inc", state)
            await warm("ainc", state)
        assert pool.spawned == 1, "the warm pool should have a single worker"
        record("warm_sync", await timed(calls, lambda: warm("inc", state)))
        record("warm_async", await timed(calls, lambda: warm("ainc", state)))
        for label, nbytes in (("10kB", 10_000), ("1MB", 1_000_000)):
            big = {"blob": "x" * nbytes}
            await warm("size", big)
            record(f"warm_state_{label}", await timed(max(10, calls // 4),
                                                      lambda big=big: warm("size", big)))

    async with ProcessPool(max_idle=0) as pool:  # nothing kept: a new worker every call
        async def fresh() -> None:
            r = await pool.call("isobench_nodes:inc", state, ctx, timeout=60)
            assert r.error is None and not r.reused, r.error

        await fresh()
        record("cold", await timed(cold, fresh))

    def workflow(isolated: bool) -> Workflow:
        wf = Workflow("bench-iso")
        wf.node("n", module.where, isolation="process" if isolated else None)
        wf.edge(START, "n").edge("n", END)
        return wf

    for label, isolated in (("run_inproc", False), ("run_isolated", True)):
        wf = workflow(isolated)

        async def one_run(wf: Workflow = wf) -> Any:
            result = await wf.run({"x": 1}, store="memory://")
            assert result.status == "COMPLETED", result.error
            return result

        if isolated and (await one_run()).state["pid"] == os.getpid():
            print(json.dumps({"bench": "isolation_overhead", "metric": label,
                              "skipped": "this interlock's runner does not isolate nodes yet"}))
            continue
        await one_run()
        record(label, await timed(runs, one_run))
    return res


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per warm measurement")
    ap.add_argument("--cold", type=int, default=20, help="cold-start calls")
    ap.add_argument("--runs", type=int, default=20, help="workflow runs per engine measurement")
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    emit("environment", 0, unit="-", python=platform.python_version(),
         cpus=os.cpu_count(), loadavg_1m=load, platform=platform.platform())
    with tempfile.TemporaryDirectory(prefix="isobench-") as tmp:
        (Path(tmp) / "isobench_nodes.py").write_text(NODES)
        sys.path.insert(0, tmp)
        __import__("isobench_nodes")
        r = asyncio.run(main(args.calls, args.cold, args.runs))
    warm = r["warm_sync"] - r["inproc_thread"]
    print(f"isolation overhead per call: warm worker +{warm:.0f}us over an in-process sync call "
          f"({r['warm_sync']:.0f}us vs {r['inproc_thread']:.0f}us via to_thread, "
          f"{r['inproc_direct']:.1f}us direct); async node {r['warm_async']:.0f}us; "
          f"1MB state {r['warm_state_1MB'] / 1000:.1f}ms; cold worker "
          f"{r['cold'] / 1000:.0f}ms; one-node run {r['run_inproc'] / 1000:.1f}ms in-process"
          + (f" vs {r['run_isolated'] / 1000:.0f}ms isolated" if "run_isolated" in r else "")
          + f" (load {load})")


if __name__ == "__main__":
    cli()
