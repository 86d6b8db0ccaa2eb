"""interlock's side of the benchmark: ``python interlock_adapter.py SCENARIO PARAMS_JSON``.

Runs with the project's own venv (bench/run.py passes ``sys.executable``). Every node is
an ``async def`` returning a small update, as in the LangGraph adapter. Workflows are built
and compiled once, outside the timed region; each timed trial is one ``await wf.run(...)``.
See _common.py for the output format and bench/README.md for the scenarios.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    ITEM,
    SLEEP_S,
    Emitter,
    concurrent_durable,
    concurrent_runs,
    db_size_kb,
    fresh_pg_schema,
    main,
    per_step_trials,
    run_s6,
    trials,
)

import interlock
from interlock._store import StoreError

ENGINE = "interlock"


# -- graphs ------------------------------------------------------------------------------

async def inc(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state["i"] + 1}


async def hit(state: dict[str, Any]) -> dict[str, Any]:
    return {"hits": 1}


async def sleepy_hit(state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(SLEEP_S)
    return {"hits": 1}


async def fan(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": 1}


async def done(state: dict[str, Any]) -> dict[str, Any]:
    return {"total": len(state.get("hits") or ())}


async def append_step(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state["i"] + 1, "items": ITEM}


def chain(n: int) -> interlock.Workflow:
    """START -> n0 -> n1 -> ... -> n{n-1} -> END; each node increments ``i``."""
    wf = interlock.Workflow(f"chain-{n}")
    names = [f"n{k}" for k in range(n)]
    for name in names:
        wf.node(name, inc)
    wf.edge("START", names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    wf.edge(names[-1], "END")
    return wf


def fan_out(n: int, sleep: bool) -> interlock.Workflow:
    """START -> fan -> [b0..b{n-1}] -> (join) done -> END; branches append to ``hits``."""
    wf = interlock.Workflow(f"fan-{n}", state={"hits": "append"})
    branches = [f"b{k}" for k in range(n)]
    wf.node("fan", fan)
    for b in branches:
        wf.node(b, sleepy_hit if sleep else hit)
    wf.node("done", done)
    wf.edge("START", "fan")
    wf.edge("fan", branches)
    wf.edge(branches, "done")
    wf.edge("done", "END")
    return wf


async def plan_items(state: dict[str, Any]) -> dict[str, Any]:
    return {"xs": list(range(state["n"]))}


async def map_hit(state: dict[str, Any]) -> dict[str, Any]:
    return {"hits": state["x"]}


def mapped(n: int) -> interlock.Workflow:
    """START -> plan -> map(xs) hit -> done -> END: one visit of ``hit`` per item, each
    appending to ``hits`` (a map; LangGraph's side is ``Send``)."""
    wf = interlock.Workflow("map", state={"hits": "append"})
    wf.node("plan", plan_items).node("hit", map_hit).node("done", done)
    wf.edge("START", "plan").map("plan", "xs", "hit", as_="x", max_items=max(n, 1))
    wf.edge("hit", "done").edge("done", "END")
    return wf


def loop(n: int, *, append: bool = False) -> interlock.Workflow:
    """``step`` runs n times: step -> step when i < n, otherwise END."""
    wf = interlock.Workflow(f"loop-{n}", state={"items": "append"} if append else None)
    wf.node("step", append_step if append else inc)
    wf.edge("START", "step")
    wf.edge("step", "step", when=f"i < {n}")
    wf.edge("step", "END", otherwise=True)
    return wf


def _check(result: interlock.RunResult, **expect: Any) -> None:
    if result.status != "COMPLETED":
        raise RuntimeError(f"run {result.status}: {result.error}")
    for k, v in expect.items():
        got = result.state.get(k)
        got = len(got) if isinstance(v, int) and isinstance(got, list) else got
        if got != v:
            raise RuntimeError(f"expected state[{k!r}] == {v!r}, got {got!r}")


# -- scenarios -----------------------------------------------------------------------------

async def s1(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    chain(2).compile()  # load what compiling needs (interlock loads its modules lazily)
    t0 = time.perf_counter()
    wf = chain(n)
    wf.compile()
    em.value("build_compile_ms", (time.perf_counter() - t0) * 1000, "ms")

    async def once() -> None:
        _check(await wf.run({"i": 0}, store="memory://"), i=n)

    await per_step_trials(em, p, once, n, "per_node")


async def s2(em: Emitter, p: dict[str, Any]) -> None:
    n, sleep = p["n"], bool(p.get("sleep_ms"))
    wf = fan_out(n, sleep)
    wf.compile()

    async def once() -> None:
        _check(await wf.run({}, store="memory://"), hits=n, total=n)

    for k, (dt, cpu) in enumerate(await trials(once, warmup=p["warmup"], count=p["trials"])):
        em.value("wall_ms", dt * 1000, "ms", trial=k)
        if sleep:
            # how many 50 ms sleeps overlapped: n when all branches run at once
            em.value("overlap", n * SLEEP_S / dt, "x", trial=k)
        else:
            em.value("per_node_us", dt / (n + 2) * 1e6, "us", trial=k)
            em.value("per_node_cpu_us", cpu / (n + 2) * 1e6, "us", trial=k)


async def s9(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    wf = mapped(n)
    wf.compile()

    async def once() -> None:
        _check(await wf.run({"n": n}, store="memory://"), hits=n, total=n)

    for k, (dt, cpu) in enumerate(await trials(once, warmup=p["warmup"], count=p["trials"])):
        em.value("wall_ms", dt * 1000, "ms", trial=k)
        em.value("per_item_us", dt / n * 1e6, "us", trial=k)
        em.value("per_item_cpu_us", cpu / n * 1e6, "us", trial=k)


async def s3(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    wf = loop(n)
    wf.compile()

    async def once() -> None:
        _check(await wf.run({"i": 0}, store="memory://"), i=n)

    await per_step_trials(em, p, once, n, "per_iter")


async def s4(em: Emitter, p: dict[str, Any]) -> None:
    wf = chain(5)
    wf.compile()
    await concurrent_runs(em, p, lambda: wf.run({"i": 0}, store="memory://"),
                          lambda r: _check(r, i=5))


async def durable(em: Emitter, p: dict[str, Any], make: Callable[[int], interlock.Workflow],
                  metric: str, expect: Callable[[int], dict[str, Any]], *,
                  sync_full: bool = True) -> None:
    """S5/S7: runs against interlock's SQLite store, a fresh database file per trial.

    Timed: ``await wf.run(..., store="sqlite:///...")``, which opens the store (makes
    the file and its schema) and closes it; LangGraph's saver is likewise connected
    inside the clock. The size is taken after the close.
    The warm-up runs the same graph with ``warmup_n`` steps (a long durable warm-up
    only costs time). S5 also times the run alone (``@open``): the store opened -- its
    file and schema made -- before the clock and closed after it, as the floor's
    ``@open`` rows (issue 34: a lone durable step within 3x of the floor).
    """
    n = p["n"]
    wf, warm = make(n), make(p.get("warmup_n", n))
    tmp = Path(tempfile.mkdtemp(prefix="interlock-bench-"))
    variants = [("", metric, "db_kb")]
    if sync_full:
        # SQLite's own default, which LangGraph's saver gets, is synchronous=FULL (an
        # fsync per commit); interlock's store defaults to NORMAL in WAL mode. Both; and
        # NORMAL with the store open before the clock
        variants += [("?synchronous=full", metric + "@sync=full", ""),
                     ("@open", metric + "@open", "")]
    k = 0

    async def once(w: interlock.Workflow, steps: int, query: str) -> tuple[float, float, float]:
        nonlocal k
        k += 1
        path = tmp / f"run{k}.db"
        store: interlock.Store | str = f"sqlite:///{path}{query}"
        if query == "@open":
            store = interlock.open_store(f"sqlite:///{path}")
            await store.set_cursor("bench", "open")  # (a write: the file and schema made)
        # as a user writes it: the run opens the store (a new file: its schema made too)
        # and gives it back; its close ends on the store's thread, after the clock
        c0, t0 = time.process_time(), time.perf_counter()
        result = await w.run({"i": 0}, store=store)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if not isinstance(store, str):
            await store.close()
        for thread in threading.enumerate():  # the size once the store is closed
            if thread.name.startswith("interlock-sqlite"):
                thread.join()
        _check(result, **expect(steps))
        return dt, cpu, db_size_kb(path)

    try:
        for query, metric_name, size_metric in variants:
            try:
                for _ in range(p["warmup"]):
                    await once(warm, p.get("warmup_n", n), query)
            except (StoreError, ImportError) as exc:  # the backend is missing or broken
                em.skipped(metric_name, f"interlock's SQLite store is unavailable: {exc}")
                continue
            for t in range(p["trials"]):
                dt, cpu, size = await once(wf, n, query)
                em.value(metric_name, dt / n * 1e6, "us", trial=t)
                em.value(metric_name.replace("_us", "_cpu_us"), cpu / n * 1e6, "us", trial=t)
                em.value("wall_ms" + metric_name.removeprefix(metric), dt * 1000, "ms", trial=t)
                if size_metric:
                    em.value(size_metric, size, "KiB", trial=t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def s5(em: Emitter, p: dict[str, Any]) -> None:
    await durable(em, p, chain if p["graph"] == "chain" else loop, "per_step_us",
                  lambda n: {"i": n})


async def s7(em: Emitter, p: dict[str, Any]) -> None:
    await durable(em, p, lambda n: loop(n, append=True), "per_iter_us",
                  lambda n: {"i": n, "items": n}, sync_full=False)


async def s8(em: Emitter, p: dict[str, Any]) -> None:
    """S8: ``runs`` concurrent runs of an ``n``-node chain, each ``await wf.run({...},
    store=URL)`` as a user writes it, one URL for all (the runs share its store): SQLite
    (a fresh file per batch; NORMAL, then ``?synchronous=full``) or PostgreSQL
    (``$INTERLOCK_BENCH_POSTGRES``, a fresh schema for the job)."""
    n = p["n"]
    wf = chain(n)
    wf.compile()
    if p["backend"] == "sqlite":
        tmp = Path(tempfile.mkdtemp(prefix="interlock-bench-"))
        k = 0
        try:
            for query, suffix in (("", ""), ("?synchronous=full", "@sync=full")):
                async def batch(count: int, query: str = query) -> None:
                    nonlocal k
                    k += 1
                    url = f"sqlite:///{tmp / f's8-{k}.db'}{query}"
                    for r in await asyncio.gather(*(wf.run({"i": 0}, store=url)
                                                    for _ in range(count))):
                        _check(r, i=n)

                await concurrent_durable(em, p, suffix, batch)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    with fresh_pg_schema(em, "interlock") as url:
        if url is None:
            return
        pg_url = url

        async def pg_batch(count: int) -> None:
            for r in await asyncio.gather(*(wf.run({"i": 0}, store=pg_url)
                                            for _ in range(count))):
                _check(r, i=n)

        await concurrent_durable(em, p, "", pg_batch)


def s6(em: Emitter, p: dict[str, Any]) -> None:
    cli_path = shutil.which("interlock", path=str(Path(sys.executable).parent))
    cli = [cli_path, "--help"] if cli_path else None
    run_s6(em, import_stmt="import interlock",
           api_stmt="from interlock import Workflow, load", cli=cli,
           cli_absent="no `interlock` console script next to this python", count=p["trials"])


if __name__ == "__main__":
    main(ENGINE, {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "S5": s5, "S6": s6, "S7": s7,
                  "S8": s8, "S9": s9},
         lambda: interlock.__version__)
