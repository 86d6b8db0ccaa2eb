"""CPU of processes with nothing to do (issue 34: the change detector must cost near
nothing): over ``--seconds``, the CPU time (user + system, from /proc) of

- ``interlock worker`` idle (waiting for runnable runs: on SQLite the detector looks at
  ``data_version`` all the while; on PostgreSQL it waits on its ``LISTEN`` connection),
- ``interlock serve`` idle with no stream open (no detector running),
- ``interlock serve`` with one event stream open on a run no one executes (a pending
  detached run: the stream waits for records from elsewhere, the detector looks, or the
  ``LISTEN`` connection waits).

    python bench/idle_cpu.py [--seconds 10] [--store sqlite|postgres]

PostgreSQL needs $INTERLOCK_TEST_POSTGRES (a fresh schema is made).

Linux only. Not a test: figures in bench/HISTORY.md, "PostgreSQL
`LISTEN/NOTIFY` for the streams, and SQLite told by the kernel".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _serve import served
from workers import _store

import interlock

FLOW = """
workflow: idle
nodes: {a: inodes:step}
edges:
  - {from: START, to: a}
  - {from: a, to: END}
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def share(pid: int, seconds: float) -> str:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    c1, t1 = cpu_seconds(pid), time.monotonic()
    return f"{100 * (c1 - c0) / (t1 - t0):.2f}% of a core"


def server_pid(port_url: str) -> int:
    port = port_url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True).stdout
    return int(out.split("pid=", 1)[1].split(",", 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="idle-bench-"))
    (root / "inodes.py").write_text("def step(state):\n    return {}\n")
    (root / "idle.yaml").write_text(FLOW)
    sys.path.insert(0, str(root))
    store, _ = _store(args.store, root)
    wf = interlock.load(root / "idle.yaml")
    asyncio.run(wf.run({}, store=store))  # the file made, nothing runnable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    worker = subprocess.Popen([sys.executable, "-m", "interlock", "worker", "--store", store],
                              cwd=root, env=env, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # started and idle
        print(f"worker idle ({args.store}):{' ' * (22 - len(args.store))}"
              f"{share(worker.pid, args.seconds)}")
    finally:
        assert worker.poll() is None, "the worker ended"
        worker.terminate()
        worker.wait(60)
    pending = asyncio.run(wf.submit({}, store=store)).run_id  # executed by no one
    with served(root, "--store", store, "--workflows", "idle.yaml", "--workers", "0") as url:
        pid = server_pid(url)
        time.sleep(2.0)
        print(f"server idle, no stream:            {share(pid, args.seconds)}")
        stop = threading.Event()

        def follow() -> None:
            with httpx.Client(base_url=url, timeout=None) as c, \
                    c.stream("GET", f"/api/runs/{pending}/events") as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(2.0)
        print(f"server, one stream on a remote run: {share(pid, args.seconds)}")
        stop.set()


if __name__ == "__main__":
    main()
