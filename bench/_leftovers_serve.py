"""``python bench/leftovers.py --serve [RUNS] [--trace]``: a real ``interlock serve``'s
memory after many runs started through its HTTP API (see bench/leftovers.py's text)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
from _serve import served_process

NODES = "def step(state):\n    return {'x': state.get('x', 0) + 1}\n"
CHAIN = """workflow: chain
nodes:
  a: snodes:step
  b: snodes:step
  c: snodes:step
edges:
  - {from: START, to: a}
  - {from: a, to: b}
  - {from: b, to: c}
"""
GATED = """workflow: gated
nodes:
  a: snodes:step
  ok: {approval: {show: [x]}}
  b: snodes:step
edges:
  - {from: START, to: a}
  - {from: a, to: ok}
  - {from: ok, to: b}
"""

# the server under tracemalloc: SIGUSR1 dumps a snapshot to $LEFTOVERS_SNAPSHOT (written
# whole, then renamed: the reader never sees half a file)
TRACED = """
import os, signal, sys, tracemalloc
tracemalloc.start(10)
def dump(signum, frame):
    path = os.environ["LEFTOVERS_SNAPSHOT"]
    tracemalloc.take_snapshot().dump(path + ".tmp")
    os.rename(path + ".tmp", path)
signal.signal(signal.SIGUSR1, dump)
from interlock.cli import cli
cli(prog_name="interlock")
"""

CONCURRENCY = 8


def proc(pid: int) -> dict[str, int]:
    """The server's RSS and peak RSS (KiB), threads and open fds, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            fields[key] = int(value.split()[0])
    fields["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return fields


async def _status(c: httpx.AsyncClient, run_id: str, want: str) -> None:
    while True:
        run = (await c.get(f"/api/runs/{run_id}")).json()
        if run["status"] == want:
            return
        assert run["status"] not in ("FAILED", "CANCELLED", "REJECTED"), run
        await asyncio.sleep(0.02)


async def _follow(c: httpx.AsyncClient, run_id: str) -> int:
    seen = 0
    async with c.stream("GET", f"/api/runs/{run_id}/events") as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if json.loads(line[6:])["type"] == "run.completed":
                    break
    return seen


async def _one(c: httpx.AsyncClient, i: int, gate: asyncio.Semaphore, tag: str) -> None:
    kind = "gated" if i % 4 == 0 else "chain"
    run_id = f"{tag}{i}"
    async with gate:
        r = await c.post(f"/api/workflows/{kind}/runs", json={"run_id": run_id})
        assert r.status_code == 201, r.text
        sub = asyncio.create_task(_follow(c, run_id)) if i % 3 == 0 else None
        if kind == "gated":
            await _status(c, run_id, "WAITING_APPROVAL")
            r = await c.post(f"/api/runs/{run_id}/decisions",
                             json={"decision": "approve", "node": "ok", "by": "ann"})
            assert r.status_code == 200, r.text
        await _status(c, run_id, "COMPLETED")
        if sub is not None:
            assert await asyncio.wait_for(sub, 120) > 0


def _snapshot(pid: int) -> tracemalloc.Snapshot:
    """The server's snapshot, dumped on SIGUSR1 to $LEFTOVERS_SNAPSHOT."""
    path = Path(os.environ["LEFTOVERS_SNAPSHOT"])
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 1200
    while not path.exists():
        assert time.monotonic() < deadline, "no snapshot from the server"
        time.sleep(0.2)
    return tracemalloc.Snapshot.load(str(path))


async def drive(url: str, pid: int, points: list[int], trace: bool
                ) -> dict[int, tracemalloc.Snapshot]:
    taken: dict[int, tracemalloc.Snapshot] = {}
    limits = httpx.Limits(max_connections=4 * CONCURRENCY)
    tag = f"m{os.getpid()}-"
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        gate = asyncio.Semaphore(CONCURRENCY)
        await asyncio.sleep(1.0)  # (the server's start-up settled)
        print(f"{'runs':>6} {'RSS MiB':>8} {'peak MiB':>9} {'threads':>8} {'fds':>5} "
              f"{'s':>6}", flush=True)
        t0, start = time.perf_counter(), 0
        for point in [0, *points]:
            await asyncio.gather(*(_one(c, i, gate, tag) for i in range(start, point)))
            start = point
            await asyncio.sleep(1.0)  # (streams closed, workers idle)
            got = proc(pid)
            print(f"{point:6} {got['VmRSS'] / 1024:8.1f} {got['VmHWM'] / 1024:9.1f} "
                  f"{got['Threads']:8} {got['fds']:5} {time.perf_counter() - t0:6.0f}",
                  flush=True)
            if trace and point:
                taken[point] = _snapshot(pid)
    return taken


def serve_main(args: list[str]) -> None:
    trace = "--trace" in args
    numbers = [int(a) for a in args if a.isdigit()]
    runs = numbers[0] if numbers else 1000
    points = sorted({p for p in (100, 500, 1000, 2000, 3000, runs) if p <= runs})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "snodes.py").write_text(NODES)
        (root / "chain.yaml").write_text(CHAIN)
        (root / "gated.yaml").write_text(GATED)
        os.environ["LEFTOVERS_SNAPSHOT"] = str(root / "snapshot")
        python = ("-c", TRACED) if trace else ("-m", "interlock")
        with served_process(root, "--store", f"sqlite:///{root / 'runs.db'}",
                            "--workflows", "chain.yaml", "--workflows", "gated.yaml",
                            python=python, stdout=subprocess.DEVNULL) as (url, server):
            taken = asyncio.run(drive(url, server.pid, points, trace))
        ordered = sorted(taken.items())
        for (a, old), (b, new) in itertools.pairwise(ordered):
            stats = new.compare_to(old, "traceback")
            total = sum(s.size_diff for s in stats)
            print(f"traced growth between {a} and {b} runs: {total / (b - a):+.0f} B/run")
        if len(ordered) >= 2:
            (a, old), (b, new) = ordered[-2:]
            print(f"\nbetween {a} and {b} runs, by where it was allocated (the 12 largest):")
            for stat in new.compare_to(old, "traceback")[:12]:
                print(f"{stat.size_diff / (b - a):+9.0f} B/run {stat.count_diff:+7} blocks")
                for line in stat.traceback.format(limit=6):
                    print("    " + line)
