"""A visit's outcome into records (the scheduler's, `_runner.Runner`): a completion with
its edges decided in the same batch, a pause for a human (``approval.requested``), a
failure an error edge catches, or one that ends the run (`_decide.Abort`)."""

from __future__ import annotations

from .. import _log as L
from .._errors import RunError
from .._json import JSONObject
from . import _records as R
from ._approvals import approvers
from ._call import NodeCall
from ._decide import Abort, Decider, caught_error
from ._guards import Outcome
from ._mapped import ItemsWaiting, items_to_go_on


async def finish(calls: NodeCall, decide: Decider, out: Outcome, *,
                 alone: bool = False) -> bool:
    """Stage a visit's outcome and decide its edges; the caller flushes them (one
    transaction, before any successor starts). A failure is committed at once and
    ends the run. ``alone``: nothing else ran while it did (so only a node that could
    have, by the graph, can conflict with its writes). True for a mapped visit whose
    items wait and one of which a decision folded in meanwhile lets go on: the caller
    starts the visit's task again."""
    if isinstance(out.pause, ItemsWaiting):  # a mapped visit's items wait for people
        return items_to_go_on(decide.view, out.node, out.visit)
    if out.pause is not None:
        # the visit stays running; it is re-run once a human has decided (``path``: a
        # gate of a child run, which the decision is forwarded to -- `_runs.resume`)
        pause = out.pause
        fields = {
            "node": out.node, "visit": out.visit, "attempt": out.attempt,
            "kind": "workflow" if pause.path is not None else (pause.kind or "tool"),
            "key": pause.key, "show": L.to_json_value(pause.show), "path": pause.path,
            "decisions": pause.decisions, "tokens": out.tokens or None,
            "child_kind": pause.kind if pause.path is not None else None,
            "pending": pause.pending,  # a child's gates, each by its path (`_gates.entries`)
            "approvers": approvers(decide.plan.nodes[out.node].spec)}
        if pause.edit is not None:  # what a modify patch must satisfy
            fields["input"] = pause.edit
        await decide.sink.commit([(L.APPROVAL_REQUESTED, fields)])
        return False
    if out.error is not None and decide.plan.nodes[out.node].errors:
        if _caught(decide, out):  # an error edge takes the run on
            return False
        out = out._replace(error=_uncaught(decide, out))
    if out.error is not None:
        await decide.sink.commit([R.node_failed(out.node, out.visit, out.attempt,
                                              out.error.to_json(), out.duration_ms,
                                              out.tokens)])
        raise Abort(out.error)
    conflict = calls.write_conflict(out, overlap=not alone)
    if conflict is not None:
        await decide.sink.commit([R.node_failed(out.node, out.visit, out.attempt,
                                              conflict.to_json(), out.duration_ms)])
        raise Abort(conflict)
    complete(decide, out)
    return False

def _caught(decide: Decider, out: Outcome) -> bool:
    """A visit that failed with an error one of its node's error edges catches:
    stage its ``node.failed`` (with what was caught and by which edge) and the
    edge's decision -- one batch, flushed by the caller like a completion."""
    assert out.error is not None
    pn = decide.plan.nodes[out.node]
    edge = decide.catch(pn, out.error)
    if edge is None:
        return False
    caught: JSONObject = {"edge": edge.index,
                          "error": caught_error(pn, out.error, out.attempt)}
    decide.sink.add(R.node_failed(out.node, out.visit, out.attempt, out.error.to_json(),
                                out.duration_ms, out.tokens, caught=caught))
    decide.due()
    return True

def _uncaught(decide: Decider, out: Outcome) -> RunError:
    """The node's error, saying why its error edges did not catch it."""
    assert out.error is not None
    err = out.error
    why = decide.uncaught(decide.plan.nodes[out.node], err)
    return type(err)(f"{err.message} ({why})", node=err.node, **err.details)

def complete(decide: Decider, out: Outcome) -> None:
    """`finish` for a visit that completed (no error, no pause, no write conflict)."""
    mapped = decide.plan.nodes[out.node].mapped
    if mapped is not None:  # every item completed: the fold merges their updates
        items = len(decide.view.maps[(out.node, out.visit)].items)
        decide.sink.add(R.map_completed(out.node, out.visit, items, out.duration_ms))
    else:
        # (node.visited when its start is still deferred: an inline visit, log format 2)
        decide.sink.visited(R.node_completed(out.node, out.visit, out.attempt,
                                             out.duration_ms, out.update, out.goto,
                                             out.tokens)[1], decide.when)
    # decide this node's edges in the same batch: its completion and where the run
    # goes next are committed together
    decide.due()


__all__ = ["complete", "finish"]
