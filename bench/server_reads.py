"""Reads of `interlock serve` at scale (issue 27, "reads that scale"; figures in
bench/HISTORY.md, "Reads at scale").

Fills a SQLite store with the engine in this process, then starts a real ``interlock
serve --workers 0`` on it (nothing executes: the reads alone are measured) and times:

- ``GET /api/approvals`` with ``--gates`` runs waiting at a gate (default 2,000): the
  first request and the median of the next ``--repeat``, then the server's CPU% while
  three inbox tabs ask for it every second for ``--watch`` seconds;
- ``GET /api/runs?limit=100`` over ``--big`` runs (default 60) whose input is
  ``--input-mb`` MB (default 4);
- ``GET /api/runs/{id}/records`` of a run of ``--steps`` steps (default 100,000): the
  time to read the whole log (every page, when the server pages it) and the server's
  RSS growth (its peak, from /proc);
- ``GET /api/runs/{id}/visits`` of that run, and the slowest ``GET /api/health`` sent
  every 50 ms meanwhile (does the fold stall the other requests?);
- the ``--notify`` watcher's pass over the waiting runs (in this process, no server):
  its first, and the next ones when nothing changed;
- ``--followers`` SSE subscribers (default 500) on one waiting run for ``--watch``
  seconds: the server's CPU% over that window (from /proc).

The populated store is kept in ``--root`` (default: a new temp dir) and reused when it
exists, so "before" and "after" read the same store:

    python bench/server_reads.py [--root DIR] [--gates 2000] [--steps 100000]

Run it with ``PYTHONPATH`` naming the tree to measure (main's, then a branch's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _serve import served

NODES = """\
def noop(state):
    return {}

def count(state):
    return {"n": state.get("n", 0) + 1}
"""

GATE = """\
workflow: gate
nodes:
  prep: {call: rnodes:noop}
  review: {approval: {show: [x], on_modify: [prep],
                       approvers: [alice]}}
edges:
  - {from: START, to: prep}
  - {from: prep, to: review}
  - {from: review, to: END}
"""

BIG = """\
workflow: big
nodes:
  one: {call: rnodes:noop}
edges:
  - {from: START, to: one}
  - {from: one, to: END}
"""

LOOP = """\
workflow: loop
limits: {steps: %d}
nodes:
  step: {call: rnodes:count, writes: [n]}
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'n < %d'}
  - {from: step, to: END, otherwise: true}
