"""The agent nodes a resume of a stored run may reach whose API key variable is unset in
this process: a foreground ``interlock resume`` refuses such a resume before anything is
recorded, as ``interlock run`` refuses such a run -- it would fail at that node, after
the nodes before it ran. (``--detach`` records the resume for a worker or server
instead, whose environment may have the key.)

Only agents the run may still reach are counted: a gate decided after the agent already
ran is not refused. "May reach" is what code drift counts (`_code.nodes_to_run`): the
graph from where the run stopped (its nodes ready, interrupted, failed or waiting at a
gate; the targets of edges still to be decided), every edge followed whatever its
condition. A run that has not started, and a ``--modify`` (it re-enters at an earlier
node), count every agent, as ``run`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._definition._model import WorkflowSpec
    from .._definition._plan import Plan
    from .._errors import Diagnostic
    from .._store import Store


def _key_warnings(spec: WorkflowSpec) -> list[Diagnostic]:
    """The ``api-key`` warnings of ``spec`` in this process's environment (none when it
    does not check: the resume then reports what is wrong its own way)."""
    from .._errors import InterlockError
    from .._keys import unkeyed
    from .._plugins._compile import check_spec

    try:
        result = check_spec(spec, {})
    except (InterlockError, ImportError):
        return []
    return unkeyed(result.warnings)


def _warned_node(warning: Diagnostic, plan: Plan) -> str | None:
    """The node a warning is about (``node 'x': ...``)."""
    return next((name for name in plan.nodes
                 if warning.message.startswith(f"node {name!r}: ")), None)


async def keys_missing(store: Store, run_id: str, decision: Any) -> list[Diagnostic]:
    """The ``api-key`` warnings of the agent nodes a foreground resume of ``run_id``
    (with ``decision``) may reach; [] when it reaches none, or when the run cannot be
    read or continued (the resume says why)."""
    from .._errors import InterlockError
    from ._code import nodes_to_run
    from ._load import ENDED, load_run, run_key

    try:  # (a keyed log without its key here: the resume refuses it, saying why)
        if run_key(await store.get_run(run_id)) == (True, None):
            return []
        loaded = await load_run(store, run_id)
    except InterlockError:
        return []
    view = loaded.view
    if view.status in ENDED:
        return []
    warnings = _key_warnings(loaded.spec)
    if not warnings:
        return []
    reached = nodes_to_run(loaded.plan, view)
    if not reached or (decision is not None and decision.kind == "modify"):
        return warnings  # (not started, or re-entered upstream: every agent counts)
    return [w for w in warnings if _warned_node(w, loaded.plan) in reached | {None}]


__all__ = ["keys_missing"]
