"""The floor: ``python floor_adapter.py SCENARIO PARAMS_JSON``.

Not an engine: a bare Python loop that does, per node, only the work interlock's SPEC
requires of a run -- and nothing else -- so that the table shows how much of interlock's
per-node cost is the irreducible cost of producing its log. Runs with the project's own
venv (like interlock's adapter), for S1 (a chain) and S3 (a loop) only; the other
scenarios print a ``skipped`` line (bench/run.py does not start this adapter for them).

Per node it

- seals a ``node.started`` record,
- awaits the same node coroutine as interlock's adapter (``inc``) on the state dict,
- merges the update into the state dict,
- seals a ``node.completed`` record (``update``, ``duration_ms`` from ``perf_counter``),
- decides the node's edges: S1 an ``edge.taken`` record to the next node; S3 evaluates
  ``i < N`` with interlock's own CEL engine (compiled once with
  ``interlock._definition._expr.compile_expression``; ``decide`` gives the value and the values
  read)
  and seals the ``when`` edge's and the ``otherwise`` edge's ``edge.taken`` /
  ``edge.skipped`` records, with the fields interlock writes;

plus a ``run.started`` record first (with the ``START`` edge's ``edge.taken``) and a
``run.completed`` record last. Sealing is what ``interlock._log.LogWriter.seal`` does,
written out here on purpose (the point is a minimal implementation, not interlock's):
``seq``, ``type`` and ``at`` (``time.time()``) added, canonical JSON by
``orjson.dumps(rec, default, OPT_SORT_KEYS | OPT_SERIALIZE_NUMPY)``, an exact-size copy of
the bytes, ``sha256(previous hash || bytes)`` chained, and the result appended to a list
(what an in-memory store keeps). The records have the same fields, the same bytes shape
and the same chain as interlock's.

No scheduler, no fold into a view, no store interface, no run id, no update validation,
no timeouts, no commit batching: whatever interlock spends beyond this is its own.
Timing is as in the other adapters (``_common.trials``, the same metric names).

S5 (durable): the same records, and after each node its records appended to a SQLite
file in WAL mode with one commit (``BEGIN IMMEDIATE``, one ``INSERT`` per record into a
table of ``(id, data, hash)`` as interlock's ``entries``, ``COMMIT``), on the event
loop's thread, and no checkpoint -- what a durable step cannot do without. A run's
``run.started`` and ``START`` edge are committed together first, its ``run.completed``
last. Three ways, as
interlock's S5 rows: a new file whose connection, WAL switch and table are made inside
the clock (``per_step_us``), the same with ``synchronous=full`` (``@sync=full``), and a
connection opened and its table made before the clock (``@open``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from _common import Emitter, db_size_kb, main, per_step_trials

from interlock._definition._expr import compile_expression

ENGINE = "floor"
NOT_MEASURED = ("the floor (the log records alone, committed one step at a time in S5) is "
                "measured only where interlock's per-node targets apply: S1, S3 and S5")

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
_dumps = orjson.dumps
_now = time.time
_sha256 = hashlib.sha256
_join = b"".join
_perf = time.perf_counter


def _default(obj: Any) -> Any:
    """orjson's hook for what it does not serialise itself (never called here)."""
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


class Log:
    """A run's records: numbered, timestamped, serialised, hash-chained, kept in a list;
    with a ``commit`` (S5), each node's are appended to a database after it."""

    __slots__ = ("commit", "committed", "entries", "prev", "seq")

    def __init__(self, commit: Callable[[list[tuple[int, str, bytes, str]]], None] | None
                 = None) -> None:
        self.seq = 0
        self.prev = b"0" * 64  # the genesis hash, as ASCII bytes
        self.entries: list[tuple[int, str, bytes, str]] = []
        self.commit = commit
        self.committed = 0  # entries[:committed] are in the database

    def flush(self) -> None:
        """S5: the records not yet committed, in one transaction."""
        if self.commit is not None:
            self.commit(self.entries[self.committed:])
            self.committed = len(self.entries)

    def seal(self, rtype: str, rec: dict[str, Any]) -> None:
        self.seq = seq = self.seq + 1
        rec["seq"] = seq
        rec["type"] = rtype
        rec["at"] = _now()
        data = _join((_dumps(rec, _default, _OPTS), b""))  # exact-size copy
        h = _sha256(self.prev + data).hexdigest()
        self.prev = h.encode("ascii")
        self.entries.append((seq, rtype, data, h))