"""


def populate(root: Path, store: str, gates: int, big: int, input_mb: int,
             steps: int) -> None:
    import sys

    import interlock

    sys.path.insert(0, str(root))
    (root / "rnodes.py").write_text(NODES)
    (root / "gate.yaml").write_text(GATE)
    (root / "big.yaml").write_text(BIG)
    (root / "loop.yaml").write_text(LOOP % (steps + 10, steps))

    async def fill() -> None:
        st = interlock.open_store(store)
        try:
            gate = interlock.load(str(root / "gate.yaml"))
            t = time.perf_counter()
            for i in range(gates):
                await gate.run({"x": i}, store=st, run_id=f"g{i:05d}")
            print(f"  {gates} waiting gates: {time.perf_counter() - t:.1f} s", flush=True)
            bigwf = interlock.load(str(root / "big.yaml"))
            blob = "x" * ((input_mb << 20) - 64)  # just under INTERLOCK_MAX_INPUT_BYTES
            for i in range(big):
                await bigwf.run({"blob": blob}, store=st, run_id=f"big{i:03d}")
            print(f"  {big} runs with {input_mb} MB inputs", flush=True)
            loop = interlock.load(str(root / "loop.yaml"))
            t = time.perf_counter()
            await loop.run({"n": 0}, store=st, run_id="long")
            print(f"  a run of {steps} steps: {time.perf_counter() - t:.1f} s", flush=True)
        finally:
            await st.close()

    asyncio.run(fill())
    (root / "filled").write_text("yes\n")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def cpu(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    # the process listening on the port: the serve child of `served`
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{int(port):04X}") and f[3] == "0A":
            inode = f[9]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    raise RuntimeError("the server's process was not found")


async def whole_log(c: httpx.AsyncClient, run_id: str) -> int:
    """Every record of the run: the pages, when the server pages (a ``next`` link)."""
    n, after = 0, 0
    while True:
        r = await c.get(f"/api/runs/{run_id}/records", params={"after": after})
        r.raise_for_status()
        recs = r.json()
        n += len(recs)
        nxt = r.headers.get("x-next-after")
        if not recs or nxt is None:
            return n
        after = int(nxt)


async def measure(url: str, pid: int, args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=args.followers + 16)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        times = []
        for _ in range(args.repeat + 1):
            t = time.perf_counter()
            r = await c.get("/api/approvals")
            times.append(time.perf_counter() - t)
            r.raise_for_status()
            assert len(r.json()) == args.gates, len(r.json())
        out["approvals first"] = times[0]
        out["approvals median"] = statistics.median(times[1:])
        # three inbox tabs: each asks every second (the dashboard's POLL_MS)
        c0, t0 = cpu(pid), time.perf_counter()

        async def tab() -> None:
            while time.perf_counter() - t0 < args.watch:
                asked = time.perf_counter()
                (await c.get("/api/approvals")).raise_for_status()
                await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - asked)))

        await asyncio.gather(tab(), tab(), tab())
        out["3 inbox tabs CPU%"] = 100 * (cpu(pid) - c0) / (time.perf_counter() - t0)

        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = await c.get("/api/runs", params={"limit": 100, "workflow": "big"})
            times.append(time.perf_counter() - t)
            assert len(r.json()["runs"]) == args.big
        out["runs?limit=100 median"] = statistics.median(times)

        times, growth = [], []
        for _ in range(3):
            base, peak = rss(pid), 0
            stop = asyncio.Event()

            async def sample(base: int = base, stop: asyncio.Event = stop) -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss(pid) - base)
                    await asyncio.sleep(0.02)

            sampler = asyncio.create_task(sample())
            t = time.perf_counter()
            n = await whole_log(c, "long")
            times.append(time.perf_counter() - t)
            stop.set()
            await sampler
            growth.append(peak)
            assert n >= args.steps, n
        out["records median s"] = statistics.median(times)
        out["records RSS growth MB (max)"] = max(growth) / 2**20

        visits, health = [], []
        for _ in range(2):
            done = asyncio.Event()

            async def probe(done: asyncio.Event = done) -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    (await c.get("/api/health")).raise_for_status()
                    health.append(time.perf_counter() - t)
                    await asyncio.sleep(0.05)

            prober = asyncio.create_task(probe())
            t = time.perf_counter()
            (await c.get("/api/runs/long/visits")).raise_for_status()
            visits.append(time.perf_counter() - t)
            done.set()
            await prober
        out["visits median s"] = statistics.median(visits)
        out["health during visits, max s"] = max(health)

        started = 0

        async def follower() -> None:
            nonlocal started
            async with c.stream("GET", "/api/runs/g00000/events") as r:
                started += 1
                async for _ in r.aiter_lines():
                    pass

        tasks = [asyncio.create_task(follower()) for _ in range(args.followers)]
        while started < args.followers:
            await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # their first reads done
        c0, t0 = cpu(pid), time.perf_counter()
        await asyncio.sleep(args.watch)
        out["SSE followers CPU%"] = 100 * (cpu(pid) - c0) / (time.perf_counter() - t0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


def watcher_passes(store: str) -> dict[str, float]:
    """The ``--notify`` watcher's passes over the store, in this process: the first (it
    reads every waiting run's log once) and the median of five more (nothing changed;
    the watcher's steady state, every ``notify_scan`` seconds)."""
    from interlock import open_store
    from interlock.server._hub import Hub
    from interlock.server._notify import Notifier

    async def go() -> dict[str, float]:
        st = open_store(store)
        try:
            n = Notifier(["http://127.0.0.1:9/"], "http://x", st, Hub(), None)
            n.requested = lambda *a: None  # type: ignore[method-assign]  # announce nothing
            t = time.perf_counter()
            await n._scan()
            first = time.perf_counter() - t
            if hasattr(n, "_since"):  # as `watch` sets it after a pass
                n._since = time.time() - 60
            times = []
            for _ in range(5):
                t = time.perf_counter()
                await n._scan()
                times.append(time.perf_counter() - t)
            return {"watcher first pass s": first,
                    "watcher next passes median ms": 1000 * statistics.median(times)}
        finally:
            await st.close()

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root")
    ap.add_argument("--gates", type=int, default=2000)
    ap.add_argument("--big", type=int, default=60)
    ap.add_argument("--input-mb", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--followers", type=int, default=500)
    ap.add_argument("--watch", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="server-reads-"))
    root.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{root / 'runs.db'}"
    if not (root / "filled").exists():
        print(f"filling {store}", flush=True)
        populate(root, store, args.gates, args.big, args.input_mb, args.steps)
    with served(root, "--store", store, "--workflows", str(root), "--workers", "0",
                "--no-take-over") as url:
        pid = server_pid(url)
        out = asyncio.run(measure(url, pid, args))
    out.update(watcher_passes(store))
    for k, v in out.items():
        print(f"{k}: {v:.3f}")


if __name__ == "__main__":
    main()
