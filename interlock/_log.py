"""Log records: their shape, their canonical bytes, and the hash chain.

A run is its log. Every record is a JSON object with at least

    {"seq": 1, "type": "node.completed", "at": 1764480000.123, "node": "rca", ...}

``seq`` starts at 1 and has no gaps. Records are serialised once, canonically
(orjson, sorted keys), and those exact bytes are what a store keeps and what
the chain hashes:

    hash(n) = sha256(hash(n-1) || bytes(n))          hash(0) = 64 * "0"

so changing, dropping or reordering any stored record breaks every later hash.

With ``INTERLOCK_LOG_KEY`` set when a run starts, its chain is *keyed*: HMAC-SHA-256
under that key in place of plain SHA-256, same shape otherwise. Anyone who can write
the store can recompute a plain chain; only a holder of the key can make a keyed one,
so `verify` with the key proves the log was written by one. A keyed run says so in
its ``run.started`` record (``chain: "hmac-sha256"`` and the key's ``key_id``, a
digest that identifies the key without revealing it). Plain logs stay plain.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import os
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

GENESIS = "0" * 64
LOG_KEY_ENV = "INTERLOCK_LOG_KEY"
KEYED = "hmac-sha256"  # a keyed run's ``chain`` (in its run.started and its row's options)

Record = dict[str, Any]

# Record types. Kept as constants so a typo is a NameError, not a silent miss.
RUN_STARTED = "run.started"
RUN_RESUMED = "run.resumed"
CHILD_STARTED = "child.started"  # a sub-workflow node started its child run
RUN_FORKED = "run.forked"
STATE_PATCHED = "state.patched"
RUN_WAITING = "run.waiting"
RUN_COMPLETED = "run.completed"
RUN_FAILED = "run.failed"
RUN_REJECTED = "run.rejected"
RUN_CANCELLED = "run.cancelled"
NODE_STARTED = "node.started"
NODE_COMPLETED = "node.completed"
# a visit that started and completed in one batch (log format 2): node.started and
# node.completed in one record, the completion's fields, sealed where the start would be;
# from format 3, with its ``when`` edge's decision in it (``when``: see `FORMAT`)
NODE_VISITED = "node.visited"
NODE_FAILED = "node.failed"
NODE_RETRYING = "node.retrying"
EDGE_TAKEN = "edge.taken"
EDGE_SKIPPED = "edge.skipped"
EFFECT_RECORDED = "effect.recorded"
APPROVAL_REQUESTED = "approval.requested"
APPROVAL_DECIDED = "approval.decided"
SNAPSHOT_TAKEN = "snapshot.taken"  # binds a snapshot to the chain: its seq and digest
# a run continued by code that differs from what it started with (the nodes
# still to run whose modules changed), and a run moved onto another definition
RUN_CODE_CHANGED = "run.code_changed"
RUN_MIGRATED = "run.migrated"
# the namespaces of the records interlock writes itself (the engine's, and a server's
# ``notify.sent``): a node's `ctx.log` may not use them, and a reader trusts a record of
# them only where the engine would have written it (`_verify.forged`)
ENGINE_NAMESPACES = frozenset({"run", "node", "edge", "effect", "approval", "state", "child",
                               "snapshot", "notify"})

# The log's format, recorded in ``run.started`` (``format``; none: 1). Format 2 writes
# fewer records per node, all implied by the pinned definition: ``node.visited`` for a
# visit that started and completed in one batch, no ``edge.taken`` for the edges of a
# node whose every edge is plain and unconditional (`_definition._plan.Plan.always_taken`),
# no record for an ``otherwise`` edge whose node has exactly one other edge, a ``when``
# (`Plan.implied_otherwise`): the fold derives them. Format 3 also folds that ``when``
# edge's decision into the ``node.visited`` of its node, as its ``when`` field (the edge
# record's fields but ``from``; ``to`` only when taken) when it was a plain taken or
# skipped made in the same batch -- no ``edge.taken``/``edge.skipped`` record of its own
# (`_engine._staging.Staging.visited`). A run keeps the format it started with, whatever
# the version that continues it. docs/design.md, "The log".
FORMAT = 3
READS = 3  # the newest format this version reads (a newer one's log is refused, not misread)


def format_field() -> dict[str, int]:
    """What a new run's ``run.started`` says of its log's format: ``format`` from format 2
    on (`FORMAT`); nothing for format 1 (a log without it is format 1)."""
    return {"format": FORMAT} if FORMAT > 1 else {}


# the one record that may follow a run's final record: a server's note that it told a
# chat (posted, updated or answered) -- the update after the click that ended the run
# comes after the end, and so do a failed delivery's retries; it changes nothing in the
# run, and `verify` refuses any other record there
NOTIFY_SENT = "notify.sent"
AFTER_END = frozenset({NOTIFY_SENT})

TERMINAL_TYPES = {
    RUN_COMPLETED: "COMPLETED",
    RUN_FAILED: "FAILED",
    RUN_REJECTED: "REJECTED",
    RUN_CANCELLED: "CANCELLED",
}

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
_dumps = orjson.dumps
_now = time.time
_sha256 = hashlib.sha256().copy  # copying an empty hasher is cheaper than making one
_join = b"".join


def json_default(obj: Any) -> Any:
    """orjson's hook for what it does not serialise itself (pydantic models, sets)."""
    dump = getattr(obj, "model_dump", None)  # pydantic models
    if callable(dump):
        return dump(mode="json")
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def definition_digest(definition: Any) -> str:
    """The hash a run records of a workflow definition (its canonical JSON's SHA-256)."""
    return hashlib.sha256(dumps(definition)).hexdigest()


