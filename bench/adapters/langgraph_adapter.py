"""LangGraph's side of the benchmark: ``python langgraph_adapter.py SCENARIO PARAMS_JSON``.

Runs with bench/.venv-langgraph/bin/python (made by bench/setup_langgraph.sh, with
langgraph 1.2.24 and langgraph-checkpoint-sqlite pinned). The same scenarios as the
interlock adapter, built the way a LangGraph user would: a ``TypedDict`` state,
``add_edge`` chains, a fan-out from one node and a join with ``add_edge([...], "done")``,
a loop with ``add_conditional_edges``, list fields with an ``operator.add`` reducer.
Every node is an ``async def``; graphs are compiled once, outside the timed region, and
each timed trial is one ``await graph.ainvoke(...)``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
import operator
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import aiosqlite
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
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

ENGINE = "langgraph"


class ChainState(TypedDict):
    i: int


class FanState(TypedDict, total=False):
    i: int
    hits: Annotated[list[int], operator.add]
    total: int


class ListState(TypedDict):
    i: int
    items: Annotated[list[str], operator.add]


async def inc(state: ChainState) -> dict[str, Any]:
    return {"i": state["i"] + 1}


async def hit(state: FanState) -> dict[str, Any]:
    return {"hits": [1]}


async def sleepy_hit(state: FanState) -> dict[str, Any]:
    await asyncio.sleep(SLEEP_S)
    return {"hits": [1]}


async def fan(state: FanState) -> dict[str, Any]:
    return {"i": 1}


async def done(state: FanState) -> dict[str, Any]:
    return {"total": len(state.get("hits") or ())}


async def append_step(state: ListState) -> dict[str, Any]:
    return {"i": state["i"] + 1, "items": [ITEM]}


def chain(n: int) -> StateGraph:
    g = StateGraph(ChainState)
    names = [f"n{k}" for k in range(n)]
    for name in names:
        g.add_node(name, inc)
    g.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


def fan_out(n: int, sleep: bool) -> StateGraph:
    g = StateGraph(FanState)
    branches = [f"b{k}" for k in range(n)]
    g.add_node("fan", fan)
    for b in branches:
        g.add_node(b, sleepy_hit if sleep else hit)
    g.add_node("done", done)
    g.add_edge(START, "fan")
    for b in branches:
        g.add_edge("fan", b)
    g.add_edge(branches, "done")
    g.add_edge("done", END)
    return g


class MapState(TypedDict, total=False):
    n: int
    x: int
    hits: Annotated[list[int], operator.add]
    total: int


async def plan_items(state: MapState) -> dict[str, Any]:
    return {}


async def map_hit(state: MapState) -> dict[str, Any]:
    return {"hits": [state["x"]]}


def mapped(n: int) -> StateGraph:
    """START -> plan -> Send("hit", {x}) per item -> done -> END: LangGraph's map-reduce."""
    g = StateGraph(MapState)
    g.add_node("plan", plan_items)
    g.add_node("hit", map_hit)
    g.add_node("done", done)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", lambda s: [Send("hit", {"x": i}) for i in range(s["n"])],
                            ["hit"])
    g.add_edge("hit", "done")
    g.add_edge("done", END)
    return g


def loop(n: int, *, append: bool = False) -> StateGraph:
    g = StateGraph(ListState if append else ChainState)
    g.add_node("step", append_step if append else inc)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["i"] < n else END, ["step", END])
    return g


def _config(steps: int, thread: str | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"recursion_limit": steps + 10}
    if thread is not None:
        cfg["configurable"] = {"thread_id": thread}
    return cfg


def _check(state: dict[str, Any], **expect: Any) -> None:
    for k, v in expect.items():
        got = state.get(k)
        got = len(got) if isinstance(v, int) and isinstance(got, list) else got
        if got != v:
            raise RuntimeError(f"expected state[{k!r}] == {v!r}, got {got!r}")


# -- scenarios -----------------------------------------------------------------------------

