"""`interlock serve` while a node blocks its event loop (docs/server.md;
figures in bench/HISTORY.md, "Node bodies off the API's loop").

Starts ``interlock serve`` over a SQLite store with a workflow whose one node is an
``async def`` that computes for ``--busy`` seconds without awaiting (``timeout: 1s``),
starts a run, and once the node has started times ``GET /api/health`` (five requests,
one after the other) and a start-to-waiting of another run (a gated workflow) meanwhile.
Prints those latencies, how the blocking run ended and its error.

    python bench/blocked_loop.py [--busy 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from _serve import served

NODES = '''
import time
from pathlib import Path

async def hog(state):
    Path("hog.started").write_text("1")
    end = time.monotonic() + {busy}
    while time.monotonic() < end:
        pass
    return {{"hogged": True}}

def first(state):
    return {{"first": 1}}
'''

FLOWS = {
    "hog.yaml": "workflow: hog\nnodes:\n  hog: {call: bnodes:hog, timeout: 1s}\n"
                "edges:\n  - {from: START, to: hog}\n  - {from: hog, to: END}\n",
    "gated.yaml": "workflow: gated\nnodes:\n  first: bnodes:first\n"
                  "  gate: {approval: {show: [first]}}\n"
                  "edges:\n  - {from: START, to: first}\n  - {from: first, to: gate}\n"
                  "  - {from: gate, to: END}\n",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=float, default=8.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="blocked-bench-"))
    (root / "bnodes.py").write_text(NODES.format(busy=args.busy))
    (root / "flows").mkdir()
    for name, text in FLOWS.items():
        (root / "flows" / name).write_text(text)
    with served(root, "--store", f"sqlite:///{root / 'runs.db'}", "--workflows",
                "flows") as url, httpx.Client(base_url=url, timeout=60) as c:
        t0 = time.perf_counter()
        c.post("/api/workflows/hog/runs", json={"run_id": "hog"})
        while not (root / "hog.started").exists():
            time.sleep(0.01)
        health = []
        for _ in range(5):
            t = time.perf_counter()
            c.get("/api/health").raise_for_status()
            health.append(time.perf_counter() - t)
        t = time.perf_counter()
        c.post("/api/workflows/gated/runs", json={"run_id": "other"})
        while c.get("/api/runs/other").json()["status"] != "WAITING_APPROVAL":
            time.sleep(0.005)
        other = time.perf_counter() - t
        print(f"/api/health while the node computes: median "
              f"{statistics.median(health) * 1000:.1f} ms, max {max(health) * 1000:.1f} ms")
        print(f"another run, start to waiting at its gate: {other * 1000:.1f} ms")
        while (run := c.get("/api/runs/hog").json())["status"] == "RUNNING":
            time.sleep(0.05)
        print(f"the blocking run: {run['status']} after {time.perf_counter() - t0:.1f} s"
              f" -- {(run.get('error') or {}).get('message', '')[:90]}")


if __name__ == "__main__":
    main()
