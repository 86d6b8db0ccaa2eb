"""Worker pickup on one store (issue 34): an idle ``interlock worker``, then ``--runs``
detached runs recorded one at a time from this process (``wf.submit``); for each, the
time from just before its recording to the worker's ``run.resumed`` record (the pickup)
and to its last record. On SQLite the worker is woken by the store's change detector
(`interlock._store._sqlite_watch`), on PostgreSQL by ``NOTIFY``; the poll (0.5 s) is
the backstop.

    python bench/pickup.py [--store sqlite|postgres] [--runs 15]

PostgreSQL needs $INTERLOCK_TEST_POSTGRES (a fresh schema). Not a test: figures in
bench/README.md, "Latest figures" ("Cross-process events and pickup").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workers import _store

import interlock

FLOW = """
workflow: one
nodes: {a: pnodes:step}
edges:
  - {from: START, to: a}
  - {from: a, to: END}
"""


async def measure(url: str, wf: interlock.Workflow, runs: int, root: Path) -> None:
    async with interlock.open_store(url) as st:
        await wf.run({}, store=st)  # the file (schema) made before the worker starts
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
        worker = subprocess.Popen([sys.executable, "-m", "interlock", "worker", "--store",
                                   url], cwd=root, env=env, stderr=subprocess.DEVNULL)
        try:
            await asyncio.sleep(3.0)  # started and idle
            picks, ends = [], []
            for _ in range(runs):
                t = time.time()
                rid = (await wf.submit({}, store=st)).run_id
                while (await st.get_run(rid)).summary.status != "COMPLETED":
                    await asyncio.sleep(0.005)
                recs = await interlock.trace(rid, store=st)
                picks.append(next(r["at"] for r in recs if r["type"] == "run.resumed") - t)
                ends.append(recs[-1]["at"] - t)
                await asyncio.sleep(0.37)  # land at another phase of the poll
        finally:
            worker.terminate()
            worker.wait(60)
    for name, xs in (("pickup (run.resumed)", picks), ("completed", ends)):
        xs = sorted(x * 1000 for x in xs)
        print(f"{name}: p50 {statistics.median(xs):.1f} ms, max {xs[-1]:.1f} ms (n={runs})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pickup-bench-"))
    (root / "pnodes.py").write_text("def step(state):\n    return {}\n")
    (root / "one.yaml").write_text(FLOW)
    sys.path.insert(0, str(root))
    url, _schema = _store(args.store, root)
    asyncio.run(measure(url, interlock.load(root / "one.yaml"), args.runs, root))


if __name__ == "__main__":
    main()
