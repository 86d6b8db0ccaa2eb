"""What every adapter shares: the command line, JSON-line output, trials, process timings.

Standard library only: both interlock's venv and bench/.venv-langgraph import it.

An adapter is run as ``python ADAPTER.py SCENARIO PARAMS_JSON`` and prints one JSON
object per line on stdout, each one measurement::

    {"engine", "scenario", "param", "metric", "value", "unit", "trial"}

or ``{"engine", "scenario", "param", "metric", "skipped": REASON}`` when the
measurement cannot be made here, or ``{..., "error": MESSAGE}`` when it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

SLEEP_S = 0.05  # S2's sleeping branches
ITEM = "x" * 100  # S7: what each iteration appends


class Emitter:
    def __init__(self, engine: str, scenario: str, param: str) -> None:
        self.engine = engine
        self.scenario = scenario
        self.param = param

    def _out(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def value(self, metric: str, value: float | str, unit: str, *, trial: int | None = None,
              **extra: Any) -> None:
        obj: dict[str, Any] = {"engine": self.engine, "scenario": self.scenario,
                               "param": self.param, "metric": metric,
                               "value": round(value, 3) if isinstance(value, float) else value,
                               "unit": unit}
        if trial is not None:
            obj["trial"] = trial
        obj.update(extra)
        self._out(obj)

    def skipped(self, metric: str, reason: str) -> None:
        self._out({"engine": self.engine, "scenario": self.scenario, "param": self.param,
                   "metric": metric, "skipped": reason})

    def error(self, metric: str, message: str) -> None:
        self._out({"engine": self.engine, "scenario": self.scenario, "param": self.param,
                   "metric": metric, "error": message})


def parse_argv(argv: Sequence[str]) -> tuple[str, dict[str, Any]]:
    if len(argv) != 3:
        sys.exit(f"usage: {Path(argv[0]).name} SCENARIO PARAMS_JSON")
    params = json.loads(argv[2])
    if not isinstance(params, dict):
        sys.exit("PARAMS_JSON must be a JSON object")
    return argv[1], params


def param_label(scenario: str, p: dict[str, Any]) -> str:
    """The row label of a measurement: the same for every engine."""
    if "label" in p:
        return str(p["label"])
    if scenario == "S2" and p.get("sleep_ms"):
        return f"N={p['n']} sleep={p['sleep_ms']}ms"
    if "n" in p:
        return f"N={p['n']}"
    return "-"


async def trials(run_once: Callable[[], Awaitable[Any]], *, warmup: int,
                 count: int) -> list[tuple[float, float]]:
    """``warmup`` untimed runs, then ``count`` timed ones back to back:
    [(wall s, CPU s), ...].

    CPU time is the whole process's (every thread's): on a loaded machine it shows what
    the run cost when wall time also counts the time other processes had the CPU. The
    collector runs once, after the warm-up and before one more untimed run -- not before
    every trial: the run right after a full collection is slower (0.6 ms for a 10-node
    interlock run, 1.6 ms for LangGraph's, measured here), which would inflate small
    scenarios. The collector stays enabled, as in real use.
    """
    for _ in range(warmup):
        await run_once()
    gc.collect()
    await run_once()
    out = []
    for _ in range(count):
        c0, t0 = time.process_time(), time.perf_counter()
        await run_once()
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


async def per_step_trials(em: Emitter, p: dict[str, Any], run_once: Callable[[], Awaitable[Any]],
                          steps: int, metric: str) -> None:
    """S1 and S3: `trials` of ``run_once`` (``p``'s warmup and trials), each emitted as
    ``{metric}_us`` and ``{metric}_cpu_us`` per one of its ``steps``, and ``wall_ms``."""
    for k, (dt, cpu) in enumerate(await trials(run_once, warmup=p["warmup"], count=p["trials"])):
        em.value(f"{metric}_us", dt / steps * 1e6, "us", trial=k)
        em.value(f"{metric}_cpu_us", cpu / steps * 1e6, "us", trial=k)
        em.value("wall_ms", dt * 1000, "ms", trial=k)


async def concurrent_runs(em: Emitter, p: dict[str, Any],
                          start: Callable[[], Awaitable[Any]],
                          check: Callable[[Any], None]) -> None:
    """S4: ``p["runs"]`` runs at once with ``asyncio.gather``: runs/s, CPU per run, RSS.

    ``start()`` starts one run (a coroutine); ``check`` raises on a wrong result.
    """
    runs = p["runs"]
    em.value("rss_before_mb", peak_rss_mb(), "MB")

    async def batch(count: int) -> None:
        for result in await asyncio.gather(*(start() for _ in range(count))):
            check(result)

    for _ in range(p["warmup"]):
        await batch(p.get("warmup_runs", runs))

    async def once() -> None:
        await batch(runs)

    for k, (dt, cpu) in enumerate(await trials(once, warmup=0, count=p["trials"])):
        em.value("runs_per_s", runs / dt, "runs/s", trial=k)
        em.value("cpu_per_run_us", cpu / runs * 1e6, "us", trial=k)
    em.value("peak_rss_mb", peak_rss_mb(), "MB")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def db_size_kb(path: Path) -> float:
    """A SQLite file's size with its WAL (after the connection closed the WAL is
    normally checkpointed into the file and gone)."""
    total = 0
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total / 1024


def _time_once(cmd: list[str], env: dict[str, str]) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0.0, f"{' '.join(cmd)}: {exc}"
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        return 0.0, f"{' '.join(cmd)} exited {proc.returncode}: " + (tail[-1] if tail else "")
    return dt, None


def run_s6(em: Emitter, *, import_stmt: str, api_stmt: str, cli: list[str] | None,
           cli_absent: str, count: int) -> None:
    """S6: wall-clock start-up costs of fresh processes, ``count`` rounds after one untimed
    round (which warms the file cache). Each round runs the bare interpreter, the import
    and the CLI back to back, so a change in the machine's load hits all three alike.
    ``import_only_ms`` is a round's import minus its bare ``python -c pass``;
    ``import_api_ms`` imports what building a workflow needs (a package may load its
    public names lazily, which makes the bare import cheap and moves the cost there)."""
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cmds = {"python_startup_ms": [py, "-c", "pass"], "import_ms": [py, "-c", import_stmt],
            "import_api_ms": [py, "-c", api_stmt]}
    if cli is None:
        em.skipped("cli_help_ms", cli_absent)
    else:
        cmds["cli_help_ms"] = cli
    failed: dict[str, str] = {}
    for r in range(count + 1):
        got: dict[str, float] = {}
        for metric, cmd in cmds.items():
            if metric in failed:
                continue
            dt, why = _time_once(cmd, env)
            if why is not None:
                failed[metric] = why
                (em.skipped if metric == "cli_help_ms" else em.error)(metric, why)
                continue
            got[metric] = dt
        if r == 0:
            continue
        for metric, dt in got.items():
            em.value(metric, dt * 1000, "ms", trial=r - 1)
        if "import_ms" in got and "python_startup_ms" in got:
            em.value("import_only_ms", (got["import_ms"] - got["python_startup_ms"]) * 1000,
                     "ms", trial=r - 1)


def main(engine: str, scenarios: dict[str, Callable[[Emitter, dict[str, Any]], Any]],
         version: Callable[[], str]) -> None:
    scenario, params = parse_argv(sys.argv)
    em = Emitter(engine, scenario, param_label(scenario, params))
    if scenario == "meta":
        em.value("version", version(), "")
        em.value("python", sys.version.split()[0], "")
        return
    fn = scenarios.get(scenario)
    if fn is None:
        sys.exit(f"unknown scenario {scenario!r}; known: {', '.join(sorted(scenarios))}")
    result = fn(em, params)
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def bench_postgres() -> str | None:
    """S8's PostgreSQL server: ``$INTERLOCK_BENCH_POSTGRES`` (a URL), or None."""
    return os.environ.get("INTERLOCK_BENCH_POSTGRES") or None


def pg_schema(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on its search_path (a libpq ``options`` parameter)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def fresh_pg_schema(em: Emitter, engine: str) -> Iterator[str | None]:
    """S8: a URL whose tables go in a new schema on `bench_postgres`'s server (dropped
    afterwards), or None (and the job's ``skipped`` line) without a server. psycopg is
    in both venvs (interlock's postgres extra; LangGraph's Postgres saver)."""
    base = bench_postgres()
    if base is None:
        em.skipped("*", "no PostgreSQL: set $INTERLOCK_BENCH_POSTGRES (see bench/README.md)")
        yield None
        return
    import psycopg

    schema = f"{engine}_s8_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield pg_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def concurrent_durable(em: Emitter, p: dict[str, Any], suffix: str,
                             batch: Callable[[int], Awaitable[None]]) -> None:
    """S8: ``batch(count)`` runs ``count`` runs at once (each p["n"] steps) and checks
    them: runs/s, and wall and CPU time per step (one node execution), named with
    ``suffix`` (``""`` or ``"@sync=full"``)."""
    runs, n = p["runs"], p["n"]
    for _ in range(p["warmup"]):
        await batch(p.get("warmup_runs", runs))
    gc.collect()
    for k in range(p["trials"]):
        c0, t0 = time.process_time(), time.perf_counter()
        await batch(runs)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        em.value("runs_per_s" + suffix, runs / dt, "runs/s", trial=k)
        em.value("per_step_us" + suffix, dt / (runs * n) * 1e6, "us", trial=k)
        em.value("per_step_cpu_us" + suffix, cpu / (runs * n) * 1e6, "us", trial=k)
