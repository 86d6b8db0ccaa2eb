"""A log as format 1 writes it: the records formats 2 and 3 imply, written out for readers.

Log format 2 (`_log.FORMAT`, docs/design.md "The log") writes fewer records per node:
``node.visited`` for a visit that started and completed in one batch, and no record for
an edge whose decision the pinned definition implies (the edges of a
`Plan.always_taken` node; the ``otherwise`` edges of a `Plan.implied_otherwise` node).
Format 3 also writes the ``when`` edge's decision of such a node into its
``node.visited`` (its ``when`` field) rather than as a record of its own.
The fold derives them (`_fold`); a reader that shows records one by one -- ``trace``,
``visits``, coverage, the dashboard, OpenTelemetry spans, metrics, progress lines --
reads them through `Expander`, which gives back, for each stored record, the records
format 1 would have written in its place, in that order:

- ``node.visited``: kept as it is -- a reader takes it for a start and a completion --
  or, with ``split``, its ``node.started`` (``at`` the completion's less its duration)
  and its ``node.completed``; one with a ``when`` (format 3): without it, then the
  ``edge.taken``/``edge.skipped`` it stands for (``from`` the node), then what that
  implies (below) -- the format-2 log's records, and what they imply;
- a completion of an always-taken node (no goto): it, then an ``edge.taken`` per edge;
- a ``when`` edge's record of an implied-otherwise node: it, then each ``otherwise``
  edge's ``edge.taken`` (the ``when`` was not taken) or ``edge.skipped``.

Each record made here has the seq of the stored record that implies it and
``implied: true``: it is not in the log, and nothing hashes it (the records without
``implied`` are the stored ones). A format-1 log comes back as it is.
tests/engine/test_format.py runs workflows in both formats and compares.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _log as L
from .._definition._plan import Plan
from .._errors import InterlockError
from .._json import JSONObject


class Expander:
    """Expands one run's records in log order (see the module's docstring). ``plan``: the
    run's definition's; ``plans``: how a ``run.migrated``'s definition becomes the plan
    of the records after it (without: the caller sets ``plan`` at a ``run.migrated``);
    ``format``: the log's, when its reader starts after ``run.started``."""

    def __init__(self, plan: Plan, plans: Callable[[JSONObject], Plan] | None = None,
                 format: int = 1, *, split: bool = False) -> None:
        self.plan = plan
        self.plans = plans
        self.format = format
        self.split = split

    def __call__(self, rec: L.Record) -> list[L.Record]:
        rtype = rec.get("type")
        if rtype == L.RUN_STARTED:
            fmt = rec.get("format", 1)
            self.format = fmt if isinstance(fmt, int) else 1
            return [rec]
        if rtype == L.RUN_MIGRATED and self.plans is not None:  # the records after it:
            try:                                                 # the new definition's
                self.plan = self.plans(rec["definition"])
            except (InterlockError, ValueError, KeyError, TypeError):
                self.format = 1  # (a definition that does not load: read as stored)
            return [rec]
        if self.format < 2:
            return [rec]
        if rtype == L.NODE_VISITED:
            if type(rec.get("when")) is dict:  # (format 3: its ``when`` edge's decision)
                return self._carried(rec)
            return [*(_split(rec) if self.split else [rec]), *self._edges_of(rec)]
        if rtype == L.NODE_COMPLETED and "item" not in rec:
            return [rec, *self._edges_of(rec)]
        if rtype in (L.EDGE_TAKEN, L.EDGE_SKIPPED):
            return [rec, *self._otherwise(rec)]
        return [rec]

    def expand(self, records: list[L.Record]) -> list[L.Record]:
        """Every record of ``records`` (in log order), expanded."""
        return [r for rec in records for r in self(rec)]

    def _edges_of(self, rec: L.Record) -> list[L.Record]:
        node = rec.get("node")
        if node not in self.plan.always_taken or "goto" in rec or "reenter" in rec:
            return []
        return [_implied(rec, L.EDGE_TAKEN, {"edge": e.index, "from": node,
                                             "to": list(e.targets)})
                for e in self.plan.nodes[str(node)].out]

    def _carried(self, rec: L.Record) -> list[L.Record]:
        """A format-3 ``node.visited`` with a ``when``: the visit as format 2 stores it
        (no ``when``), the edge record that ``when`` stands for, what that implies."""
        visited = {k: v for k, v in rec.items() if k != "when"}
        when = rec["when"]
        fields: L.Record = {"edge": when.get("edge"), "from": rec.get("node")}
        fields.update(when)  # (in the order the edge record's fields would have)
        edge = _implied(rec, L.EDGE_TAKEN if when.get("to") else L.EDGE_SKIPPED, fields)
        return [*(_split(visited) if self.split else [visited]), edge,
                *self._otherwise(edge, carried=True)]

    def _otherwise(self, rec: L.Record, carried: bool = False) -> list[L.Record]:
        source = rec.get("from", "*")
        others = self.plan.implied_otherwise.get(rec.get("edge"))  # type: ignore[arg-type]
        if not others or source == "*" or (rec.get("implied") and not carried):
            return []
        taken = rec["type"] == L.EDGE_SKIPPED  # the ``when`` was not taken
        out = []
        for e in others:
            fields: L.Record = {"edge": e.index, "from": source}
            if taken:
                fields["to"] = list(e.targets)
            fields.update(expr="otherwise", value=taken)
            out.append(_implied(rec, L.EDGE_TAKEN if taken else L.EDGE_SKIPPED, fields))
        return out


def _split(rec: L.Record) -> list[L.Record]:
    """A ``node.visited`` as its ``node.started`` and ``node.completed``."""
    common: L.Record = {k: rec[k] for k in ("node", "visit", "attempt") if k in rec}
    at = rec.get("at", 0.0)
    started = _implied(rec, L.NODE_STARTED, dict(common))
    started["at"] = round(at - (rec.get("duration_ms") or 0.0) / 1000, 6)
    completed = {k: v for k, v in rec.items() if k not in ("seq", "type", "at")}
    return [started, _implied(rec, L.NODE_COMPLETED, completed)]


def _implied(rec: L.Record, rtype: str, fields: L.Record) -> L.Record:
    """A record ``rec`` implies: its seq and time, ``implied: true``."""
    fields.update(seq=rec.get("seq"), type=rtype, at=rec.get("at"), implied=True)
    return fields


__all__ = ["Expander"]