async def inc(state: dict[str, Any]) -> dict[str, Any]:
    """The node body, the same as interlock's adapter's."""
    return {"i": state["i"] + 1}


def _definition_hash(name: str) -> str:
    """A stand-in for the workflow's definition hash (interlock computes it once)."""
    return hashlib.sha256(name.encode()).hexdigest()


def _start(log: Log, workflow: str, definition_hash: str, data: dict[str, Any],
           first: str) -> None:
    log.seal("run.started", {"workflow": workflow, "definition_hash": definition_hash,
                             "input": data, "config": {}, "limits": {}})
    log.seal("edge.taken", {"edge": 0, "from": "START", "to": [first]})


def _check(state: dict[str, Any], log: Log, n: int, records: int) -> None:
    if state.get("i") != n or len(log.entries) != records:
        raise RuntimeError(f"expected i == {n} and {records} records, got i == "
                           f"{state.get('i')!r} and {len(log.entries)} records")


# -- scenarios -----------------------------------------------------------------------------

async def run_chain(names: list[str], successors: list[str], definition_hash: str,
                    data: dict[str, Any], log: Log | None = None
                    ) -> tuple[dict[str, Any], Log]:
    """START -> n0 -> ... -> n{N-1} -> END: three records per node, two per run."""
    log = log or Log()
    seal, flush = log.seal, log.flush
    _start(log, f"chain-{len(names)}", definition_hash, data, names[0])
    flush()
    state = dict(data)
    for k, name in enumerate(names):
        seal("node.started", {"node": name, "visit": 1, "attempt": 1})
        t0 = _perf()
        update = await inc(state)
        duration = round((_perf() - t0) * 1000, 3)
        state.update(update)
        seal("node.completed", {"node": name, "visit": 1, "attempt": 1,
                                "duration_ms": duration, "update": update})
        seal("edge.taken", {"edge": k + 1, "from": name, "to": [successors[k]]})
        flush()
    seal("run.completed", {})
    flush()
    return state, log


