"""Snapshots: a fold cached at a sequence number, so a resume reads only what came after.

A snapshot is never a second truth. It records the seq and the chain hash of the
last record it covers, and it is bound to the chain: the record right after it is
``snapshot.taken`` with the snapshot's seq and SHA-256 digest, written in the same
transaction as the records it covers (the snapshot row itself is saved after). A
reader uses a snapshot only when that record follows it, chained to its hash, and
holds its digest; otherwise it folds the whole log and says why. ``interlock
verify`` folds the whole log and reports a snapshot that does not match. Only the
latest snapshot of a run is kept, so storage stays O(state) + O(log).

The encoding is explicit, field by field (JSON has no tuples, sets or int keys),
and versioned: a snapshot of another version is simply not used.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from typing import Any

import orjson

from .. import _log as L
from .._definition._plan import Plan
from ._fold import Due, Gate, MapRun, RunView, Visit, Writer

VERSION = 4  # 2: a running visit's tokens, failures and effect tokens; 3: bound to the log;
# 4: mapped nodes' visits
EVERY = 500  # records between snapshots, at least
# ... and at least one record per this many bytes of the last snapshot: a large view
# (a 1000-node graph) is dumped less often, so snapshots cost O(1) per record
BYTES_PER_RECORD = 32


def interval(size: int) -> int:
    """Records to wait after a snapshot of ``size`` bytes before taking the next one."""
    return max(EVERY, size // BYTES_PER_RECORD)


def dump(view: RunView, last_hash: str) -> bytes:
    """The view as bytes; ``last_hash`` is the chain hash of record ``view.seq``."""
    v = view
    data = {
        "version": VERSION, "seq": v.seq, "hash": last_hash,
        "state": v.state, "ready": list(v.ready),
        "running": [_visit(x) for x in v.running.values()],
        "due": [[d.edge.index, d.source, d.goto, list(d.arrived)] for d in v.due.values()],
        "visits": dict(v.visits), "started": dict(v.started),
        "takes": list(v.takes.items()), "steps": v.steps, "tokens": v.tokens,
        "config": v.config, "limits": v.limits,
        "parent": list(v.parent) if v.parent else None, "status": v.status,
        "error": v.error, "waiting": v.waiting,
        "writers": {k: [w.node, w.completed_seq] for k, w in v.writers.items()},
        "effects": [[n, vis, key, val] for (n, vis, key), val in v.effects.items()],
        "gates": [[g.node, g.visit, g.kind, g.requested_at, g.show, g.decisions, g.deadline,
                   g.decision, g.body_started, g.key, g.input, g.path]
                  for g in v.gates.values()],
        "confirmations": [[n, vis, key, d] for (n, vis, key), d in v.confirmations.items()],
        "routed": v.routed, "route_wait": dict(v.route_wait),
        "acts": {t: [list(a.items()) for a in q] for t, q in v._acts.items() if q},
        "barriers": [[i, [list(e.items()) for e in q]] for i, q in v._barriers.items() if q],
        "active": list(v._active.items()),
        "deferred": [[c, [list(x) for x in items]] for c, items in v._deferred.items()],
        "taken_exits": [[c, [list(x) for x in items]] for c, items in v._taken_exits.items()],
        "maps": [[n, vis, m.items, list(m.done.items()), [_visit(x) for x in m.running.values()],
                  list(m.running)] for (n, vis), m in v.maps.items()],
        "map_items": {t: list(q) for t, q in v.map_items.items() if q},
    }
    return orjson.dumps(data, default=L.json_default)  # not hashed: no need to sort keys


def _visit(x: Visit) -> list[Any]:
    return [x.node, x.visit, x.attempt, x.started_seq, x.tokens, x.failures, x.effect_tokens]


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def taken(seq: int, raw: bytes) -> tuple[str, dict[str, Any]]:
    """The record that binds the snapshot ``raw`` of the view at ``seq`` to the chain."""
    return L.SNAPSHOT_TAKEN, {"covers": seq, "digest": digest(raw)}


def unbound(raw: bytes, seq: int, after: list[L.Entry]) -> str | None:
    """Why the snapshot ``raw`` at ``seq`` is not vouched for by the records ``after`` it
    (None when the first of them is its ``snapshot.taken``, with its digest).

    The caller checks the chain of ``after`` from the snapshot's hash.
    """
    first = after[0] if after else None
    if first is None or first.seq != seq + 1 or first.type != L.SNAPSHOT_TAKEN:
        return f"record {seq + 1} is not the snapshot.taken that vouches for it"
    try:
        rec = first.record()
    except ValueError:
        return f"record {seq + 1} is not valid JSON"
    if rec.get("covers") != seq or rec.get("digest") != digest(raw):
        return (f"its digest is not the one record {seq + 1} holds (the snapshot was "
                "changed after it was taken)")
    return None


def load(plan: Plan, raw: bytes) -> tuple[RunView, str] | None:
    """The view a snapshot holds, and the hash of its last record; None if unusable."""
    try:
        d: dict[str, Any] = orjson.loads(raw)
        if d.get("version") != VERSION:
            return None
        return _restore(plan, d), str(d["hash"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return None  # a cache that cannot be read is rebuilt from the log


def _restore(plan: Plan, d: dict[str, Any]) -> RunView:
    v = RunView(plan)
    v.seq = d["seq"]
    v.state = d["state"]
    v.ready = deque(d["ready"])
    v.running = {(r[0], r[1]): Visit(*r) for r in d["running"]}
    v.due = {(i, src): Due(plan.edges[i], src, goto, tuple(arr))
             for i, src, goto, arr in d["due"]}
    v.visits = Counter(d["visits"])
    v.started = Counter(d["started"])
    v.takes = Counter({int(k): n for k, n in d["takes"]})
    v.steps, v.tokens = d["steps"], d["tokens"]
    v.config, v.limits = d["config"], d["limits"]
    v.parent = (d["parent"][0], d["parent"][1]) if d["parent"] else None
    v.status, v.error, v.waiting = d["status"], d["error"], d["waiting"]
    v.writers = {k: Writer(n, s) for k, (n, s) in d["writers"].items()}
    v.effects = {(n, vis, key if isinstance(key, str) else tuple(key)): val
                 for n, vis, key, val in d["effects"]}
    v.gates = {(g[0], g[1]): Gate(*g) for g in d["gates"]}
    v.confirmations = {(n, vis, key): dec for n, vis, key, dec in d["confirmations"]}
    v.routed = d["routed"]
    v.route_wait = Counter(d["route_wait"])
    v._acts = {t: deque({int(p): b for p, b in a} for a in q) for t, q in d["acts"].items()}
    v._barriers = {int(i): deque({s: b for s, b in e} for e in q) for i, q in d["barriers"]}
    v._active = Counter({int(c): n for c, n in d["active"]})
    v._deferred = {int(c): {tuple(x) for x in items} for c, items in d["deferred"]}
    v._taken_exits = {int(c): {tuple(x) for x in items} for c, items in d["taken_exits"]}
    v.maps = {(n, vis): MapRun(items, {int(i): u for i, u in done},
                               {int(i): Visit(*r) for i, r in zip(idx, running, strict=True)})
              for n, vis, items, done, running, idx in d["maps"]}
    v.map_items = {t: deque(q) for t, q in d["map_items"].items()}
    return v
