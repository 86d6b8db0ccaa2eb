"""Workers' throughput and pickup latency (docs/workers.md): detached runs executed by
1..K ``interlock worker`` processes on one store.

    python bench/workers.py [--store sqlite|postgres] [--runs 200] [--workers 1,2,3]

For each number of workers: start them (idle, ``--poll 0.5``), record RUNS detached runs
of a 3-node chain of no-op nodes at once, and time from the first submission to the last
run completed (read from the store every 20 ms). Then, with the workers idle, one more
run, ``--pickups`` times: the time from its submission to its completion (the pickup
latency: before issue 34 up to one poll interval on SQLite, ~0.25 s on average; now the
store's change detector, a few ms). PostgreSQL needs $INTERLOCK_TEST_POSTGRES (a fresh schema
per measurement). Not a test: figures in bench/HISTORY.md, "Workers" and "Live records
from other processes".
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
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import interlock

NODES = "def step(state):\n    return {'n': state['n'] + 1}\n"
FLOW = """
workflow: chain
input: [n]
nodes: {a: bnodes:step, b: bnodes:step, c: bnodes:step}
edges:
  - {from: START, to: a}
  - {from: a, to: b}
  - {from: b, to: c}
  - {from: c, to: END}
"""


def _store(kind: str, root: Path) -> tuple[str, str | None]:
    if kind == "sqlite":
        return f"sqlite:///{root / f'{uuid.uuid4().hex[:6]}.db'}", None
    import psycopg

    base = os.environ["INTERLOCK_TEST_POSTGRES"]
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    parts = urlsplit(base)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urlunsplit(parts._replace(query=urlencode(query))), schema


async def _measure(url: str, runs: int, wf: interlock.Workflow, pickups: int
                   ) -> tuple[float, list[float]]:
    async with interlock.open_store(url) as st:
        await st.list_runs(limit=1)  # schema made before the clock starts
        t0 = time.perf_counter()
        for i in range(runs):
            await wf.submit({"n": i}, store=st)
        while len(await st.list_runs(status="COMPLETED", limit=runs + 1)) < runs:
            await asyncio.sleep(0.02)
        total = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # the workers idle again
        latencies = []
        for _ in range(pickups):
            t1 = time.perf_counter()
            rid = (await wf.submit({"n": 0}, store=st)).run_id
            while (await st.get_run(rid)).summary.status != "COMPLETED":
                await asyncio.sleep(0.005)
            latencies.append(time.perf_counter() - t1)
            await asyncio.sleep(0.37)  # land at another phase of the poll
        return total, sorted(latencies)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pickups", type=int, default=20)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    (root / "bnodes.py").write_text(NODES)
    (root / "chain.yaml").write_text(FLOW)
    sys.path.insert(0, str(root))
    wf = interlock.load(root / "chain.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(  # (the interlock this runs with)
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    print(f"{args.runs} runs of a 3-node chain, {args.store}, --concurrency "
          f"{args.concurrency} each")
    print(f"| workers | runs/s | total s | pickup latency (idle, {args.pickups} runs): "
          "p50 / max |")
    print("|---|---|---|---|")
    for k in (int(x) for x in args.workers.split(",")):
        url, schema = _store(args.store, root)
        procs = [subprocess.Popen([sys.executable, "-m", "interlock", "worker", "--store",
                                   url, "--concurrency", str(args.concurrency)],
                                  cwd=root, env=env, stderr=subprocess.DEVNULL)
                 for _ in range(k)]
        try:
            time.sleep(2.0)  # started and idle
            total, lat = asyncio.run(_measure(url, args.runs, wf, args.pickups))
            print(f"| {k} | {args.runs / total:.0f} | {total:.2f} | "
                  f"{statistics.median(lat) * 1000:.0f} / {lat[-1] * 1000:.0f} ms |")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
            if schema is not None:
                import psycopg

                with psycopg.connect(os.environ["INTERLOCK_TEST_POSTGRES"],
                                     autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
