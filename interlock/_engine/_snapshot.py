"""Snapshots: a fold cached at a sequence number, so a resume reads only what came after.

A snapshot is never a second truth. It records the seq and the chain hash of the
last record it covers, and it is bound to the chain: the record right after it is
``snapshot.taken`` with the snapshot's seq and SHA-256 digest, written in the same
transaction as the records it covers (the snapshot row itself is saved after). A
reader uses a snapshot only when that record follows it, chained to its hash, and
holds its digest; otherwise it folds the whole log and says why. ``interlock
verify`` folds the whole log and reports a snapshot that does not match. Only the
latest snapshot of a run is kept, so storage stays O(state) + O(log).

The encoding of the view is `RunView.dump` / `RunView.restore` (field by field:
JSON has no tuples, sets or int keys); this module versions it and binds it to the
chain: a snapshot of another version is simply not used.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .. import _log as L
from .._definition._plan import Plan
from .._json import JSONObject
from ._fold import RunView

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
    data = {"version": VERSION, "seq": view.seq, "hash": last_hash, **view.dump()}
    return orjson.dumps(data, default=L.json_default)  # not hashed: no need to sort keys


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def taken(seq: int, raw: bytes) -> tuple[str, JSONObject]:
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
        if d.get("version") != VERSION or d.get("migration") is not None:
            return None  # (a migrated run's view is under another plan: the log is folded)
        return RunView.restore(plan, d["seq"], d), str(d["hash"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return None  # a cache that cannot be read is rebuilt from the log
