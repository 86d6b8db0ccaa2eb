"""Worst cases of the hardening round: what an attacker's (or a careless) input costs.

    python bench/hardening.py                    # all scenarios (~5 min: the 100k-step run)
    python bench/hardening.py --only validate_chain,run_chain
    python bench/hardening.py --steps 20000      # a shorter trace run

Each scenario is a function in `SCENARIOS` taking the scratch directory and the
options, returning rows ``(scenario, metric, value, unit)``; a new one (the CEL worst
case, say) is a function added to that list. Every measurement runs the ``interlock``
command in a fresh process under ``/usr/bin/time -v`` (wall seconds and peak RSS), so
it measures what a user of the command line waits for. The table goes to stdout, one
JSON line per row before it (``-q``: the table only).

- ``validate_chain``: ``interlock validate`` of an N-node chain (default 10 000);
- ``validate_fanout``: ``interlock validate`` of one node fanning out to N branches that
  a join collects;
- ``run_chain``: ``interlock run`` of the chain on ``memory://``;
- ``trace``: ``interlock trace`` of a run of S steps (default 100 000; a loop workflow
  with ``limits: {steps: ...}``, run once on a SQLite store, not timed), human and
  ``--json`` (output to /dev/null);
- ``alias_bomb``: ``interlock validate`` of a nine-level billion-laughs file (refused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

Row = tuple[str, str, float, str]
Options = argparse.Namespace

NODES = """\
def noop(state):
    return {}

def inc(state):
    return {"n": state.get("n", 0) + 1}