async def s1(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    names = [f"n{k}" for k in range(n)]
    successors = [*names[1:], "END"]
    definition_hash = _definition_hash(f"chain-{n}")

    async def once() -> None:
        state, log = await run_chain(names, successors, definition_hash, {"i": 0})
        _check(state, log, n, 3 * n + 3)

    await per_step_trials(em, p, once, n, "per_node")


async def run_loop(cond: Any, definition_hash: str, workflow: str,
                   data: dict[str, Any], log: Log | None = None
                   ) -> tuple[dict[str, Any], Log]:
    """step -> step when the condition holds, otherwise END: four records per iteration."""
    log = log or Log()
    seal, flush = log.seal, log.flush
    _start(log, workflow, definition_hash, data, "step")
    flush()
    source = cond.source
    state = dict(data)
    visit = 0
    while True:
        visit += 1
        seal("node.started", {"node": "step", "visit": visit, "attempt": 1})
        t0 = _perf()
        update = await inc(state)
        duration = round((_perf() - t0) * 1000, 3)
        state.update(update)
        seal("node.completed", {"node": "step", "visit": visit, "attempt": 1,
                                "duration_ms": duration, "update": update})
        value, reads = cond.decide(state)
        if type(value) is not bool:  # the SPEC: a condition is a boolean
            raise RuntimeError(f"condition {source!r} gave {value!r}, not a boolean")
        if value:
            seal("edge.taken", {"edge": 1, "from": "step", "to": ["step"], "expr": source,
                                "value": value, "reads": reads})
            seal("edge.skipped", {"edge": 2, "from": "step", "expr": "otherwise",
                                  "value": False})
            flush()
        else:
            seal("edge.skipped", {"edge": 1, "from": "step", "expr": source,
                                  "value": value, "reads": reads})
            seal("edge.taken", {"edge": 2, "from": "step", "to": ["END"],
                                "expr": "otherwise", "value": True})
            break
    seal("run.completed", {})
    flush()
    return state, log


async def s3(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    cond = compile_expression(f"i < {n}")
    definition_hash = _definition_hash(f"loop-{n}")

    async def once() -> None:
        state, log = await run_loop(cond, definition_hash, f"loop-{n}", {"i": 0})
        _check(state, log, n, 4 * n + 3)

    await per_step_trials(em, p, once, n, "per_iter")


# -- S5: the records committed a step at a time -----------------------------------------------

_TABLE = "CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, data TEXT, hash BLOB)"
_INSERT = "INSERT INTO entries (id, data, hash) VALUES (?, ?, ?)"


def connect(path: Path, synchronous: str) -> sqlite3.Connection:
    """A new database file in WAL mode with the entries table. As interlock's store: the
    switch of the new, empty file to WAL without its fsyncs (``synchronous=OFF``), and no
    checkpoint inside a commit (``wal_autocheckpoint=0``; interlock checkpoints on a
    thread of its own, here the WAL is copied into the file by the close, after the
    clock)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(_TABLE)
    return conn


def committer(conn: sqlite3.Connection) -> Callable[[list[tuple[int, str, bytes, str]]], None]:
    execute, executemany = conn.execute, conn.executemany

    def commit(entries: list[tuple[int, str, bytes, str]]) -> None:
        execute("BEGIN IMMEDIATE")
        executemany(_INSERT, [(seq, data.decode(), bytes.fromhex(h))
                              for seq, _, data, h in entries])
        execute("COMMIT")

    return commit


async def s5(em: Emitter, p: dict[str, Any]) -> None:
    n, warm_n = p["n"], p.get("warmup_n", p["n"])
    tmp = Path(tempfile.mkdtemp(prefix="floor-bench-"))
    per_node = 3 if p["graph"] == "chain" else 4
    cond = compile_expression(f"i < {n}")
    k = 0

    async def run(steps: int, log: Log) -> None:
        if p["graph"] == "chain":
            names = [f"n{j}" for j in range(steps)]
            state, _ = await run_chain(names, [*names[1:], "END"],
                                       _definition_hash(f"chain-{steps}"), {"i": 0}, log)
        else:
            c = cond if steps == n else compile_expression(f"i < {steps}")
            state, _ = await run_loop(c, _definition_hash(f"loop-{steps}"), f"loop-{steps}",
                                      {"i": 0}, log)
        _check(state, log, steps, per_node * steps + 3)

    async def once(steps: int, synchronous: str, opened: bool) -> tuple[float, float, float]:
        nonlocal k
        k += 1
        path = tmp / f"run{k}.db"
        conn = connect(path, synchronous) if opened else None
        c0, t0 = time.process_time(), time.perf_counter()
        if conn is None:
            conn = connect(path, synchronous)
        await run(steps, Log(committer(conn)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        conn.close()
        return dt, cpu, db_size_kb(path)

    try:
        for synchronous, opened, suffix in (("NORMAL", False, ""), ("FULL", False, "@sync=full"),
                                            ("NORMAL", True, "@open")):
            for _ in range(p["warmup"]):
                await once(warm_n, synchronous, opened)
            for t in range(p["trials"]):
                dt, cpu, size = await once(n, synchronous, opened)
                em.value("per_step_us" + suffix, dt / n * 1e6, "us", trial=t)
                em.value("per_step_cpu_us" + suffix, cpu / n * 1e6, "us", trial=t)
                if not suffix:
                    em.value("db_kb", size, "KiB", trial=t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def not_measured(em: Emitter, p: dict[str, Any]) -> None:
    em.skipped("*", NOT_MEASURED)


def _version() -> str:
    return (f"bare Python loop; orjson {orjson.__version__}, CEL (interlock._definition._expr) "
            f"common-expression-language {_dist_version('common-expression-language')}, "
            f"interlock {_dist_version('interlock')}")


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main(ENGINE, {"S1": s1, "S3": s3, "S5": s5,
                  **{s: not_measured for s in ("S2", "S4", "S6", "S7", "S8", "S9")}},
         _version)
