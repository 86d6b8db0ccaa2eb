"""A load test of `interlock serve` on loopback (docs/server.md; figures
in bench/HISTORY.md, "The server" and the sections after it).

Starts ``interlock serve`` over a fresh store, starts ``--runs`` runs of a 5-node chain
through the API (``--concurrency`` requests at a time), and follows ``--subscribers`` of
them on their event streams from their first record. Checks that every followed stream
has each record once, in order, ending with run.completed, and that every run
completed; prints runs/s (first request to last completion), the p50/p99 latency of the
start request, and the p99 latency from a record's sealing to its arrival at a
subscriber (records sealed after the subscriber connected).

    python bench/serve_load.py [--runs 1000] [--subscribers 100] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx
from _serve import served


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000 if xs else float("nan")


async def follow(c: httpx.AsyncClient, run_id: str, lat: list[float]) -> list[int]:
    seqs: list[int] = []
    connected = time.time()
    async with c.stream("GET", f"/api/runs/{run_id}/events") as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                rec = json.loads(line[6:])
                seqs.append(rec["seq"])
                if rec["type"] != "node.started" and rec["at"] > connected:
                    lat.append(time.time() - rec["at"])
                if rec["type"] == "run.completed":
                    break
    return seqs


async def load(url: str, runs: int, subscribers: int, concurrency: int) -> None:
    limits = httpx.Limits(max_connections=concurrency + subscribers + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        gate = asyncio.Semaphore(concurrency)
        start_lat: list[float] = []
        event_lat: list[float] = []
        follows: list[asyncio.Task[list[int]]] = []
        every = max(runs // max(subscribers, 1), 1)
        prefix = f"L{os.getpid()}-{os.urandom(2).hex()}-"  # a shared store may hold others

        async def start(i: int) -> None:
            async with gate:
                t = time.perf_counter()
                r = await c.post("/api/workflows/chain/runs", json={"run_id": f"{prefix}{i}"})
                start_lat.append(time.perf_counter() - t)
                assert r.status_code == 201, r.text
            if i % every == 0 and len(follows) < subscribers:
                follows.append(asyncio.create_task(follow(c, f"{prefix}{i}", event_lat)))

        t0 = time.perf_counter()
        await asyncio.gather(*(start(i) for i in range(runs)))
        streams = await asyncio.gather(*follows)
        while True:  # the runs nobody follows: until the store says all completed
            page = (await c.get("/api/runs", params={"status": "COMPLETED",
                                                     "limit": 1000})).json()
            ours = [r for r in page["runs"] if r["run_id"].startswith(prefix)]
            if len(ours) >= min(runs, 1000):
                break
            await asyncio.sleep(0.05)
        wall = time.perf_counter() - t0
    bad = [s for s in streams if s != list(range(1, len(s) + 1))]
    print(f"runs: {runs}, subscribers: {len(streams)}, streams with a lost, duplicated or "
          f"reordered event: {len(bad)}")
    print(f"throughput: {runs / wall:.0f} runs/s ({wall:.1f} s)")
    print(f"start request: p50 {pct(start_lat, 0.5):.1f} ms, p99 {pct(start_lat, 0.99):.1f} ms")
    print(f"commit to subscriber: p50 {pct(event_lat, 0.5):.1f} ms, "
          f"p99 {pct(event_lat, 0.99):.1f} ms ({len(event_lat)} live events)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--store")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="serve-load-"))
    (root / "lnodes.py").write_text("def step(state):\n    return {}\n")
    names = [f"n{i}" for i in range(5)]
    nodes = "\n".join(f"  {n}: lnodes:step" for n in names)
    edges = "\n".join(f"  - {{from: {a}, to: {b}}}" for a, b in
                      zip(["START", *names], [*names, "END"], strict=True))
    (root / "chain.yaml").write_text(f"workflow: chain\nnodes:\n{nodes}\nedges:\n{edges}\n")
    store = args.store or f"sqlite:///{root / 'runs.db'}"
    with served(root, "--store", store, "--workflows", "chain.yaml", "--workers",
                str(args.workers), "--no-take-over") as url:
        asyncio.run(load(url, args.runs, args.subscribers, args.concurrency))


if __name__ == "__main__":
    main()
