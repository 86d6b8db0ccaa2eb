"""Typed builders of the records the engine writes, and the sink it writes them to.

Each builder returns an `Item` -- ``(type, fields)`` -- with only the fields that have
a value (the shape a record has; the log writer would drop a None anyway), so an item
can be sealed as it is (`Sink.add`). The field names live here and only here:
``grep -n "def node_" interlock/_engine/_records.py`` lists every ``node.*`` record the
executor writes. (`_log` holds the type names, the canonical bytes and the chain.)

The hot path: the three records every step of a chain or a loop writes are built where
they are staged (`Sink.put`), from the literal their builder here returns, rather than
by calling it (a Python call and a tuple per record are ~1% of a trivial node):
``node.started`` of a visit run inline (`_runner.Runner._start_ready`),
``node.completed`` of an inline visit without a goto or tokens (`_runner.Runner._loop`),
``edge.taken`` of a `Plan.always_taken` node (`_decide.Decider.due`). Each site says
which builder it inlines (``grep -n "inlined" interlock/_engine/_runner.py
interlock/_engine/_decide.py``),
and tests/engine/test_fast_paths.py checks that the records it writes are the ones the general
path writes with the builders (with `Runner.inline` and `Decider.fast` off), fields in
order: a field added to a builder fails it until the inlined literal has it too.

A `Sink` is what the scheduler, the edge decisions and the node call write records
to: the journal (`_journal.Journal`) numbers, chains and folds them on `add`, and
stores them on `flush`. Nothing but the journal touches the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import _log as L
from .._json import JSON, JSONObject

# a record before it is sealed: its type and fields (JSON values; typed as loosely as
# `_log.Record`, since the operations on stored runs build records of their own too)
Item = tuple[str, dict[str, Any]]


class Sink(Protocol):
    """Where records go: staged (numbered, chained, folded) now, stored on `flush`."""

    def add(self, item: Item) -> L.Record:
        """Stage one record whose fields have no None values (`Item`s built here)."""

    def put(self, rtype: str, fields: JSONObject) -> L.Record:
        """`add` for an item given as its two halves (the hot path's: no tuple made)."""

    def stage(self, items: list[Item]) -> list[L.Record]:
        """Stage records (None fields dropped)."""

    async def flush(self) -> None:
        """Store everything staged, in one transaction."""

    async def commit(self, items: list[Item]) -> list[L.Record]:
        """`stage` and `flush`."""

    def defer(self, node: str, visit: int) -> None:
        """Start attempt 1 of a visit: ``node.started``; for an inline visit in log format
        2, folded now and sealed only if something comes before its completion (`_staging`)."""

    def started(self) -> None:
        """Seal a deferred ``node.started`` now (the visit's body waits)."""

    def visited(self, fields: JSONObject,
                decide: Callable[[str], Item | None] | None = None) -> L.Record:
        """Stage a visit's completion: ``node.visited`` if its start is still deferred,
        else ``node.completed``; in log format 3, with its ``when`` edge's decision
        (``decide``) in it, for a node whose other edges that decision implies."""


def node_started(node: str, visit: int, attempt: int, item: int | None = None) -> Item:
    """A visit's attempt starting (``item``: one item's of a mapped node's visit)."""
    fields: JSONObject = {"node": node, "visit": visit, "attempt": attempt}
    if item is not None:
        fields["item"] = item
    return L.NODE_STARTED, fields


def node_completed(node: str, visit: int, attempt: int, duration_ms: float,
                   update: JSONObject | None, goto: str | None, tokens: int,
                   item: int | None = None) -> Item:
    fields: JSONObject = {"node": node, "visit": visit, "attempt": attempt,
                              "duration_ms": duration_ms}
    if item is not None:
        fields["item"] = item
    if update:
        fields["update"] = update
    if goto is not None:
        fields["goto"] = goto
    if tokens:
        fields["tokens"] = tokens
    return L.NODE_COMPLETED, fields


def map_completed(node: str, visit: int, items: int, duration_ms: float) -> Item:
    """``node.completed`` of a mapped node's visit: every one of its ``items`` completed
    (the fold merges their updates, in item order, or collects them)."""
    return L.NODE_COMPLETED, {"node": node, "visit": visit, "items": items,
                              "duration_ms": duration_ms}


def gate_completed(node: str, visit: int, update: JSONObject, reenter: str | None) -> Item:
    """``node.completed`` of an approval gate a human decided (no attempt ran)."""
    fields: JSONObject = {"node": node, "visit": visit, "update": update}
    if reenter is not None:
        fields["reenter"] = reenter
    return L.NODE_COMPLETED, fields


def node_failed(node: str, visit: int, attempt: int | None, error: JSONObject,
                duration_ms: float | None = None, tokens: int = 0,
                item: int | None = None, caught: JSONObject | None = None) -> Item:
    """A visit's failure. ``caught``: an error edge caught it (``{edge, error}``, the
    error as its target sees it in the ``error`` field): the run goes on along it.
    ``item``: one item's of a mapped node's visit."""
    fields: JSONObject = {"node": node, "visit": visit}
    if item is not None:
        fields["item"] = item
    if attempt is not None:
        fields["attempt"] = attempt
    fields["error"] = error
    if duration_ms is not None:
        fields["duration_ms"] = duration_ms
    if tokens:
        fields["tokens"] = tokens
    if caught is not None:
        fields["caught"] = caught
    return L.NODE_FAILED, fields


def node_cancelled(node: str, visit: int, attempt: int | None, tokens: int,
                   item: int | None = None) -> Item:
    """``node.failed`` of type ``cancelled``: a visit the run stopped (it runs again on
    resume), with the tokens it had spent."""
    return node_failed(node, visit, attempt, {
        "type": "cancelled", "node": node,
        "message": f"node {node!r} was cancelled: the run stopped"}, tokens=tokens, item=item)


def node_retrying(node: str, visit: int, attempt: int, error: JSONObject,
                  duration_ms: float, tokens: int, delay_s: float,
                  item: int | None = None) -> Item:
    fields: JSONObject = {"node": node, "visit": visit, "attempt": attempt}
    if item is not None:
        fields["item"] = item
    fields.update(error=error, duration_ms=duration_ms)
    if tokens:
        fields["tokens"] = tokens
    fields["delay_ms"] = round(delay_s * 1000, 3)
    return L.NODE_RETRYING, fields


def effect_recorded(node: str, visit: int, attempt: int, key: str, result: JSON,
                    tokens: int, item: int | None = None, steps: int = 0) -> Item:
    """``ctx.once``'s result, with the tokens spent on it (and before it, unrecorded) --
    and the steps, when it accounts for a child run's (a sub-workflow node's)."""
    fields: JSONObject = {"node": node, "visit": visit, "attempt": attempt, "key": key}
    if item is not None:
        fields["item"] = item
    if result is not None:
        fields["result"] = result
    if tokens:
        fields["tokens"] = tokens
    if steps:
        fields["steps"] = steps
    return L.EFFECT_RECORDED, fields


def decision_key(key: str) -> str:
    """The journal key of a human's decision on a node's confirmation ``key``
    (`Context.decision` reads it): a decision is journaled for the node that asked."""
    return f"decision:{key}"


def decision_journaled(node: str, visit: int, attempt: int, key: str,
                       decision: JSONObject) -> Item:
    """A decision on confirmation ``key`` as the effect the node reads when it runs again
    (its comment, its patch): the visit's journal holds what the human said."""
    return effect_recorded(node, visit, attempt, decision_key(key), decision, 0)


def edge_taken(edge: int, source: str, targets: list[str]) -> Item:
    """An unconditional edge taken (what `Plan.always_taken` nodes' edges record)."""
    return L.EDGE_TAKEN, {"edge": edge, "from": source, "to": [*targets]}


def edge_decided(edge: int, source: str, targets: list[str], expr: str | None = None,
                 value: JSON = None, reads: JSONObject | None = None,
                 reason: str | None = None, arrived: tuple[str, ...] = ()) -> Item:
    """``edge.taken`` (some targets) or ``edge.skipped`` (none); ``value`` is recorded as
    given (the caller converts it to JSON data)."""
    fields: JSONObject = {"edge": edge, "from": source}
    if targets:
        fields["to"] = [*targets]
    if expr is not None:
        fields["expr"] = expr
    if value is not None:
        fields["value"] = value
    if reads is not None:
        fields["reads"] = reads
    if reason is not None:
        fields["reason"] = reason
    if arrived:
        fields["arrived"] = list(arrived)
    return (L.EDGE_TAKEN if targets else L.EDGE_SKIPPED), fields


def run_completed() -> Item:
    return L.RUN_COMPLETED, {}


def run_waiting(waiting: JSONObject, node: str) -> Item:
    return L.RUN_WAITING, {"waiting": waiting, "node": node}


def run_failed(error: JSONObject, node: str | None) -> Item:
    fields: JSONObject = {"error": error}
    if node is not None:
        fields["node"] = node
    return L.RUN_FAILED, fields


def run_rejected(node: str, message: str) -> Item:
    return L.RUN_REJECTED, {"node": node, "error": {"type": "rejected", "message": message,
                                                    "node": node}}


def run_cancelled(by: str | None) -> Item:
    fields: JSONObject = {}
    if by is not None:
        fields["by"] = by
    fields["error"] = {"type": "cancelled", "node": None,
                       "message": f"the run was cancelled by {by or 'an anonymous request'}"}
    return L.RUN_CANCELLED, fields


__all__ = ["Item", "Sink", "decision_journaled", "decision_key", "edge_decided", "edge_taken",
           "effect_recorded", "gate_completed", "map_completed", "node_cancelled",
           "node_completed", "node_failed", "node_retrying", "node_started",
           "run_cancelled", "run_completed", "run_failed", "run_rejected", "run_waiting"]