async def s1(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    chain(2).compile()  # the same warm-up as interlock's
    t0 = time.perf_counter()
    graph = chain(n).compile()
    em.value("build_compile_ms", (time.perf_counter() - t0) * 1000, "ms")
    cfg = _config(n)

    async def once() -> None:
        _check(await graph.ainvoke({"i": 0}, cfg), i=n)

    await per_step_trials(em, p, once, n, "per_node")


async def s2(em: Emitter, p: dict[str, Any]) -> None:
    n, sleep = p["n"], bool(p.get("sleep_ms"))
    graph = fan_out(n, sleep).compile()
    cfg = _config(n + 2)

    async def once() -> None:
        _check(await graph.ainvoke({"i": 0}, cfg), hits=n, total=n)

    for k, (dt, cpu) in enumerate(await trials(once, warmup=p["warmup"], count=p["trials"])):
        em.value("wall_ms", dt * 1000, "ms", trial=k)
        if sleep:
            em.value("overlap", n * SLEEP_S / dt, "x", trial=k)
        else:
            em.value("per_node_us", dt / (n + 2) * 1e6, "us", trial=k)
            em.value("per_node_cpu_us", cpu / (n + 2) * 1e6, "us", trial=k)


async def s3(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    graph = loop(n).compile()
    cfg = _config(n)

    async def once() -> None:
        _check(await graph.ainvoke({"i": 0}, cfg), i=n)

    await per_step_trials(em, p, once, n, "per_iter")


async def s4(em: Emitter, p: dict[str, Any]) -> None:
    graph = chain(5).compile()
    cfg = _config(5)
    await concurrent_runs(em, p, lambda: graph.ainvoke({"i": 0}, cfg), lambda r: _check(r, i=5))


async def durable(em: Emitter, p: dict[str, Any], make: Callable[[int], StateGraph],
                  metric: str, expect: Callable[[int], dict[str, Any]]) -> None:
    """S5/S7: AsyncSqliteSaver with durability="sync" (each step's checkpoint is written
    before the next step starts), a fresh database file per trial. Timed: connecting
    the saver (its tables made on first use) and the run; the close after the clock;
    the size after the close. The warm-up runs the same graph with ``warmup_n`` steps."""
    n = p["n"]
    g, warm = make(n), make(p.get("warmup_n", n))
    tmp = Path(tempfile.mkdtemp(prefix="langgraph-bench-"))
    k = 0

    async def once(graph: StateGraph, steps: int) -> tuple[float, float, float]:
        nonlocal k
        k += 1
        path = tmp / f"run{k}.db"
        # the connection is made (and the saver sets its tables up, on first use) inside
        # the clock, as interlock's store is opened inside its; the graph is compiled
        # with the saver before (interlock's workflow is compiled before too)
        conn = aiosqlite.connect(str(path))
        saver = AsyncSqliteSaver(conn)
        compiled = graph.compile(checkpointer=saver)
        cfg = _config(steps, uuid.uuid4().hex)
        c0, t0 = time.process_time(), time.perf_counter()
        await conn
        state = await compiled.ainvoke({"i": 0}, cfg, durability="sync")
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        await conn.close()
        _check(state, **expect(steps))
        return dt, cpu, db_size_kb(path)

    try:
        for _ in range(p["warmup"]):
            await once(warm, p.get("warmup_n", n))
        for t in range(p["trials"]):
            dt, cpu, size = await once(g, n)
            em.value(metric, dt / n * 1e6, "us", trial=t)
            em.value(metric.replace("_us", "_cpu_us"), cpu / n * 1e6, "us", trial=t)
            em.value("wall_ms", dt * 1000, "ms", trial=t)
            em.value("db_kb", size, "KiB", trial=t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def s5(em: Emitter, p: dict[str, Any]) -> None:
    await durable(em, p, chain if p["graph"] == "chain" else loop, "per_step_us",
                  lambda n: {"i": n})


async def s7(em: Emitter, p: dict[str, Any]) -> None:
    await durable(em, p, lambda n: loop(n, append=True), "per_iter_us",
                  lambda n: {"i": n, "items": n})


async def s8(em: Emitter, p: dict[str, Any]) -> None:
    """S8: ``runs`` concurrent ``ainvoke`` of an ``n``-node chain, each its own thread id,
    ``durability="sync"``, all on one saver: AsyncSqliteSaver (a fresh file per batch, its
    one connection) or AsyncPostgresSaver over a psycopg_pool.AsyncConnectionPool of 10
    (the LangGraph docs' setup: autocommit, no prepared statements, dict rows; a fresh
    schema for the job, ``$INTERLOCK_BENCH_POSTGRES``)."""
    n = p["n"]
    graph = chain(n)
    if p["backend"] == "sqlite":
        tmp = Path(tempfile.mkdtemp(prefix="langgraph-bench-"))
        k = 0

        async def batch(count: int) -> None:
            nonlocal k
            k += 1
            async with AsyncSqliteSaver.from_conn_string(str(tmp / f"s8-{k}.db")) as saver:
                compiled = graph.compile(checkpointer=saver)
                states = await asyncio.gather(*(
                    compiled.ainvoke({"i": 0}, _config(n, uuid.uuid4().hex), durability="sync")
                    for _ in range(count)))
            for state in states:
                _check(state, i=n)

        try:
            await concurrent_durable(em, p, "", batch)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    with fresh_pg_schema(em, "langgraph") as url:
        if url is None:
            return
        async with AsyncConnectionPool(
                url, max_size=10, open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0,
                        "row_factory": dict_row}) as pool:
            saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await saver.setup()
            compiled = graph.compile(checkpointer=saver)

            async def pg_batch(count: int) -> None:
                states = await asyncio.gather(*(
                    compiled.ainvoke({"i": 0}, _config(n, uuid.uuid4().hex), durability="sync")
                    for _ in range(count)))
                for state in states:
                    _check(state, i=n)

            await concurrent_durable(em, p, "", pg_batch)


def s6(em: Emitter, p: dict[str, Any]) -> None:
    run_s6(em, import_stmt="import langgraph.graph",
           api_stmt="from langgraph.graph import StateGraph, START, END", cli=None,
           cli_absent="LangGraph ships no CLI of its own (langgraph-cli is a separate package "
                      "for its API server, not installed)",
           count=p["trials"])


async def s9(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    graph = mapped(n).compile()
    cfg = _config(n + 2)

    async def once() -> None:
        _check(await graph.ainvoke({"n": n}, cfg), hits=n, total=n)

    for k, (dt, cpu) in enumerate(await trials(once, warmup=p["warmup"], count=p["trials"])):
        em.value("wall_ms", dt * 1000, "ms", trial=k)
        em.value("per_item_us", dt / n * 1e6, "us", trial=k)
        em.value("per_item_cpu_us", cpu / n * 1e6, "us", trial=k)


def _version() -> str:
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in
                     ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
                      "aiosqlite", "langgraph-checkpoint-postgres", "psycopg"))


if __name__ == "__main__":
    main(ENGINE, {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "S5": s5, "S6": s6, "S7": s7,
                  "S8": s8, "S9": s9},
         _version)