"""


def interlock_cmd() -> list[str]:
    found = shutil.which("interlock")
    return [found] if found else [sys.executable, "-m", "interlock"]


def timed(args: list[str], cwd: Path) -> tuple[float, float, int]:
    """``interlock ARGS`` in ``cwd``: (wall seconds, peak RSS in MiB, exit code); its
    stdout is discarded."""
    time_bin = "/usr/bin/time"
    cmd = [*interlock_cmd(), *args]
    start = time.perf_counter()
    if os.path.exists(time_bin):
        done = subprocess.run([time_bin, "-v", *cmd], cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        wall = time.perf_counter() - start
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        rss = int(m.group(1)) / 1024 if m else float("nan")
    else:  # no GNU time: wall time only
        done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, check=False)
        wall, rss = time.perf_counter() - start, float("nan")
    return wall, rss, done.returncode


def chain_file(root: Path, n: int) -> str:
    lines = ["workflow: chain", "nodes:"]
    lines += [f"  n{i}: hnodes:noop" for i in range(n)]
    lines += ["edges:", "  - {from: START, to: n0}"]
    lines += [f"  - {{from: n{i}, to: n{i + 1}}}" for i in range(n - 1)]
    lines.append(f"  - {{from: n{n - 1}, to: END}}")
    name = f"chain{n}.yaml"
    (root / name).write_text("\n".join(lines) + "\n")
    return name


# -- scenarios ---------------------------------------------------------------------------


def validate_chain(root: Path, opts: Options) -> list[Row]:
    name = chain_file(root, opts.nodes)
    wall, rss, code = timed(["validate", name], root)
    assert code == 0, f"validate {name} exited {code}"
    return [(f"validate chain N={opts.nodes}", "wall", wall, "s"),
            (f"validate chain N={opts.nodes}", "peak_rss", rss, "MiB")]


def validate_fanout(root: Path, opts: Options) -> list[Row]:
    n = opts.nodes
    branches = ", ".join(f"b{i}" for i in range(n))
    lines = ["workflow: fan", "nodes:", "  a: hnodes:noop", "  c: hnodes:noop"]
    lines += [f"  b{i}: hnodes:noop" for i in range(n)]
    lines += ["edges:", "  - {from: START, to: a}", f"  - {{from: a, to: [{branches}]}}",
              f"  - {{from: [{branches}], to: c}}"]
    (root / "fan.yaml").write_text("\n".join(lines) + "\n")
    wall, rss, code = timed(["validate", "fan.yaml"], root)
    assert code == 0, f"validate fan.yaml exited {code}"
    return [(f"validate fan-out+join N={n}", "wall", wall, "s"),
            (f"validate fan-out+join N={n}", "peak_rss", rss, "MiB")]


def run_chain(root: Path, opts: Options) -> list[Row]:
    name = chain_file(root, opts.nodes)
    wall, rss, code = timed(["run", name, "--store", "memory://", "--set",
                             f"limits.steps={opts.nodes + 10}"], root)
    assert code == 0, f"run {name} exited {code}"
    return [(f"run chain N={opts.nodes} memory://", "wall", wall, "s"),
            (f"run chain N={opts.nodes} memory://", "peak_rss", rss, "MiB")]


def trace(root: Path, opts: Options) -> list[Row]:
    steps = opts.steps
    (root / "loop.yaml").write_text(
        f"workflow: loop\nlimits: {{steps: {steps + 10}}}\nnodes:\n"
        "  step: {call: hnodes:inc, writes: [n]}\nedges:\n  - {from: START, to: step}\n"
        f"  - {{from: step, to: step, when: 'n < {steps}'}}\n"
        "  - {from: step, to: END, otherwise: true}\n")
    store = f"sqlite:///{root / 'trace.db'}"
    if not (root / "trace.db").exists():
        made = subprocess.run([*interlock_cmd(), "run", "loop.yaml", "--store", store,
                               "--run-id", "big", "--json"], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False)
        assert made.returncode == 0, f"the {steps}-step run exited {made.returncode}"
    rows: list[Row] = []
    for extra in ([], ["--json"]):
        wall, rss, code = timed(["trace", "big", "--store", store, *extra], root)
        assert code == 0, f"trace {' '.join(extra)} exited {code}"
        what = f"trace S={steps}" + (" --json" if extra else "")
        rows += [(what, "wall", wall, "s"), (what, "peak_rss", rss, "MiB")]
    return rows


def alias_bomb(root: Path, opts: Options) -> list[Row]:
    lines = ["workflow: bomb", "config:",
             '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    lines += ["nodes: {x: hnodes:noop}", "edges: [{from: START, to: x}]"]
    (root / "bomb.yaml").write_text("\n".join(lines) + "\n")
    wall, rss, code = timed(["validate", "bomb.yaml"], root)
    assert code == 2, f"validate bomb.yaml exited {code} (it must be refused: 2)"
    return [("alias bomb 9 levels (refused)", "wall", wall, "s"),
            ("alias bomb 9 levels (refused)", "peak_rss", rss, "MiB")]


SCENARIOS: list[Callable[[Path, Options], list[Row]]] = [
    validate_chain, validate_fanout, run_chain, trace, alias_bomb,
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated scenario names: "
                        + ", ".join(f.__name__ for f in SCENARIOS))
    parser.add_argument("--nodes", type=int, default=10_000, help="chain length")
    parser.add_argument("--steps", type=int, default=100_000, help="trace run's steps")
    parser.add_argument("--keep", metavar="DIR", help="scratch directory to use and keep "
                        "(reuses a trace run made there before)")
    parser.add_argument("-q", action="store_true", help="print only the table")
    opts = parser.parse_args(argv)
    wanted = set(opts.only.split(",")) if opts.only else None
    root = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="il-harden-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "hnodes.py").write_text(NODES)
    rows: list[Row] = []
    try:
        for scenario in SCENARIOS:
            if wanted is not None and scenario.__name__ not in wanted:
                continue
            for row in scenario(root, opts):
                rows.append(row)
                if not opts.q:
                    print(json.dumps(dict(zip(("scenario", "metric", "value", "unit"), row,
                                              strict=True))), flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(root, ignore_errors=True)
    width = max((len(r[0]) for r in rows), default=8)
    print(f"\n| {'scenario':<{width}} | metric   |      value | unit |")
    print(f"|{'-' * (width + 2)}|----------|-----------:|------|")
    for what, metric, value, unit in rows:
        print(f"| {what:<{width}} | {metric:<8} | {value:>10.2f} | {unit:<4} |")


if __name__ == "__main__":
    main()
