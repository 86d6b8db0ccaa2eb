"""What the ``NOTIFY`` of an append costs on the PostgreSQL store (issue 34: the
notification an append makes for the server's event streams must not make durable
steps slower than noise), and what notifying only while a listener has announced itself
saves (nobody listens here).

    python bench/pg_append.py [--rounds 20] [--appends 50] [--seconds 12]

Needs $INTERLOCK_TEST_POSTGRES (a fresh schema is made; measure on a server with its
durable defaults too: ``INTERLOCK_PG_DURABLE=1 source .ci/postgres.sh``). The store's
append statements are used as they are (``gated``: they read whether a listener has
announced itself, and nobody has, so they notify nothing) and notifying every append
(``notify``: what they did before), *interleaved* in one process -- round after round,
A then B -- so that the machine's noise falls on both alike:

- ``lone append``: one run, appends of two records one after the other from one task
  (each its own transaction: a lone durable step's commit), ``--appends`` per round and
  variant; the median per append of each variant over all rounds, and the median of
  the per-round differences;
- ``chain step``: ``await wf.run(...)`` of a 50-node chain on a store opened once, one
  run per round and variant, per step;
- ``two processes``: two processes, each appending to its own run one append after the
  other for ``--seconds``, both switching variant every half second of the clock:
  appends per second of each variant, both processes together. ``NOTIFY`` serialises
  the commits of the transactions that notify (a lock held through the commit), so this
  is where it would show.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from workers import _store

import interlock
from interlock._log import LogWriter
from interlock._store import RunRow, Summary, _postgres_sql, _postgres_writes

_ALWAYS = _postgres_sql._NOTIFY.replace(_postgres_sql._LISTENED, "true")
VARIANTS = {
    "gated": (_postgres_sql._APPEND, _postgres_sql._APPEND_MANY),
    "notify": (_postgres_sql._APPEND.replace(_postgres_sql._NOTIFY, _ALWAYS),
               _postgres_sql._APPEND_MANY.replace(_postgres_sql._NOTIFY, _ALWAYS)),
}
assert all("interlock_listening" not in sql for sql in VARIANTS["notify"])
SLOT = 0.5  # seconds of the clock per variant in the two-process case


def _use(variant: str) -> None:
    _postgres_writes._APPEND, _postgres_writes._APPEND_MANY = VARIANTS[variant]


def _row(run_id: str, w: LogWriter) -> RunRow:
    return RunRow(run_id=run_id, workflow="bench", definition={"name": "bench"},
                  definition_hash="sha256:" + "0" * 64, input={}, options={},
                  created_at=time.time(),
                  summary=Summary(status="RUNNING", last_seq=w.seq, last_hash=w.hash,
                                  updated_at=time.time()))


class Appender:
    """Appends of two records to one new run, one after the other."""

    def __init__(self, st: interlock.Store) -> None:
        self.st, self.w = st, LogWriter()
        self.run_id = f"bench-{uuid.uuid4().hex[:10]}"

    async def start(self) -> None:
        _, first = self.w.make("run.started", {"input": {}})
        await self.st.create_run(_row(self.run_id, self.w), [first])

    async def once(self) -> float:
        w, node = self.w, f"n{self.w.seq}"
        _, a = w.make("node.started", {"node": node, "attempt": 1})
        _, b = w.make("node.completed", {"node": node, "duration": 0.001, "update": {}})
        t0 = time.perf_counter()
        await self.st.append(self.run_id, [a, b], Summary(
            status="RUNNING", last_seq=w.seq, last_hash=w.hash, updated_at=time.time()))
        return time.perf_counter() - t0


async def _lone(url: str, rounds: int, appends: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"notify": [], "gated": []}
    async with interlock.open_store(url) as st:
        app = Appender(st)
        await app.start()
        for _ in range(20):
            await app.once()  # warm-up
        for _ in range(rounds):
            for variant in ("gated", "notify"):
                _use(variant)
                out[variant].append(statistics.median(
                    [await app.once() for _ in range(appends)]) * 1e6)
    return out


async def _chain(url: str, root: Path, rounds: int) -> dict[str, list[float]]:
    (root / "pa_nodes.py").write_text("def step(state):\n    return {}\n")
    n = 50
    nodes = "\n".join(f"  n{i}: pa_nodes:step" for i in range(n))
    edges = "\n".join(f"  - {{from: {'START' if i == 0 else f'n{i - 1}'}, to: n{i}}}"
                      for i in range(n))
    (root / "pa.yaml").write_text(f"workflow: pa\nnodes:\n{nodes}\nedges:\n{edges}\n"
                                  f"  - {{from: n{n - 1}, to: END}}\n")
    sys.path.insert(0, str(root))
    wf = interlock.load(root / "pa.yaml")
    out: dict[str, list[float]] = {"notify": [], "gated": []}
    async with interlock.open_store(url) as st:
        await wf.run({}, store=st)  # warm-up
        for _ in range(rounds):
            for variant in ("gated", "notify"):
                _use(variant)
                t0 = time.perf_counter()
                await wf.run({}, store=st)
                out[variant].append((time.perf_counter() - t0) / n * 1e6)
    return out


async def _slots(url: str, seconds: float) -> dict[str, int]:
    done = {"notify": 0, "gated": 0}
    async with interlock.open_store(url) as st:
        app = Appender(st)
        await app.start()
        end = time.time() + seconds
        while (now := time.time()) < end:
            variant = "gated" if int(now / SLOT) % 2 else "notify"
            _use(variant)
            await app.once()
            done[variant] += 1  # (counted where it began)
    return done


def _process(url: str, seconds: float, out: multiprocessing.Queue[dict[str, int]]) -> None:
    out.put(asyncio.run(_slots(url, seconds)))


def _report(name: str, got: dict[str, list[float]], unit: str) -> None:
    diffs = [b - a for a, b in zip(got["gated"], got["notify"], strict=True)]
    print(f"{name}: gated median {statistics.median(got['gated']):.0f} {unit}, "
          f"notify median {statistics.median(got['notify']):.0f} {unit}; per round, notify "
          f"- gated: median {statistics.median(diffs):+.0f} {unit} "
          f"(rounds {len(diffs)}, min {min(got['gated']):.0f} / {min(got['notify']):.0f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--appends", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=12.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pg-append-"))
    url, _ = _store("postgres", root)
    _report("lone append (us)", asyncio.run(_lone(url, args.rounds, args.appends)), "us")
    _report("chain step (us) ", asyncio.run(_chain(url, root, args.rounds)), "us")
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[dict[str, int]] = ctx.Queue()
    procs = [ctx.Process(target=_process, args=(url, args.seconds, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    counts = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    rate = {v: sum(c[v] for c in counts) / (args.seconds / 2) for v in ("gated", "notify")}
    print(f"two processes: gated {rate['gated']:.0f} appends/s, notify {rate['notify']:.0f} "
          f"appends/s ({args.seconds:.0f} s, variants alternating every {SLOT} s)")


if __name__ == "__main__":
    main()
