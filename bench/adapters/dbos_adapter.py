"""DBOS Transact's side of the benchmark: ``python dbos_adapter.py SCENARIO PARAMS_JSON``.

Runs with bench/.venv-dbos/bin/python (bench/setup_dbos.sh), for the durable scenarios
only: S5 (one run's durable steps) and S8 (concurrent durable runs); the others print a
``skipped`` line (bench/run.py does not start this adapter for them). DBOS is the
lightest durable-execution library measured: a workflow is a Python function, each
``@DBOS.step`` is checkpointed -- its output written to the system database -- before the
workflow goes on, so a step is one row and one commit.

- Every node is an ``async def`` step returning ``i + 1``, called from an ``async def``
  ``@DBOS.workflow``: the chain calls it ``n`` times, the loop while ``i < n`` (plain
  Python decides, where interlock evaluates and records a condition).
- SQLite twice: tuned as interlock's store is (WAL, ``synchronous=NORMAL``, on every
  connection DBOS's engine opens) for the rows named as interlock's, and DBOS's default
  engine as it comes (the rollback journal, SQLite's ``synchronous=FULL``) for the
  ``@default`` rows. S8's PostgreSQL: ``$INTERLOCK_BENCH_POSTGRES``, a fresh
  ``dbos_system_schema`` per job, dropped afterwards.
- ``DBOS.launch()`` (the system database's file and schema made, its threads started)
  runs before the clock, on a fresh database file per trial (S5) or batch (S8), and is
  reported apart as ``launch_ms``; ``DBOS.destroy()`` (about 0.8 s here, mostly joining its
  threads) after the clock. interlock's and LangGraph's clocks include opening their
  store, so this favours DBOS.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import Emitter, bench_postgres, db_size_kb, main
from dbos import DBOS
from sqlalchemy import event

ENGINE = "dbos"
NOT_MEASURED = ("DBOS is measured where a durable step is: S5 and S8 (the in-memory "
                "scenarios have no DBOS counterpart: every step of a workflow is stored)")
APP = "interlock-bench"

_tuned = False  # WAL + synchronous=NORMAL on the SQLite connections opened from now on


@event.listens_for(sa.engine.Engine, "connect")
def _tune(dbapi_conn: Any, _record: Any) -> None:
    if _tuned and isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.execute("PRAGMA journal_mode = WAL")
        dbapi_conn.execute("PRAGMA synchronous = NORMAL")


@DBOS.step()
async def inc(i: int) -> int:
    return i + 1


@DBOS.workflow()
async def chain(n: int) -> int:
    """S5 chain, S8: ``n`` steps one after the other."""
    i = 0
    for _ in range(n):
        i = await inc(i)
    return i


@DBOS.workflow()
async def loop(n: int) -> int:
    """S5 loop: the step again while ``i < n``."""
    i = 0
    while True:
        i = await inc(i)
        if not i < n:
            return i


def launch(url: str, *, tuned: bool, schema: str | None = None) -> float:
    """DBOS on the system database ``url``, launched: the seconds it took."""
    global _tuned
    _tuned = tuned
    t0 = time.perf_counter()
    config: dict[str, Any] = {"name": APP, "system_database_url": url,
                              "log_level": "WARNING"}
    if schema is not None:
        config["dbos_system_schema"] = schema
    DBOS(config=config)  # type: ignore[arg-type]  # a DBOSConfig (a TypedDict)
    DBOS.launch()
    return time.perf_counter() - t0


def destroy() -> None:
    DBOS.destroy(destroy_registry=False)  # (the workflows stay registered for the next)


def _check(got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"expected i == {want}, got {got!r}")


def _journal(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


# -- scenarios -----------------------------------------------------------------------------

async def s5(em: Emitter, p: dict[str, Any]) -> None:
    """One workflow of ``n`` durable steps, a fresh SQLite file per trial: per step, wall
    and CPU; the file's size after DBOS let it go; tuned (WAL+NORMAL), then DBOS's
    default engine (at most 3 trials: its steps wait for fsyncs)."""
    n, warm_n = p["n"], p.get("warmup_n", p["n"])
    wf = chain if p["graph"] == "chain" else loop
    tmp = Path(tempfile.mkdtemp(prefix="dbos-bench-"))
    k = 0

    async def once(steps: int, tuned: bool) -> tuple[float, float, float, float]:
        nonlocal k
        k += 1
        path = tmp / f"run{k}.sqlite"
        launch_s = launch(f"sqlite:///{path}", tuned=tuned)
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            got = await wf(steps)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            destroy()
        _check(got, steps)
        want = "wal" if tuned else "delete"
        if _journal(path) != want:
            raise RuntimeError(f"DBOS's SQLite file is in journal mode {_journal(path)!r}, "
                               f"not {want!r}")
        return dt, cpu, launch_s, db_size_kb(path)

    try:
        for tuned, suffix, count in ((True, "", p["trials"]),
                                     (False, "@default", min(p["trials"], 3))):
            for _ in range(p["warmup"]):
                await once(warm_n, tuned)
            gc.collect()
            for t in range(count):
                dt, cpu, launch_s, size = await once(n, tuned)
                em.value("per_step_us" + suffix, dt / n * 1e6, "us", trial=t)
                em.value("per_step_cpu_us" + suffix, cpu / n * 1e6, "us", trial=t)
                em.value("wall_ms" + suffix, dt * 1000, "ms", trial=t)
                em.value("launch_ms" + suffix, launch_s * 1000, "ms", trial=t)
                em.value("db_kb" + suffix, size, "KiB", trial=t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _batches(em: Emitter, p: dict[str, Any], suffix: str,
                   start: Callable[[], float], batch: Callable[[int], Awaitable[None]]) -> None:
    """S8 as `_common.concurrent_durable` times it, with DBOS launched (``start``) before
    each batch's clock and destroyed after it."""
    runs, n = p["runs"], p["n"]

    async def one(count: int) -> tuple[float, float]:
        start()
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            await batch(count)
            return time.perf_counter() - t0, time.process_time() - c0
        finally:
            destroy()

    for _ in range(p["warmup"]):
        await one(p.get("warmup_runs", runs))
    gc.collect()
    for k in range(p["trials"]):
        dt, cpu = await one(runs)
        em.value("runs_per_s" + suffix, runs / dt, "runs/s", trial=k)
        em.value("per_step_us" + suffix, dt / (runs * n) * 1e6, "us", trial=k)
        em.value("per_step_cpu_us" + suffix, cpu / (runs * n) * 1e6, "us", trial=k)


