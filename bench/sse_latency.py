"""Commit-to-subscriber latency of `GET /api/runs/{id}/events` (docs/server.md).

Starts ``interlock serve`` on a loopback port over a SQLite store, then runs a
workflow of N nodes (each sleeps ``--gap`` seconds) twice: once started through the
API (the server's own commits wake the stream) and once by ``interlock run`` in another
process (found by polling). A subscriber follows each run's stream and takes, for each
record, the time it arrived minus the record's ``at`` (sealed just before its commit;
``node.started`` is left out: it is committed with the node's completion).
Prints the median and p99 in milliseconds for each case.

    python bench/sse_latency.py [--nodes 40] [--gap 0.05] [--poll 0.25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _serve import served


def follow(url: str, run_id: str, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=60) as c, \
            c.stream("GET", f"/api/runs/{run_id}/events") as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                rec = json.loads(line[6:])
                if rec["type"] != "node.started":  # sealed at the start, committed with
                    out.append(time.time() - rec["at"])  # the completion: not a commit time


def quantiles(xs: list[float]) -> str:
    xs = sorted(x * 1000 for x in xs)
    return (f"n={len(xs)} median={statistics.median(xs):.1f} ms "
            f"p99={xs[min(len(xs) - 1, int(len(xs) * 0.99))]:.1f} ms")


def arguments() -> argparse.Namespace:
    """--nodes, --gap, --poll (bench/dashboard_latency.py takes the same)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.05)
    ap.add_argument("--poll", type=float, default=0.25)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    root = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    (root / "bnodes.py").write_text("import time\ndef step(state):\n"
                                    f"    time.sleep({args.gap})\n    return {{}}\n")
    nodes = "\n".join(f"  n{i}: bnodes:step" for i in range(args.nodes))
    edges = "\n".join(f"  - {{from: {'START' if i == 0 else f'n{i - 1}'}, to: n{i}}}"
                      for i in range(args.nodes))
    (root / "chain.yaml").write_text(f"workflow: chain\nnodes:\n{nodes}\nedges:\n{edges}\n"
                                     f"  - {{from: n{args.nodes - 1}, to: END}}\n")
    store = f"sqlite:///{root / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}  # (the interlock this runs with)
    with served(root, "--store", store, "--workflows", "chain.yaml", "--poll",
                str(args.poll)) as url:
        own: list[float] = []
        with httpx.Client(base_url=url) as c:
            c.post("/api/workflows/chain/runs", json={"run_id": "own"})
        follow(url, "own", own)
        other: list[float] = []
        cli = subprocess.Popen([sys.executable, "-m", "interlock", "run", "chain.yaml",
                                "--run-id", "other", "--store", store], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with httpx.Client(base_url=url) as c:
            while c.get("/api/runs/other").status_code == 404:
                time.sleep(0.01)
        follow(url, "other", other)
        cli.wait()
        # the first records of each run were committed before the stream opened: skip
        print(f"run in the server:        {quantiles(own[3:])}")
        print(f"run by another process:   {quantiles(other[3:])}  (poll {args.poll}s)")


if __name__ == "__main__":
    main()
