"""Run the benchmark scenarios through every engine's adapter and print a comparison.

    bash bench/setup_langgraph.sh && python bench/run.py             # everything, ~10 min
    bash bench/setup_pydantic_graph.sh                               # optional third engine
    bash bench/setup_dbos.sh                                         # optional: DBOS (S5, S8)
    python bench/run.py --quick                                      # fewer trials, ~3 min
    python bench/run.py --only S1,S3 --engines interlock             # a subset

Each (scenario, parameters) pair runs as a fresh subprocess per engine, with that
engine's python: interlock with this python (the project venv), LangGraph with
bench/.venv-langgraph/bin/python, pydantic-graph (S1 and S3 only, when its venv exists)
with bench/.venv-pydantic-graph/bin/python, DBOS Transact (S5 and S8 only, when its venv
exists) with bench/.venv-dbos/bin/python, and the floor (S1, S3 and S5 only: a bare loop
producing the log records interlock writes, and in S5 committing them a step at a time,
nothing else) with this python. Adapters
print one JSON line per measurement; this driver streams them to stdout (unless
--quiet), writes them all to bench/results/latest.jsonl, and prints a table of medians
with the ratios interlock/LangGraph, interlock/pydantic-graph, interlock/DBOS and
interlock/floor, plus the same table as Markdown in bench/results/latest.md. See
bench/README.md for the scenarios and how to read the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ADAPTERS = BENCH / "adapters"
RESULTS = BENCH / "results"
LANGGRAPH_PY = BENCH / ".venv-langgraph" / "bin" / "python"
PYDANTIC_GRAPH_PY = BENCH / ".venv-pydantic-graph" / "bin" / "python"
DBOS_PY = BENCH / ".venv-dbos" / "bin" / "python"

ENGINES = ("interlock", "langgraph", "pydantic-graph", "dbos", "floor")
# the engines left out of a default run (no --engines) when their venv is missing
OPTIONAL = ("pydantic-graph", "dbos")
# the engines that run with this python (the project venv)
PROJECT_ENGINES = {"interlock", "floor"}
# engine -> (its python outside the project venv, the script that makes that venv)
VENVS = {"langgraph": (LANGGRAPH_PY, "bench/setup_langgraph.sh"),
         "pydantic-graph": (PYDANTIC_GRAPH_PY, "bench/setup_pydantic_graph.sh"),
         "dbos": (DBOS_PY, "bench/setup_dbos.sh")}
# the engines that run only some scenarios: the rest get a `skipped` line, no process
COVERS = {"pydantic-graph": {"S1", "S3"}, "dbos": {"S5", "S8"}, "floor": {"S1", "S3", "S5"}}
NOT_COVERED = {"pydantic-graph": "not measured for pydantic-graph: the issue's target against "
                                 "it is per-node overhead (S1, S3) with no persistence",
               "dbos": "not measured for DBOS: the issue's targets against it are the durable "
                       "step (S5) and concurrent durable runs (S8)",
               "floor": "the floor (the log records alone, committed a step at a time in S5) "
                        "is measured only where interlock's per-node targets apply: S1, S3 "
                        "and S5"}
# engine -> (its column, its ratio column); interlock is the numerator of every ratio
COLUMNS = {"langgraph": ("langgraph", "ratio il/lg"),
           "pydantic-graph": ("pydantic-graph", "ratio il/pg"),
           "dbos": ("dbos", "ratio il/dbos"),
           "floor": ("floor", "ratio il/floor")}
SCENARIOS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9")

# metrics where a higher value is better (for the rest, lower is better)
HIGHER_IS_BETTER = {"runs_per_s", "overlap"}
# an interlock-only metric compared against another LangGraph metric
COMPARE_WITH = {"per_step_us@sync=full": "per_step_us",
                "per_step_cpu_us@sync=full": "per_step_cpu_us",
                "runs_per_s@sync=full": "runs_per_s"}
# ... and for DBOS, whose SQLite rows are WAL+NORMAL (as interlock's default): interlock's
# synchronous=full against DBOS's default engine (rollback journal, synchronous=FULL),
# as against LangGraph's saver's default
COMPARE_WITH_ENGINE = {("dbos", "per_step_us@sync=full"): "per_step_us@default",
                       ("dbos", "per_step_cpu_us@sync=full"): "per_step_cpu_us@default",
                       ("dbos", "runs_per_s@sync=full"): "runs_per_s@default"}

TIMEOUT_S = 900

# LangGraph 1.2.24's figures on the reference machine (the issue's targets): checked
# against what LangGraph does here, to tell how this machine and its load compare.
REFERENCE = [
    ("S1", "N=1000", "per_node_us", 430, 650),
    ("S3", "N=1000", "per_iter_us", 800, 800),
    ("S5", "chain N=100", "per_step_us", 1800, 2100),
    ("S5", "loop N=1000", "per_step_us", 1800, 2100),
    ("S4", "-", "runs_per_s", 276, 276),
    ("S6", "-", "import_ms", 1100, 1100),
]
# pydantic-graph's figure in the issue (per node, 1000-node chain), and its target: at
# most 1/5 of pydantic-graph's per-node overhead (S1 N=1000 and S3).
PG_REFERENCE = [("S1", "N=1000", "per_node_us", 160, 190)]
PG_TARGET = 0.2


@dataclass
class Job:
    scenario: str
    params: dict[str, Any]


def plan(quick: bool) -> list[Job]:
    """Every (scenario, parameters) to run. ``warmup`` untimed runs, then ``trials`` timed
    ones per process; the table shows their median."""

    def t(full: int, fast: int) -> int:
        return fast if quick else full

    jobs = [
        Job("S1", {"n": 10, "warmup": 3, "trials": t(20, 10)}),
        Job("S1", {"n": 100, "warmup": 2, "trials": t(20, 5)}),
        Job("S1", {"n": 1000, "warmup": 1, "trials": t(7, 3)}),
        Job("S2", {"n": 10, "warmup": 3, "trials": t(10, 5)}),
        Job("S2", {"n": 100, "warmup": 2, "trials": t(10, 5)}),
        Job("S2", {"n": 10, "sleep_ms": 50, "warmup": 1, "trials": t(5, 3)}),
        Job("S2", {"n": 100, "sleep_ms": 50, "warmup": 1, "trials": t(5, 3)}),
        Job("S3", {"n": 1000, "warmup": 1, "trials": t(7, 3)}),
        Job("S4", {"runs": 1000, "warmup": 1, "warmup_runs": 100, "trials": t(5, 2)}),
        Job("S5", {"graph": "chain", "n": 100, "label": "chain N=100", "warmup": 1,
                   "trials": t(5, 3)}),
        Job("S5", {"graph": "loop", "n": 1000, "label": "loop N=1000", "warmup": 1,
                   "warmup_n": 100, "trials": t(5, 1)}),
        Job("S6", {"trials": t(5, 3)}),
        Job("S7", {"n": 10, "warmup": 1, "trials": t(5, 3)}),
        Job("S7", {"n": 100, "warmup": 1, "trials": t(5, 3)}),
        Job("S7", {"n": 1000, "warmup": 1, "warmup_n": 100, "trials": t(3, 1)}),
        # 200 concurrent runs of a 10-node chain, one store (URL) for all, in one process
        Job("S8", {"backend": "sqlite", "n": 10, "runs": 200, "label": "sqlite 200x10",
                   "warmup": 1, "warmup_runs": 50, "trials": t(3, 2)}),
        Job("S8", {"backend": "postgres", "n": 10, "runs": 200, "label": "postgres 200x10",
                   "warmup": 1, "warmup_runs": 50, "trials": t(3, 2)}),
        Job("S9", {"n": 1000, "warmup": 1, "trials": t(7, 3)}),
    ]
    return jobs


# -- running adapters -----------------------------------------------------------------------

def engine_python(engine: str) -> Path | None:
    if engine in PROJECT_ENGINES:
        return Path(sys.executable)
    py = VENVS[engine][0]
    return py if py.exists() else None


def _missing(engine: str) -> str:
    py, setup = VENVS[engine]
    return f"{py} is missing: run bash {setup}"


def run_adapter(engine: str, scenario: str, params: dict[str, Any],
                echo: bool) -> list[dict[str, Any]]:
    """Run one adapter process; its JSON lines (or one error line)."""
    py = engine_python(engine)
    base = {"engine": engine, "scenario": scenario,
            "param": params.get("label") or _label(scenario, params), "metric": "*"}
    if py is None:
        return [{**base, "skipped": _missing(engine)}]
    if scenario != "meta" and scenario not in COVERS.get(engine, (scenario,)):
        line = {**base, "skipped": NOT_COVERED[engine]}
        if echo:
            print(json.dumps(line), flush=True)
        return [line]
    adapter = ADAPTERS / f"{engine.replace('-', '_')}_adapter.py"
    cmd = [str(py), str(adapter), scenario, json.dumps(params)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONPATH", None)
    if engine in PROJECT_ENGINES:
        # this checkout's interlock, not whichever one the venv has installed (an
        # editable install of another worktree would be measured instead)
        env["PYTHONPATH"] = str(BENCH.parent)
    lines: list[dict[str, Any]] = []
    with tempfile.TemporaryFile("w+") as errf:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True,
                                    env=env, cwd=BENCH)
        except OSError as exc:
            return [{**base, "error": f"cannot start {cmd[0]}: {exc}"}]
        assert proc.stdout is not None
        watchdog = threading.Timer(TIMEOUT_S, proc.kill)  # a hung adapter is killed
        watchdog.start()
        try:
            for raw in proc.stdout:
                raw = raw.strip()
                if not raw:
                    continue
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError:
                    print(f"[{engine}] {raw}", file=sys.stderr)
                    continue
                lines.append(obj)
                if echo:
                    print(json.dumps(obj), flush=True)
            rc = proc.wait()
        finally:
            watchdog.cancel()
        errf.seek(0)
        err = errf.read()
    if rc != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        why = f"killed after {TIMEOUT_S} s" if rc == -signal.SIGKILL else f"exited {rc}"
        lines.append({**base, "error": f"adapter {why}: {tail}"})
        if echo:
            print(json.dumps(lines[-1]), flush=True)
    return lines


def _label(scenario: str, p: dict[str, Any]) -> str:
    """The row label adapters use (`_common.param_label`), for the driver's own lines."""
    if scenario == "S2" and p.get("sleep_ms"):
        return f"N={p['n']} sleep={p['sleep_ms']}ms"
    return f"N={p['n']}" if "n" in p else "-"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError):
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory": mem, "commit": _commit(),
            "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_start": _loadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _commit() -> str:
    """The checkout's commit, ``+dirty`` when interlock/ has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "../interlock"],
                               cwd=BENCH, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+dirty" if dirty else "")


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# -- the table -------------------------------------------------------------------------------

@dataclass
class Row:
    scenario: str
    param: str
    metric: str
    unit: str = ""
    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    notes: dict[str, str] = field(default_factory=dict)  # engine -> "skipped"/"error"

    def median(self, engine: str) -> float | None:
        v = self.values.get(engine)
        return statistics.median(v) if v else None


def _shown(scenario: str, param: str, metric: str, cpu: bool) -> bool:
    if "cpu" in metric:
        return cpu
    if metric.startswith("wall_ms"):
        return scenario == "S2" and "sleep" in param
    return True


def build_rows(lines: list[dict[str, Any]], cpu: bool = False) -> tuple[list[Row], list[str]]:
    rows: dict[tuple[str, str, str], Row] = {}
    notes: list[str] = []
    # a whole (scenario, param) skipped for an engine (metric "*"): it marks that engine's
    # cells in the other engines' rows, and makes one note per engine and reason
    wild: list[tuple[str, str, str]] = []
    wild_notes: dict[tuple[str, str], list[str]] = {}
    # the floor's lines last: the rows (and their order) stay the engines' own
    for obj in sorted(lines, key=lambda o: o.get("engine") == "floor"):
        sc = obj.get("scenario")
        if sc in (None, "meta", "machine", "summary"):
            continue
        key = (sc, obj.get("param", "-"), obj.get("metric", "*"))
        engine = obj["engine"]
        if key[2] == "*" and "skipped" in obj:
            wild.append((sc, key[1], engine))
            wild_notes.setdefault((engine, obj["skipped"]), []).append(f"{sc} {key[1]}")
            continue
        if "skipped" in obj or "error" in obj:
            kind = "skipped" if "skipped" in obj else "error"
            notes.append(f"{engine} {sc} {key[1]} {key[2]}: {kind}: {obj[kind]}")
            row = rows.setdefault(key, Row(*key))
            row.notes[engine] = kind
            continue
        if not isinstance(obj.get("value"), int | float) or not _shown(*key, cpu):
            continue
        row = rows.setdefault(key, Row(*key, unit=obj.get("unit", "")))
        row.unit = row.unit or obj.get("unit", "")
        row.values[engine].append(float(obj["value"]))
    for sc, param, engine in wild:
        same = [r for r in rows.values() if (r.scenario, r.param) == (sc, param)]
        for r in same or [rows.setdefault((sc, param, "*"), Row(sc, param, "*"))]:
            if not r.values.get(engine):
                r.notes.setdefault(engine, "skipped")
    for (engine, reason), where in wild_notes.items():
        notes.append(f"{engine} {', '.join(where)}: skipped: {reason}")
    ordered = sorted(rows.values(), key=lambda r: (r.scenario, _param_order(r.param)))
    return _with_derived(ordered, cpu), notes


def _param_order(param: str) -> tuple[int, str]:
    digits = "".join(c for c in param.split("=")[1] if c.isdigit()) if "=" in param else ""
    return (int(digits) if digits else 0, param)


def _with_derived(rows: list[Row], cpu: bool) -> list[Row]:
    """Add growth rows: S1 per-node cost at N=1000 over N=100, S7 database size at 1000
    iterations over 100."""
    by = {(r.scenario, r.param, r.metric): r for r in rows}
    out = list(rows)
    for sc, metric, lo, hi, label in (
        ("S1", "per_node_us", "N=100", "N=1000", "growth per_node N=1000/N=100"),
        ("S1", "per_node_cpu_us", "N=100", "N=1000", "growth per_node_cpu N=1000/N=100"),
        ("S7", "db_kb", "N=100", "N=1000", "growth db_kb N=1000/N=100"),
    ):
        a, b = by.get((sc, lo, metric)), by.get((sc, hi, metric))
        if a is None or b is None:
            continue
        if not _shown(sc, lo, metric, cpu):
            continue
        g = Row(sc, "-", label, unit="x")
        for engine in ENGINES:
            ma, mb = a.median(engine), b.median(engine)
            if ma and mb is not None:
                g.values[engine].append(mb / ma)
        idx = max(i for i, r in enumerate(out) if r.scenario == sc) + 1
        out.insert(idx, g)
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(rows: list[Row], others: tuple[str, ...] = ("langgraph",)) -> list[list[str]]:
    """The table: interlock's column, then for each engine of ``others`` its column and
    the ratio interlock / that engine."""
    head = ["scenario", "param", "metric", "unit", "interlock"]
    for engine in others:
        head += COLUMNS[engine]
    body = [[*head, "better"]]
    by = {(r.scenario, r.param, r.metric): r for r in rows}
    for r in rows:
        il = r.median("interlock")
        cells = [r.notes.get("interlock", "-") if il is None else _fmt(il)]
        for engine in others:
            v = r.median(engine)
            like = COMPARE_WITH_ENGINE.get((engine, r.metric)) or COMPARE_WITH.get(r.metric)
            if v is None and like is not None:
                other = by.get((r.scenario, r.param, like))
                v = other.median(engine) if other else None
            cells.append(r.notes.get(engine, "-") if v is None else _fmt(v))
            cells.append(_fmt(il / v) if il is not None and v else "-")
        better = "" if r.metric.startswith("growth") else (
            "higher" if r.metric.split("@")[0] in HIGHER_IS_BETTER else "lower")
        body.append([r.scenario, r.param, r.metric, r.unit, *cells, better])
    return body


def render_text(body: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in body) for i in range(len(body[0]))]
    right = set(range(4, len(body[0]) - 1))
    out = []
    for k, row in enumerate(body):
        out.append("  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_markdown(body: list[list[str]]) -> str:
    out = ["| " + " | ".join(body[0]) + " |",
           "|" + "|".join("---:" if 4 <= i < len(body[0]) - 1 else "---"
                          for i in range(len(body[0])))
           + "|"]
    out += ["| " + " | ".join(row) + " |" for row in body[1:]]
    return "\n".join(out)


def _target(value: float, bound: float, *, most: bool, unit: str = "") -> str:
    """``(target: at most 0.10: met)``: the bound and whether ``value`` keeps it."""
    kept = value <= bound if most else value >= bound
    return (f"(target: {'at most' if most else 'at least'} {bound:g}{unit}: "
            f"{'met' if kept else 'NOT met'})")


def checks(rows: list[Row]) -> list[str]:
    """Lines to read next to the table: interlock's growth, LangGraph and pydantic-graph
    here against their reference figures, interlock against the pydantic-graph target,
    the floor against LangGraph and interlock."""
    by = {(r.scenario, r.param, r.metric): r for r in rows}
    out = []
    for what, metric in (("wall", "per_node"), ("CPU", "per_node_cpu")):
        g = by.get(("S1", "-", f"growth {metric} N=1000/N=100"))
        if g is None or g.median("interlock") is None:
            continue
        lg, pg = g.median("langgraph"), g.median("pydantic-graph")
        out.append(f"S1 interlock per-node {what} time, N=1000 over N=100: "
                   f"{g.median('interlock'):.2f}x (flat is 1.0; target: it does not grow: "
                   f"{'met' if g.median('interlock') <= 1.1 else 'NOT met'})"
                   + (f"; LangGraph: {lg:.2f}x" if lg is not None else "")
                   + (f"; pydantic-graph: {pg:.2f}x" if pg is not None else ""))
    for engine, name, refs in (("langgraph", "LangGraph", REFERENCE),
                               ("pydantic-graph", "pydantic-graph", PG_REFERENCE)):
        for sc, param, metric, lo, hi in refs:
            r = by.get((sc, param, metric))
            v = r.median(engine) if r else None
            if v is None:
                continue
            ref = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
            mid = (lo + hi) / 2
            slower = mid / v if metric in HIGHER_IS_BETTER else v / mid
            pace = (f"{slower:.1f}x slower here" if slower >= 1
                    else f"{1 / slower:.1f}x faster here")
            out.append(f"{name} {sc} {param} {metric}: {_fmt(v)} here vs {ref} on the "
                       f"reference machine ({pace})")
    for sc, metric in (("S1", "per_node_us"), ("S3", "per_iter_us")):
        ratios = []
        for m in (metric, metric.replace("_us", "_cpu_us")):
            r = by.get((sc, "N=1000", m))
            il, pg = (r.median("interlock"), r.median("pydantic-graph")) if r else (None, None)
            if il is not None and pg:
                ratios.append(f"{il / pg:.2f} {'CPU' if 'cpu' in m else 'wall'}")
        if ratios:
            out.append(f"interlock/pydantic-graph {sc} N=1000 {metric}: {', '.join(ratios)} "
                       f"(target: at most {PG_TARGET:.2f})")
    for sc, metric in (("S1", "per_node_us"), ("S3", "per_iter_us")):
        r = by.get((sc, "N=1000", metric))
        il, lg = (r.median("interlock"), r.median("langgraph")) if r else (None, None)
        if il is not None and lg:
            out.append(f"{sc} N=1000 {metric}: interlock/LangGraph {il / lg:.3f} "
                       + _target(il / lg, 0.05, most=True))
    out += _floor_lines(by)
    out += _durable_lines(by)
    return out


def _durable_lines(by: dict[tuple[str, str, str], Row]) -> list[str]:
    """The durable targets: S5 durable step <= 0.10 of LangGraph (including opening the
    store), S8 runs/s >= 10x LangGraph's, S8 sync=full within 2x of NORMAL, bytes per
    loop step <= 0.5x; S5 <= 0.10 of DBOS, S8 >= 10x DBOS's runs/s, a lone durable step
    (the store open) within 3x of the floor."""
    out = []

    def med(sc: str, param: str, metric: str, engine: str) -> float | None:
        r = by.get((sc, param, metric))
        return r.median(engine) if r else None

    for param in ("chain N=100", "loop N=1000"):
        il, lg = med("S5", param, "per_step_us", "interlock"), med("S5", param, "per_step_us",
                                                                    "langgraph")
        if il is not None and lg:
            out.append(f"S5 {param} durable step, the store opened in the run: interlock/"
                       f"LangGraph {il / lg:.2f} " + _target(il / lg, 0.10, most=True))
    il, lg = med("S5", "loop N=1000", "db_kb", "interlock"), med("S5", "loop N=1000",
                                                                  "db_kb", "langgraph")
    if il is not None and lg:
        out.append(f"S5 loop N=1000 bytes per step: {il * 1024 / 1000:,.0f} vs LangGraph's "
                   f"{lg * 1024 / 1000:,.0f}, {il / lg:.2f}x " + _target(il / lg, 0.5, most=True))
    for param in ("sqlite 200x10", "postgres 200x10"):
        il, lg = med("S8", param, "runs_per_s", "interlock"), med("S8", param, "runs_per_s",
                                                                   "langgraph")
        if il is not None and lg:
            out.append(f"S8 {param} runs/s: interlock/LangGraph {il / lg:.1f}x "
                       + _target(il / lg, 10, most=False, unit="x"))
    normal = med("S8", "sqlite 200x10", "runs_per_s", "interlock")
    full = med("S8", "sqlite 200x10", "runs_per_s@sync=full", "interlock")
    if normal and full:
        out.append(f"S8 sqlite synchronous=full: {normal / full:.2f}x slower than NORMAL "
                   + _target(normal / full, 2, most=True, unit="x"))
    # against DBOS, and a lone durable step against the floor
    for param in ("chain N=100", "loop N=1000"):
        il, db = med("S5", param, "per_step_us", "interlock"), med("S5", param, "per_step_us",
                                                                    "dbos")
        if il is not None and db:
            out.append(f"S5 {param} durable step: interlock/DBOS (SQLite WAL+NORMAL both) "
                       f"{il / db:.2f} " + _target(il / db, 0.10, most=True))
        il, fl = (med("S5", param, "per_step_us@open", "interlock"),
                  med("S5", param, "per_step_us@open", "floor"))
        if il is not None and fl:
            out.append(f"S5 {param} lone durable step, NORMAL, store open: {il / fl:.2f}x "
                       "the floor " + _target(il / fl, 3, most=True, unit="x"))
    for param in ("sqlite 200x10", "postgres 200x10"):
        il, db = med("S8", param, "runs_per_s", "interlock"), med("S8", param, "runs_per_s",
                                                                   "dbos")
        if il is not None and db:
            out.append(f"S8 {param} runs/s: interlock/DBOS {il / db:.1f}x "
                       + _target(il / db, 10, most=False, unit="x"))
    return out


def _floor_lines(by: dict[tuple[str, str, str], Row]) -> list[str]:
    """The floor (the log records alone) against LangGraph and interlock, S1 and S3."""
    out = []
    for sc, metric in (("S1", "per_node_us"), ("S3", "per_iter_us")):
        r = by.get((sc, "N=1000", metric))
        floor = r.median("floor") if r else None
        if r is None or not floor:
            continue
        lg, il = r.median("langgraph"), r.median("interlock")
        out.append(f"floor (the records alone) {sc} N=1000: {_fmt(floor)} us per node"
                   + (f" = 1/{lg / floor:.1f} of LangGraph's" if lg else "")
                   + (f"; interlock is {il / floor:.2f}x the floor" if il is not None else ""))
    return out


# -- main ------------------------------------------------------------------------------------

def _without_missing(engines: list[str], default_engines: bool) -> bool:
    """Drop from ``engines`` the optional ones whose venv is missing, saying so; False
    (nothing dropped) when one was asked for by name."""
    for optional in OPTIONAL:
        if optional in engines and engine_python(optional) is None:
            py, setup = VENVS[optional]
            if not default_engines:
                print(f"run.py: {py} is missing; run `bash {setup}` first", file=sys.stderr)
                return False
            print(f"run.py: {py} is missing; going on without {optional} (`bash {setup}` "
                  "adds it)", file=sys.stderr)
            engines.remove(optional)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer trials (for development)")
    ap.add_argument("--only", default="", help="comma-separated scenarios, e.g. S1,S3")
    ap.add_argument("--engines", default=None,
                    help="comma-separated engines (interlock,langgraph,pydantic-graph,dbos,"
                         "floor; default: all, pydantic-graph and dbos only if their venv "
                         "exists)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where to write every JSON line (default: bench/results/latest.jsonl "
                         "for a full run, bench/results/partial.jsonl with --quick or --only)")
    ap.add_argument("--rounds", type=int, default=1, metavar="R",
                    help="run every (scenario, parameters) R times, a fresh process per engine "
                         "each time, engines alternating; the table shows the median of all "
                         "trials (steadier ratios on a noisy machine; R times as long)")
    ap.add_argument("--no-cpu", dest="cpu", action="store_false",
                    help="hide the CPU-time rows from the table (they stay in the JSON lines)")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="do not echo the JSON lines, print only the table")
    args = ap.parse_args(argv)

    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}
    bad = only - set(SCENARIOS)
    default_engines = args.engines is None
    engines = [e.strip().replace("_", "-") for e in (args.engines or ",".join(ENGINES)).split(",")
               if e.strip()]
    if bad or not set(engines) <= set(ENGINES) or not engines:
        ap.error(f"scenarios are {', '.join(SCENARIOS)}; engines are {', '.join(ENGINES)}")
    if "langgraph" in engines and engine_python("langgraph") is None:
        print(f"run.py: {LANGGRAPH_PY} is missing; run `bash bench/setup_langgraph.sh` "
              "first (or pass --engines interlock)", file=sys.stderr)
        return 2
    if not _without_missing(engines, default_engines):
        return 2

    jobs = [j for j in plan(args.quick) if not only or j.scenario in only]
    if args.out is None:
        full = not args.quick and not only and {"interlock", "langgraph"} <= set(engines)
        args.out = RESULTS / ("latest.jsonl" if full else "partial.jsonl")
    info = machine()
    lines: list[dict[str, Any]] = [{"scenario": "machine", **info,
                                    "quick": args.quick, "engines": engines}]
    for engine in engines:
        lines += run_adapter(engine, "meta", {}, echo=not args.quiet)
    if args.rounds < 1:
        ap.error("--rounds is at least 1")
    started = time.monotonic()
    for rnd, (k, job) in itertools.product(range(args.rounds), enumerate(jobs)):
        # alternate which engine goes first, so drift in the machine's load hits both
        order = engines if (k + rnd) % 2 == 0 else list(reversed(engines))
        for engine in order:
            if job.scenario not in COVERS.get(engine, (job.scenario,)):
                if rnd == 0:  # a `skipped` line, no process
                    lines += run_adapter(engine, job.scenario, job.params,
                                         echo=not args.quiet)
                continue
            t0 = time.monotonic()
            what = f" (round {rnd + 1} of {args.rounds})" if args.rounds > 1 else ""
            print(f"run.py: {engine} {job.scenario} {json.dumps(job.params)}{what}",
                  file=sys.stderr)
            lines += run_adapter(engine, job.scenario, job.params, echo=not args.quiet)
            print(f"run.py:   {time.monotonic() - t0:.1f}s", file=sys.stderr)
    info["loadavg_end"] = _loadavg()
    info["commit_end"] = _commit()
    info["elapsed_s"] = round(time.monotonic() - started, 1)
    lines[0].update(info)

    rows, notes = build_rows(lines, args.cpu)
    # LangGraph's columns always (as before), the others' when they ran
    others = ("langgraph", *(e for e in ("pydantic-graph", "dbos", "floor") if e in engines))
    body = table(rows, others)
    summary = [{"scenario": "summary", "row": dict(zip(body[0], row, strict=True))}
               for row in body[1:]]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for obj in lines + summary:
            f.write(json.dumps(obj) + "\n")
    versions = {o["engine"]: o["value"] for o in lines
                if o.get("scenario") == "meta" and o.get("metric") == "version"}
    header = (f"machine: {info['nproc']} CPUs, {info['cpu']}, {info['memory']}, "
              f"Python {info['python']}; load average {info['loadavg_start']} at the start, "
              f"{info['loadavg_end']} at the end; {info['elapsed_s']} s"
              + (" (--quick)" if args.quick else "")
              + (f" ({args.rounds} rounds)" if args.rounds > 1 else "") + "\n"
              + f"interlock checkout: {info['commit']}"
              + (f" at the start, {info['commit_end']} at the end" if info["commit_end"]
                 != info["commit"] else "") + "\n"
              + "".join(f"{e}: {v}\n" for e, v in versions.items()))
    md = args.out.with_suffix(".md")
    md.write_text(header + "\n" + render_markdown(body) + "\n\n"
                  + "".join(f"- {line}\n" for line in checks(rows) + notes))

    print("\n" + header + "\n" + render_text(body))
    extra = checks(rows)
    if extra:
        print("\n" + "\n".join(extra))
    if notes:
        print("\nnotes:\n" + "\n".join(f"  {n}" for n in notes))
    print(f"\nresults: {args.out} and {md}")
    return 1 if any("error" in o for o in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
