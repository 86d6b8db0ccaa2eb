"""Commit-to-subscriber latency of `GET /api/runs/{id}/events` (docs/server.md).

Starts ``interlock serve`` on a loopback port over a SQLite or PostgreSQL store, then
runs a workflow of N nodes (each sleeps ``--gap`` seconds) three times: started through
the API (the server's own commits wake the stream), by ``interlock run`` in another
process, and by an ``interlock worker`` process (a run recorded with ``run --detach``):
those two reach the stream through the store's change detector (SQLite's
``data_version``, PostgreSQL's ``LISTEN``), the ``--poll`` behind it. A subscriber
follows each run's stream and takes, for each record committed after the stream opened,
the time it arrived minus the record's ``at`` (sealed just before its commit;
``node.started`` is left out: it is committed with the node's completion).
Prints the median and p99 in milliseconds for each case.

    python bench/sse_latency.py [--nodes 40] [--gap 0.05] [--poll 0.25]
                                [--store sqlite|postgres] [--runs 1]

PostgreSQL needs $INTERLOCK_TEST_POSTGRES (a fresh schema is made). ``--runs`` repeats
each case (samples pooled).
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
from workers import _store


def follow(url: str, run_id: str, out: list[float]) -> None:
    opened = time.time()
    with httpx.Client(base_url=url, timeout=60) as c, \
            c.stream("GET", f"/api/runs/{run_id}/events") as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                rec = json.loads(line[6:])
                # node.started is sealed at the start, committed with the completion: not
                # a commit time; records committed before the stream opened: not live
                if rec["type"] != "node.started" and rec["at"] > opened:
                    out.append(time.time() - rec["at"])


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
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--runs", type=int, default=1)
    return ap.parse_args()


def _other(url: str, run_id: str, command: list[str], root: Path, env: dict[str, str],
           out: list[float]) -> None:
    """Follows a run that ``command`` (another process) records and executes."""
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    with httpx.Client(base_url=url) as c:
        while c.get(f"/api/runs/{run_id}").status_code == 404:
            time.sleep(0.01)
    follow(url, run_id, out)
    proc.wait()


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
    store, _ = _store(args.store, root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}  # (the interlock this runs with)
    cli = [sys.executable, "-m", "interlock"]
    own: list[float] = []
    other: list[float] = []
    worked: list[float] = []
    with served(root, "--store", store, "--workflows", "chain.yaml", "--poll",
                str(args.poll)) as url:
        worker = subprocess.Popen([*cli, "worker", "--store", store], cwd=root, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for k in range(args.runs):
                with httpx.Client(base_url=url) as c:
                    c.post("/api/workflows/chain/runs", json={"run_id": f"own{k}"})
                follow(url, f"own{k}", own)
                _other(url, f"other{k}", [*cli, "run", "chain.yaml", "--run-id", f"other{k}",
                                          "--store", store], root, env, other)
                _other(url, f"worker{k}", [*cli, "run", "chain.yaml", "--run-id",
                                           f"worker{k}", "--store", store, "--detach"],
                       root, env, worked)
        finally:
            worker.terminate()
            worker.wait(60)
    print(f"store: {args.store}, poll {args.poll}s, {args.runs} run(s) of each")
    print(f"run in the server:        {quantiles(own)}")
    print(f"run by `interlock run`:   {quantiles(other)}")
    print(f"run by a worker:          {quantiles(worked)}")


if __name__ == "__main__":
    main()
