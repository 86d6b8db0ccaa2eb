"""Staging: a run's records sealed, folded into its view and staged, for the journal to
store (`_journal.Journal` is a `Staging` that also stores them: a `_records.Sink`).

`put` seals a record with the run's `LogWriter` (numbered, timestamped, chained) and
folds it into the `RunView` at once; a record the fold refuses leaves the writer where
it was (no gap in the numbering) and is not staged.

Log format 2 (`_log.FORMAT`): one ``node.visited`` for a visit that starts and completes
with nothing recorded in between. The scheduler starts an inline visit with `defer`: its
``node.started`` is folded at once, with the seq it will have, but sealed only when
something else comes first -- any other record, a flush (the run's watcher flushes what
is staged every quarter of a second), or the body's first wait (`_guards.in_loop` calls
`started`). When nothing does, `visited` seals start and completion as one record, at
that seq. What a crash means is unchanged: a deferred start was never flushed before
the next record in format 1 either (``node.started`` rides with the next flush), and a
visit that waits on anything has its ``node.started`` sealed -- and shown live -- when
it first waits, as before.

Log format 3: a ``node.visited`` of a `Plan.implied_when` node (one ``when`` edge and
its ``otherwise`` edges) also carries that edge's decision, as its ``when``, instead of
an ``edge.taken``/``edge.skipped`` of its own (`_carry`): the completion is folded
first, the decider decides the edge on the state with the visit's update in it, the
decision is folded, and then the one record is sealed. A decision that is not a plain
taken or skipped -- the condition raises -- leaves the visit as format 2 writes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import _log as L
from ._expand import Expander
from ._fold import RunView, end_visit, start_visit, when_decided
from ._records import Item

_now = time.time


class Staging:
    """Seals, folds and stages one run's records (see the module's docstring)."""

    def __init__(self, view: RunView, writer: L.LogWriter,
                 listener: Callable[[L.Record, RunView], object] | None) -> None:
        self.view = view
        self.writer = writer
        self.listener = listener
        self._staged: list[L.Entry] = []
        # the ``node.started`` of an inline visit, folded but not sealed yet (`defer`)
        self._deferred: dict[str, Any] | None = None
        self._implied: Expander | None = None  # (what `_tell` tells, format 2 on)

    def _tell(self, rec: L.Record) -> None:
        """Hand a sealed record to the listener -- and, from log format 2 on, the records
        it implies (`_expand`: the edges no record is written for, ``implied: true``),
        so that a listener (progress lines, spans, metrics) sees what format 1 showed."""
        assert self.listener is not None
        self.listener(rec, self.view)
        if self.view.format > 1:
            implied = self._implied
            if implied is None:
                implied = self._implied = Expander(self.view.plan)
            # (a migration changes the plan)
            implied.plan, implied.format = self.view.plan, self.view.format
            for more in implied(rec)[1:]:
                self.listener(more, self.view)

    def stage(self, items: list[Item]) -> list[L.Record]:
        """Number and chain records and fold them into the view; `flush` stores them.

        Nothing that depends on a staged record may start before the flush returns:
        the loop only starts nodes after flushing.
        """
        put = self.put
        return [put(rtype, {k: v for k, v in fields.items() if v is not None})
                for rtype, fields in items]

    def add(self, item: Item) -> L.Record:
        """`stage` for one record whose fields have no None values (the fields become
        the record)."""
        return self.put(item[0], item[1])

    def put(self, rtype: str, fields: dict[str, Any]) -> L.Record:
        """`add` for an item given as its two halves (the hot path's: no tuple made).

        Staged only once folded: a record the fold refuses is not numbered either."""
        if self._deferred is not None:
            self.started()
        writer = self.writer
        seq, prev = writer.seq, writer.hash
        rec, entry = writer.seal(rtype, fields)
        try:
            self.view.apply(rec)
        except BaseException:
            writer.rewind(seq, prev)
            raise
        self._staged.append(entry)
        if self.listener is not None:
            self._tell(rec)
        return rec

    # -- log format 2: one ``node.visited`` for a visit that started and completed in one
    # batch (`_log.FORMAT`) --------------------------------------------------------------

    def defer(self, node: str, visit: int) -> None:
        """Start attempt 1 of a visit (``node.started``); of an inline one (`Plan.in_loop`)
        in a format-2 run, deferred: its ``node.started`` is folded now, with the seq it
        will have, and sealed only if anything else is recorded (or flushed) before the
        visit completes -- its body first waits, say (`started`). If nothing
        is, `visited` seals the start and the completion as one ``node.visited`` at that
        seq. Either way the log says what it said with ``node.started`` staged here: it
        was never flushed before the next record either."""
        view = self.view
        if view.format < 2 or node not in view.plan.in_loop:
            self.put(L.NODE_STARTED, {"node": node, "visit": visit, "attempt": 1})
            return
        rec = {"node": node, "visit": visit, "attempt": 1, "seq": self.writer.seq + 1,
               "type": L.NODE_STARTED, "at": _now()}
        start_visit(view, rec)  # (a start the fold refuses is not deferred)
        self._deferred = rec

    def started(self) -> None:
        """Seal the deferred ``node.started`` (`defer`), at the time the visit started:
        before any other record, a flush, or the visit's first wait (`_guards.in_loop`)."""
        rec = self._deferred
        if rec is None:
            return
        self._deferred = None
        fields = {"node": rec["node"], "visit": rec["visit"], "attempt": 1}
        sealed, entry = self.writer.seal(L.NODE_STARTED, fields, rec["at"])
        self._staged.append(entry)
        if self.listener is not None:
            self._tell(sealed)

    def visited(self, fields: dict[str, Any],
                decide: Callable[[str], Item | None] | None = None) -> L.Record:
        """Stage a visit's completion (``node.completed``'s fields): as ``node.visited``
        when its start is still deferred (`defer`), else as ``node.completed``.
        ``decide``: how the node's ``when`` edge is decided once the completion is folded
        (`_decide.Decider.when`), for a format-3 ``node.visited`` to carry (`_carry`)."""
        d = self._deferred
        if d is None or d["node"] != fields["node"] or d["visit"] != fields["visit"]:
            return self.put(L.NODE_COMPLETED, fields)
        self._deferred = None
        view = self.view
        if decide is not None and fields["node"] in view.plan.implied_when \
                and view.format > 2:
            return self._carry(d, fields, decide)
        writer = self.writer
        seq, prev = writer.seq, writer.hash
        rec, entry = writer.seal(L.NODE_VISITED, fields)
        try:
            end_visit(view, rec)
        except BaseException:
            writer.rewind(seq, prev)
            self._deferred = d
            raise
        self._staged.append(entry)  # (`_stage`, inlined: a chain's hot path)
        if self.listener is not None:
            self._tell(rec)
        return rec

    # -- log format 3: a ``node.visited`` carries its node's ``when`` edge's decision ----

    def _carry(self, deferred: dict[str, Any], fields: dict[str, Any],
               decide: Callable[[str], Item | None]) -> L.Record:
        """`visited` in a format-3 run, of a `Plan.implied_when` node: the completion is
        folded first, with the seq and time its record will have (the condition reads the
        state with the visit's update in it), then its ``when`` edge decided (``decide``,
        the decider's own code) and folded as its record would be -- and only then one
        ``node.visited`` sealed, with that decision as its ``when`` (the edge record's
        fields but ``from``, `_log.FORMAT`). A decision that is not a plain taken or
        skipped (``decide`` gives None, or raises: a condition that cannot be evaluated),
        or that the fold refuses, leaves the ``node.visited`` as format 2 seals it, and
        the decision to be recorded (or the run to fail) after it, as in format 2."""
        view, writer = self.view, self.writer
        at = fields["at"] = _now()
        fields["seq"], fields["type"] = writer.seq + 1, L.NODE_VISITED
        try:
            end_visit(view, fields)
        except BaseException:
            self._deferred = deferred  # (nothing sealed)
            raise
        try:
            item = decide(fields["node"])
            if item is not None:
                rtype, edge = item
                edge["type"] = rtype
                when_decided(view, edge)
        except BaseException:
            self._stage(*writer.seal(L.NODE_VISITED, fields, at))  # folded: as format 2
            raise
        if item is not None:
            del edge["type"], edge["from"]
            fields["when"] = edge
        return self._stage(*writer.seal(L.NODE_VISITED, fields, at))

    def _stage(self, rec: L.Record, entry: L.Entry) -> L.Record:
        """A sealed and folded record staged, and told to the listener."""
        self._staged.append(entry)
        if self.listener is not None:
            self._tell(rec)
        return rec

    def _seal(self, rtype: str, fields: dict[str, Any]) -> L.Entry:
        """A record sealed and folded now, outside the staged batch (the caller stores it):
        `put`, its entry taken back out (a flush's, whose batch was taken: it is the only
        one staged; `put` stays the hot path, one call)."""
        self.put(rtype, fields)
        return self._staged.pop()
