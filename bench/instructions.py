"""Instructions per node, counted by callgrind: a figure the machine's noise cannot move.

Wall time on a shared machine drifts by up to 2x within minutes, which hides a 5%
change to the hot path. ``valgrind --tool=callgrind`` counts the instructions the
process executes instead: the same build gives the same count (to ~0.1%) whatever
else the machine does. Use it to compare two builds of interlock, not engines
(it knows nothing of SHA extensions or caches, so it is no stand-in for time).

    python bench/instructions.py                 # the working tree, S1 and S3
    python bench/instructions.py --rev HEAD~3    # another commit (a temporary worktree)
    python bench/instructions.py --parts         # and what the parts of a node cost

For each scenario it runs a 1000-node chain (S1) or a 1000-iteration loop (S3) on the
in-memory store, once with 1 run and once with 3, under callgrind, and prints
(instructions(3 runs) - instructions(1 run)) / 2000: the cost of one node, with
start-up, imports and compilation cancelled out. ``--parts`` also counts, the same way,
three parts of that cost: the floor (bench/adapters/floor_adapter.py: the same records
made in a bare loop), sealing the run's records with interlock's `LogWriter`, and
folding them into a fresh `RunView` (what a resume does with a stored log; a live run
folds each record as it makes it). Needs valgrind (``apt install
valgrind``); takes about a minute per scenario.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N = 1000
RUNS = (1, 3)

# what each measured process runs: the bench adapter's own graphs, ``runs`` times
SCRIPT = """
import asyncio, sys
sys.path.insert(0, {adapters!r})
import interlock_adapter as A
wf = A.chain({n}) if {scenario!r} == "S1" else A.loop({n})
wf.compile()
async def main():
    for _ in range({runs}):
        await wf.run({{"i": 0}}, store="memory://")
asyncio.run(main())
"""

# the parts (--parts): the same graphs, the same run count, one part of the work each
PARTS = {
    "floor": """
import asyncio, sys
sys.path.insert(0, {adapters!r})
import floor_adapter as F
from interlock._definition._expr import compile_expression
names = [f"n{{k}}" for k in range({n})]
cond = compile_expression("i < {n}")
async def main():
    for _ in range({runs}):
        if {scenario!r} == "S1":
            await F.run_chain(names, [*names[1:], "END"], "0" * 64, {{"i": 0}})
        else:
            await F.run_loop(cond, "0" * 64, "loop-{n}", {{"i": 0}})
asyncio.run(main())
""",
    "seal": """
import asyncio, sys
sys.path.insert(0, {adapters!r})
import interlock_adapter as A
from interlock._log import LogWriter
from interlock._store import open_store
wf = A.chain({n}) if {scenario!r} == "S1" else A.loop({n})
store = open_store("memory://")
async def records():
    r = await wf.run({{"i": 0}}, store=store)
    return [e.record() for e in await store.entries(r.run_id)]
recs = asyncio.run(records())
fields = [(r["type"], {{k: v for k, v in r.items() if k not in ("seq", "type", "at")}})
          for r in recs]
for _ in range({runs}):
    w = LogWriter()
    for t, f in fields:
        w.seal(t, dict(f))
""",
    "fold": """
import asyncio, sys
sys.path.insert(0, {adapters!r})
import interlock_adapter as A
from interlock._engine._fold import RunView
from interlock._store import open_store
wf = A.chain({n}) if {scenario!r} == "S1" else A.loop({n})
plan = wf.compile()
store = open_store("memory://")
async def records():
    r = await wf.run({{"i": 0}}, store=store)
    return [e.record() for e in await store.entries(r.run_id)]
recs = asyncio.run(records())
for _ in range({runs}):
    v = RunView(plan)
    for r in recs:
        v.apply(dict(r))
""",
}


def count(source: Path, scenario: str, runs: int, part: str | None = None) -> int:
    """Instructions executed by one process that does ``runs`` runs of ``scenario`` (or of
    one of its `PARTS`)."""
    template = SCRIPT if part is None else PARTS[part]
    code = template.format(adapters=str(source / "bench" / "adapters"), n=N,
                           scenario=scenario, runs=runs)
    # this interlock, not the installed one -- and ``-P``: nothing (not the current
    # directory, which ``-c`` would put first) ahead of PYTHONPATH
    env = {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-P", "-c", code],
        capture_output=True, text=True, env=env, cwd=source, check=False)
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"instructions.py: {scenario} with {runs} run(s) failed "
                         f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def per_node(source: Path, scenario: str, part: str | None = None) -> float:
    low, high = (count(source, scenario, r, part) for r in RUNS)
    return (high - low) / ((RUNS[1] - RUNS[0]) * N)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="a git revision to measure instead of the working tree")
    ap.add_argument("--only", default="S1,S3", help="scenarios (S1, S3; default both)")
    ap.add_argument("--parts", action="store_true",
                    help="also count the floor, sealing and folding (see the docstring)")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("instructions.py: valgrind is not installed (apt install valgrind)",
              file=sys.stderr)
        return 2
    scenarios = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in ("S1", "S3")]
    if bad:
        print(f"instructions.py: unknown scenario(s) {', '.join(bad)}: S1 and S3 are "
              "measured", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        source = ROOT
        label = "working tree"
        if args.rev:
            source = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(source), args.rev], check=True)
            label = args.rev
        try:
            for sc in scenarios:
                what = "node" if sc == "S1" else "iteration"
                whole = per_node(source, sc)
                print(f"{label}: {sc} {whole:,.0f} instructions per {what}", flush=True)
                if args.parts:
                    for part in PARTS:
                        k = per_node(source, sc, part)
                        print(f"{label}: {sc}   {part:<5} {k:>9,.0f} per {what} "
                              f"({k / whole:.0%} of the run's)", flush=True)
        finally:
            if args.rev:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(source)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
