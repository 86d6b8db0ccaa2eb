"""Code drift: a stored run continued by code that is not what it started with.

``run.started`` records the digests of the modules its nodes run (`_digest.code_digests`,
one per module; a ``run.migrated`` records those of the definition it moves to). When a run is
resumed, decided or continued by a worker (every `_execute.drive` that continues a
stored log), the modules of the nodes still to run -- the ones in flight and every node
reachable from them -- are hashed again; a node (the definition says which modules it
runs) one of whose modules differs is *changed*:

- by default the engine says so and goes on: a warning on stderr naming each node and
  module, and a ``run.code_changed`` record (``nodes``, ``modules`` per node, the
  changed modules' new ``code``)
  committed with the continuation's first records;
- with ``--strict-code`` (`set_strict_code`, or ``INTERLOCK_STRICT_CODE=1``) it
  refuses instead, before anything is recorded or claimed: `CodeChanged`, a
  `ConflictError` (the CLI's exit 2, the server's 409).

A log written before digests existed has none: nothing is compared.
"""

from __future__ import annotations

import logging
import os
from collections import deque

from .. import _log as L
from .._definition._digest import CodeDigests, changed_code, code_digests
from .._definition._model import END
from .._definition._plan import Plan
from .._engine._fold import RunView
from .._errors import ConflictError
from .._store import Store

log = logging.getLogger("interlock")

STRICT_ENV = "INTERLOCK_STRICT_CODE"
_strict: bool | None = None  # set by `--strict-code` (None: the environment decides)


def set_strict_code(on: bool | None) -> None:
    """Refuse (True) or only warn (False) when a run's code changed; None: as
    ``$INTERLOCK_STRICT_CODE`` says (default: warn)."""
    global _strict
    _strict = on


def strict_code() -> bool:
    if _strict is not None:
        return _strict
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false", "no")


class CodeChanged(ConflictError):
    """``--strict-code``: a node still to run has code that differs from what the run
    started with (or was migrated onto); nothing was recorded."""

    def __init__(self, message: str, run_id: str, changed: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.changed = changed


def nodes_to_run(plan: Plan, view: RunView) -> set[str]:
    """The nodes a run may still execute: those in flight (ready, running, waiting, owed
    a decision's targets) and every node reachable from them."""
    todo: deque[str] = deque(view.ready)
    todo.extend(node for node, _ in view.running)
    todo.extend(g.node for g in view.gates.values())
    for due in view.due.values():
        todo.extend(due.edge.targets)
        for e in plan.implied_otherwise.get(due.edge.index, ()):  # (owed with it: format 2)
            todo.extend(e.targets)
    seen: set[str] = set()
    while todo:
        node = todo.popleft()
        if node in seen or node == END or node not in plan.nodes:
            continue
        seen.add(node)
        pn = plan.nodes[node]
        for e in (*pn.out, *pn.errors):
            todo.extend(e.targets)
    return seen


async def recorded_code(store: Store, run_id: str, view: RunView) -> CodeDigests | None:
    """The digests the run's code is compared with: its migration's, else its start's."""
    if view.migration is not None:
        code = view.migration.get("code")
    else:
        first = await store.entries_page(run_id, 0, 1)
        code = first[0].record().get("code") if first else None
    return code if isinstance(code, dict) else None


async def drift(store: Store, run_id: str, plan: Plan, view: RunView
                ) -> tuple[dict[str, list[str]], CodeDigests]:
    """Per node still to run whose code changed, the modules that differ; and the new
    digests of those modules."""
    recorded = await recorded_code(store, run_id, view)
    if not recorded:
        return {}, {}
    nodes = nodes_to_run(plan, view)
    if not nodes:
        return {}, {}
    now = code_digests(plan.spec, nodes)
    changed = changed_code(plan.spec, recorded, now, nodes)
    modules = {m for mods in changed.values() for m in mods}
    return changed, {m: now[m] for m in sorted(modules)}


def _since(view: RunView) -> str:
    # (a migration onto a new definition keeps the digests of the code that had changed
    # already: `_migrate._code_moved`)
    return "started" if view.migration is None else "recorded it (at its start or migration)"


def describe(changed: dict[str, list[str]]) -> str:
    return "; ".join(f"node {node!r} (module{'s' if len(mods) > 1 else ''} "
                     f"{', '.join(mods)})" for node, mods in sorted(changed.items()))


async def check_code(store: Store, run_id: str, plan: Plan, view: RunView
                     ) -> list[tuple[str, dict[str, object]]]:
    """What a continuation of the run records about its code: a ``run.code_changed``
    (after a warning), or nothing. Raises `CodeChanged` under ``--strict-code``."""
    changed, now = await drift(store, run_id, plan, view)
    if not changed:
        return []
    what = describe(changed)
    if strict_code():
        raise CodeChanged(
            f"run {run_id!r}: the code of {what} changed since the run {_since(view)}; "
            "--strict-code refuses to continue it (nothing was recorded). Deploy the code "
            "it started with, move it onto the new code with `interlock migrate "
            f"{run_id} --to FILE` (the run's own file, unchanged, records the new code), "
            "or continue without --strict-code to accept the change",
            run_id, changed)
    log.warning("run %s: the code of %s changed since the run %s; it continues on the "
                "code as it is now (run.code_changed recorded; --strict-code refuses)",
                run_id, what, _since(view))
    return [(L.RUN_CODE_CHANGED, {"nodes": sorted(changed), "modules": changed,
                                  "code": now})]


__all__ = ["CodeChanged", "check_code", "drift", "nodes_to_run", "set_strict_code",
           "strict_code"]
