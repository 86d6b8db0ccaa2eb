"""A long verify's effect on the server's other requests (review 40: ``GET
/api/runs/{id}/verify`` checked the whole log on the event loop, a 2,000-record page at
a time without giving the loop back).

Fills a SQLite store with one run of about ``--records`` records (default 10,000: a
loop of ``--records / 3`` steps), starts ``interlock serve --workers 0`` on it, and
times ``GET /api/health`` sent every ``--every`` seconds (default 0.005): alone, then
while ``GET /api/runs/long/verify`` runs, ``--repeat`` times (default 5). Prints the
verify's median time and the health requests' median and slowest latency in each case.
Then, in this process on the same store, the event loop's longest stall while
``interlock.verify`` checks the run, giving the loop back (``share_loop``, as the
server does) and not (as it did): the request latencies above include the machine's
noise, the stall is the verify's own.

    PYTHONPATH=/work/main python bench/verify_latency.py            # before
    PYTHONPATH=. python bench/verify_latency.py --root DIR          # after, same store

Run it with ``PYTHONPATH`` naming the tree to measure; the store is kept in ``--root``
(default: a new temp dir) and reused when it exists.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _serve import served

NODES = "def count(state):\n    return {'n': state.get('n', 0) + 1}\n"
LOOP = """\
workflow: loop
limits: {steps: %d}
nodes:
  step: {call: vlnodes:count, writes: [n]}
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'n < %d'}
  - {from: step, to: END, otherwise: true}
"""


def populate(root: Path, store: str, records: int) -> int:
    import interlock

    sys.path.insert(0, str(root))
    steps = max(records // 3, 1)
    (root / "vlnodes.py").write_text(NODES)
    (root / "loop.yaml").write_text(LOOP % (steps + 10, steps))
    result = interlock.load(str(root / "loop.yaml")).run_sync({"n": 0}, store=store,
                                                               run_id="long")
    assert result.status == "COMPLETED", result.error
    (root / "filled").write_text("yes\n")
    return result.steps


async def probe(c: httpx.AsyncClient, every: float, done: asyncio.Event) -> list[float]:
    times: list[float] = []
    while not done.is_set():
        t = time.perf_counter()
        (await c.get("/api/health")).raise_for_status()
        times.append(time.perf_counter() - t)
        await asyncio.sleep(every)
    return times


async def measure(url: str, every: float, repeat: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        (await c.get("/api/health")).raise_for_status()
        done = asyncio.Event()
        alone = asyncio.create_task(probe(c, every, done))
        await asyncio.sleep(1.0)
        done.set()
        quiet = await alone
        verifies, during = [], []
        records = 0
        for _ in range(repeat):
            done = asyncio.Event()
            prober = asyncio.create_task(probe(c, every, done))
            t = time.perf_counter()
            body = (await c.get("/api/runs/long/verify")).json()
            verifies.append(time.perf_counter() - t)
            done.set()
            during += await prober
            assert body["ok"], body
            records = body["records"]
    ms = 1000.0
    print(f"records verified: {records}")
    print(f"verify median: {statistics.median(verifies) * ms:.1f} ms")
    print(f"health alone: median {statistics.median(quiet) * ms:.2f} ms, "
          f"max {max(quiet) * ms:.2f} ms ({len(quiet)} requests)")
    print(f"health during verify: median {statistics.median(during) * ms:.2f} ms, "
          f"max {max(during) * ms:.2f} ms ({len(during)} requests)")


async def stalls(store: str, repeat: int) -> None:
    """The event loop's longest gap between two ticks of a task while verify runs."""
    import inspect

    import interlock

    shares = "share_loop" in inspect.signature(interlock.verify).parameters
    st = interlock.open_store(store)
    try:
        for share in ((False, True) if shares else (False,)):
            worst: list[tuple[float, float]] = []
            for _ in range(repeat):
                stop = asyncio.Event()

                async def ticker(stop: asyncio.Event = stop) -> tuple[float, float]:
                    # wall time, and this thread's CPU time (the machine's preemption
                    # left out) between two ticks
                    gap = cpu = 0.0
                    last, last_cpu = time.perf_counter(), time.thread_time()
                    while not stop.is_set():
                        await asyncio.sleep(0)
                        now, now_cpu = time.perf_counter(), time.thread_time()
                        gap, cpu = max(gap, now - last), max(cpu, now_cpu - last_cpu)
                        last, last_cpu = now, now_cpu
                    return gap, cpu

                task = asyncio.create_task(ticker())
                await asyncio.sleep(0)
                kw = {"share_loop": True} if share else {}
                v = await interlock.verify("long", store=st, **kw)
                stop.set()
                worst.append(await task)
                assert v.ok, v
            wall = [w for w, _ in worst]
            cpu = [c for _, c in worst]
            print(f"loop's longest stall during verify, share_loop={share}: wall median "
                  f"{statistics.median(wall) * 1000:.1f} ms (max {max(wall) * 1000:.1f}), "
                  f"CPU median {statistics.median(cpu) * 1000:.1f} ms "
                  f"(max {max(cpu) * 1000:.1f})")
    finally:
        await st.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root")
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--every", type=float, default=0.005)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="verify-latency-"))
    root.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{root / 'runs.db'}"
    if not (root / "filled").exists():
        print(f"filling {store}: {populate(root, store, args.records)} steps", flush=True)
    with served(root, "--store", store, "--workflows", str(root / "loop.yaml"),
                "--workers", "0", "--no-take-over") as url:
        asyncio.run(measure(url, args.every, args.repeat))
    asyncio.run(stalls(store, args.repeat))


if __name__ == "__main__":
    main()
