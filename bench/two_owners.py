"""Two would-be owners of one run (issue 26): 26 timed trials of each scenario of
tests/_two_owners.py, with real ``interlock worker`` processes, on SQLite and PostgreSQL.

    python bench/two_owners.py [--store sqlite|postgres|both] [--trials 26] [--lease 2]

- ``block``: an ``async def`` node blocks its worker's event loop (``time.sleep``) for
  2.5 leases while a second worker polls: does the first keep the lease?
- ``stop``: the first worker is SIGSTOPped past its lease, the second takes the run
  over, then the first is SIGCONTed: how long until it stops (says the run moved)?

Each trial passes when the run COMPLETED, verifies, each ``ctx.once`` effect ran once,
each node completed once, and (block) the second worker never claimed the run, or
(stop) the first said the run moved to another owner. Also: what a claim check costs
(`Store.heartbeat`, the call ``ctx.once`` makes when the lease may be near its end).
PostgreSQL needs $INTERLOCK_TEST_POSTGRES (a fresh schema per run of this script). Not
a test: figures in bench/HISTORY.md, "Two owners of one run".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _two_owners import trial

from interlock._store import open_store


def _pg_url() -> str:
    base = os.environ.get("INTERLOCK_TEST_POSTGRES")
    if not base:
        raise SystemExit("set INTERLOCK_TEST_POSTGRES for --store postgres")
    import psycopg

    schema = f"two_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    parts = urlsplit(base)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _url(kind: str, workdir: Path) -> str:
    return f"sqlite:///{workdir / 'runs.db'}" if kind == "sqlite" else _pg_url()


async def _check_cost(url: str, n: int = 300) -> float:
    """Mean seconds of one claim check (a heartbeat with the generation)."""
    from interlock._log import LogWriter
    from interlock._store import RunRow, Summary

    st = open_store(url)
    try:
        w = LogWriter()
        _, entry = w.make("run.started", {})
        row = RunRow("cost", "w", {}, "h", {}, {}, time.time(),
                     Summary("RUNNING", 1, w.hash))
        await st.create_run(row, [entry])
        gen = await st.claim("cost", "me:1:x", 60)
        await st.heartbeat("cost", "me:1:x", 60, gen)
        t0 = time.perf_counter()
        for _ in range(n):
            await st.heartbeat("cost", "me:1:x", 60, gen)
        return (time.perf_counter() - t0) / n
    finally:
        await st.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="both", choices=["sqlite", "postgres", "both"])
    ap.add_argument("--trials", type=int, default=26)
    ap.add_argument("--lease", type=float, default=2.0)
    args = ap.parse_args()
    kinds = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    for kind in kinds:
        root = Path(tempfile.mkdtemp(prefix="two-owners-"))
        cost = asyncio.run(_check_cost(_url(kind, root / "cost") if kind == "postgres"
                                       else f"sqlite:///{root / 'cost.db'}"))
        print(f"{kind}: a claim check (heartbeat) costs {cost * 1e3:.2f} ms", flush=True)
        for mode in ("block", "stop"):
            passed, effects_twice, b_claims, stops, secs = 0, 0, 0, [], []
            for i in range(args.trials):
                workdir = root / f"{mode}-{i}"
                workdir.mkdir()
                url = _url(kind, workdir)
                try:
                    t = trial(workdir, url, mode, lease=args.lease, block=args.lease * 2.5)
                except AssertionError as exc:
                    print(f"  {mode} #{i + 1}: ERROR {str(exc)[:300]}", flush=True)
                    continue
                if t.no_takeover:
                    print(f"  {mode} #{i + 1}: no takeover (A held SQLite's write lock while "
                          f"stopped); effects {dict(t.effects)}", flush=True)
                passed += t.ok
                effects_twice += any(n > 1 for n in t.effects.values())
                b_claims += t.mode == "block" and t.b_claimed
                if t.stop_after_cont is not None:
                    stops.append(t.stop_after_cont)
                secs.append(t.seconds)
                if not t.ok:
                    print(f"  {mode} #{i + 1}: FAILED {t.why()[:2000]}", flush=True)
                shutil.rmtree(workdir, ignore_errors=True)
            line = (f"{kind} {mode}: {passed}/{args.trials} trials passed; an effect twice "
                    f"in {effects_twice}; ")
            if mode == "block":
                line += f"the second worker claimed the run in {b_claims}"
            elif stops:
                line += (f"the first stopped {statistics.median(stops) * 1e3:.0f} ms "
                         f"(median; max {max(stops) * 1e3:.0f} ms) after SIGCONT")
            line += f"; {statistics.mean(secs):.1f} s a trial" if secs else ""
            print(line, flush=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