async def s8(em: Emitter, p: dict[str, Any]) -> None:
    """``runs`` workflows of an ``n``-step chain at once (``asyncio.gather``), one system
    database for all: SQLite (a fresh file per batch; tuned, then DBOS's default engine)
    or PostgreSQL (``$INTERLOCK_BENCH_POSTGRES``, a fresh schema for the job)."""
    n = p["n"]

    async def batch(count: int) -> None:
        for got in await asyncio.gather(*(chain(n) for _ in range(count))):
            _check(got, n)

    if p["backend"] == "sqlite":
        tmp = Path(tempfile.mkdtemp(prefix="dbos-bench-"))
        k = 0
        try:
            for tuned, suffix in ((True, ""), (False, "@default")):
                def start(tuned: bool = tuned) -> float:
                    nonlocal k
                    k += 1
                    return launch(f"sqlite:///{tmp / f's8-{k}.sqlite'}", tuned=tuned)

                await _batches(em, p, suffix, start, batch)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    base = bench_postgres()
    if base is None:
        em.skipped("*", "no PostgreSQL: set $INTERLOCK_BENCH_POSTGRES (see bench/README.md)")
        return
    import psycopg

    schema = f"dbos_s8_{os.getpid()}"
    try:
        await _batches(em, p, "", lambda: launch(base, tuned=False, schema=schema), batch)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def not_measured(em: Emitter, p: dict[str, Any]) -> None:
    em.skipped("*", NOT_MEASURED)


def _version() -> str:
    names = ("dbos", "sqlalchemy", "psycopg")
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in names)


if __name__ == "__main__":
    main(ENGINE, {"S5": s5, "S8": s8,
                  **{s: not_measured for s in ("S1", "S2", "S3", "S4", "S6", "S7", "S9")}},
         _version)