def dumps(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys)."""
    return orjson.dumps(value, default=json_default, option=_OPTS)


def to_json_value(value: Any) -> Any:
    """``value`` as plain JSON data: what a reader of the log -- and a resume -- gets back.

    A dict of plain scalars is returned as it is; anything else goes through JSON and
    back, so that the state a live run holds is the state its log rebuilds: a
    datetime, an enum, a UUID or a dataclass (which orjson writes natively) becomes
    what JSON holds of it, a tuple a list, NaN and infinities ``None`` (orjson writes
    them as ``null``).
    """
    if type(value) is dict and _plain_scalars(value):
        return value  # the common update: a few scalar fields, nothing to convert
    return orjson.loads(orjson.dumps(value, default=json_default, option=_OPTS))


JSON_SCALARS = frozenset({str, float, bool, type(None)})  # kept as they are, with ints


def plain_scalar(value: Any) -> bool:
    """Whether JSON holds ``value`` as it is: str, bool, None, a finite float, a 64-bit
    int (one that comes back from the log unchanged)."""
    t = type(value)
    if t is int:
        return bool(-(2**63) <= value < 2**64)
    if t is float:
        return math.isfinite(value)
    return t in JSON_SCALARS


def _plain_scalars(value: dict[Any, Any]) -> bool:
    """Only str keys and values `plain_scalar` accepts."""
    return all(type(k) is str and plain_scalar(v) for k, v in value.items())


@dataclass(frozen=True, slots=True)
class ChainKey:
    """The secret of a keyed chain, and the id that names it in a log."""

    secret: bytes
    id: str

    def __repr__(self) -> str:  # never print the secret
        return f"ChainKey(id={self.id!r})"


def chain_key(secret: str | bytes) -> ChainKey:
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    return ChainKey(raw, hashlib.sha256(b"interlock-log-key-id:" + raw).hexdigest()[:16])


def env_key() -> ChainKey | None:
    """The key in ``$INTERLOCK_LOG_KEY``, if it is set (and not empty)."""
    raw = os.environ.get(LOG_KEY_ENV, "")
    return chain_key(raw) if raw else None


def _hasher_factory(key: ChainKey | None) -> Any:
    return _sha256 if key is None else hmac.new(key.secret, digestmod=hashlib.sha256).copy


def chain(prev_hash: str, data: bytes, key: ChainKey | None = None) -> str:
    hasher = _hasher_factory(key)()
    hasher.update(prev_hash.encode("ascii"))
    hasher.update(data)
    return str(hasher.hexdigest())


class Entry(NamedTuple):
    """A record as stored: its canonical bytes and its chain hash.

    (A named tuple: one is made per record, on the hot path.)
    """

    seq: int
    type: str
    data: bytes
    hash: str
    node: str | None = None  # the record's "node" field (a store indexes it), if any

    def record(self) -> Record:
        rec: Record = orjson.loads(self.data)
        return rec


# ``Entry(...)`` goes through a generated Python ``__new__``; one is made per record
_new_entry = functools.partial(tuple.__new__, Entry)


class LogWriter:
    """Numbers, timestamps, serialises and chains the records of one run."""

    def __init__(self, last_seq: int = 0, last_hash: str = GENESIS,
                 key: ChainKey | None = None) -> None:
        self.seq = last_seq
        self.hash = last_hash
        self.key = key
        self._prev = last_hash.encode("ascii")  # what the next record's hash starts with
        self._hasher = _hasher_factory(key)

    def make(self, rtype: str, fields: dict[str, Any]) -> tuple[Record, Entry]:
        """The next record: ``fields`` numbered, timestamped, serialised and chained.

        Fields whose value is None are left out (`seal` for fields known to have none).
        """
        return self.seal(rtype, {k: v for k, v in fields.items() if v is not None})

    def seal(self, rtype: str, fields: dict[str, Any], at: float | None = None
             ) -> tuple[Record, Entry]:
        """`make` for ``fields`` without None values (the executor's own records).

        ``fields`` is handed over: it becomes the record (no copy on the hot path).
        ``at``: the record's time when not now (a record made late: a deferred
        ``node.started``, sealed when its visit first waits, at the time it started).
        """
        self.seq = seq = self.seq + 1
        rec: Record = fields
        rec["seq"] = seq
        rec["type"] = rtype
        rec["at"] = _now() if at is None else at
        # orjson's result keeps a 4 KiB buffer however short the JSON; a log keeps many
        # records, so keep an exact-size copy (joining with b"" is the cheapest copy)
        data = _join((_dumps(rec, json_default, _OPTS), b""))  # positional: ~0.3 us less
        hasher = self._hasher()
        hasher.update(self._prev)
        hasher.update(data)
        self.hash = h = hasher.hexdigest()
        self._prev = h.encode("ascii")
        node = fields.get("node")
        return rec, _new_entry((seq, rtype, data, h, node if type(node) is str else None))

    def rewind(self, seq: int, hash: str) -> None:
        """Back to record ``seq`` of hash ``hash`` (the last sealed before a record that
        is not kept: one the fold refused)."""
        self.seq = seq
        self.hash = hash
        self._prev = hash.encode("ascii")


@dataclass(frozen=True, slots=True)
class ChainProblem:
    seq: int
    message: str


def verify_chain(entries: list[Entry], *, start: int = 0, prev_hash: str = GENESIS,
                 key: ChainKey | None = None, hashes: bool = True) -> ChainProblem | None:
    """The first record whose number, content or hash does not fit the chain, if any.

    ``start``/``prev_hash``: the entries continue the chain after record ``start``;
    ``key``: the chain is keyed with it; ``hashes=False``: check all but the hashes (a
    keyed log read without its key).
    """
    prev = prev_hash
    for expected, entry in enumerate(entries, start=start + 1):
        if entry.seq != expected:
            return ChainProblem(entry.seq, f"expected record {expected}, found {entry.seq} "
                                           "(a record is missing or out of order)")
        try:
            rec = orjson.loads(entry.data)
        except orjson.JSONDecodeError:
            return ChainProblem(entry.seq, "record is not valid JSON")
        node = rec.get("node")
        if rec.get("seq") != entry.seq or rec.get("type") != entry.type \
                or (node if type(node) is str else None) != entry.node:
            return ChainProblem(entry.seq, "record's seq/type/node do not match its row")
        if hashes and chain(prev, entry.data, key) != entry.hash:
            what = ("its HMAC does not match the record's content, the previous hash and "
                    "the key (the record was changed, or written without this key)"
                    if key is not None else
                    "hash does not match the record's content and the previous hash (the "
                    "record was changed)")
            return ChainProblem(entry.seq, what)
        prev = entry.hash
    return None
