"""The lines the CLI adds about a waiting gate where it says how to decide it (``status``,
``run``/``resume``, ``runs --waiting``, ``interlock chat``): an unknown outcome explained,
a gate past its deadline resumed instead of decided, a branch whose executor is gone --
and what can be done about a failed run (``status``, ``run``/``resume``, ``send``,
``chat``: the engine's error names no command, as it cannot know the store).
The words are `interlock.support.gate_text`'s, which the server's approval rows use too."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType


def _text() -> ModuleType:
    from ..support import gate_text  # (imported when used: the CLI starts fast)

    return gate_text


def is_unknown(w: dict[str, Any]) -> bool:
    """An ``unknown_outcome`` gate: approving it runs a destructive action again."""
    return w.get("kind") == "unknown_outcome"


def shown(w: dict[str, Any]) -> dict[str, Any]:
    """The gate's ``show`` as people read it (an unknown outcome's start as UTC time)."""
    show: dict[str, Any] = _text().shown(w)
    return show


def data_example(w: dict[str, Any]) -> str:
    """The ``--data`` of an unknown outcome's approval that records it checked by hand."""
    example: str = _text().data_example(w)
    return example


def outcome_notes(w: dict[str, Any]) -> list[str]:
    """An ``unknown_outcome`` gate's explanation (none for another gate)."""
    if not is_unknown(w):
        return []
    lines: list[str] = _text().unknown_lines(w, data=f"--approve --data '{data_example(w)}'")
    return lines


def past_deadline(run_id: str, w: dict[str, Any], where: str) -> str | None:
    """The one command that works for a gate past its deadline (a decision is refused)."""
    if w.get("deadline") is None or not _text().deadline_passed(w):
        return None
    line: str = _text().passed_line(w, f"interlock resume {shlex.quote(run_id)}{where}")
    return line


def beside(running: list[Any], run_id: str, where: str, live: bool | None) -> str:
    """The run's other branches beside its gates: at work, or interrupted (no process
    holds the run's lease: its executor died; None: not known, a server's client)."""
    names = ", ".join(map(str, running)) or "-"
    if live is not False:
        return (f"still running beside the gate: {names} (its executor continues a decided "
                "gate's branch at once)")
    return (f"interrupted beside the gate: {names} (no process is executing the run: its "
            f"executor stopped); continue it with `interlock resume {shlex.quote(run_id)}{where}` "
            "(the gates keep waiting)")


def chat_outcome_lines(run_id: str, w: dict[str, Any], where: str) -> list[str]:
    """``interlock chat``'s words for an ``unknown_outcome`` gate: the gate's ``show``
    as people read it, then what happened and what ``/approve`` and ``/reject`` do, and
    the command that records the outcome checked by hand (none for another gate)."""
    if not is_unknown(w):
        return []
    data = (f"`interlock resume {shlex.quote(run_id)} --gate "
            f"{shlex.quote(str(w.get('node')))} --approve --data "
            f"'{data_example(w)}'{where}`")
    lines: list[str] = _text().unknown_lines(w, data=data)
    lines[2:4] = ["/approve: runs it AGAIN (check first that it did not happen)",
                  "/reject: records it as not done (it is not run again)"]
    return [json.dumps(shown(w), ensure_ascii=False), *lines]


def code_drift(nodes: list[str]) -> str:
    """The nodes still to run whose code changed since the run started (`status`)."""
    return (f"code changed since the run started: {', '.join(nodes)} (a continuation, a "
            "decision's included, runs them on the code as it is now and records "
            "run.code_changed; --strict-code refuses)")


def in_memory(where: str) -> bool:
    """Whether the options that reach a run (``where``) name a ``memory://`` store,
    which is gone with the process that ran it (also when $INTERLOCK_STORE names it)."""
    import os

    store = where if where else os.environ.get("INTERLOCK_STORE", "")
    return "memory://" in store and "--server" not in store


def memory_gone(cannot: str, run: str = "Run", to: str = "decide its gates later") -> str:
    """What a ``memory://`` run's hint says instead of a command that would read it."""
    return (f"this run was in memory:// and is gone with this process: nothing can "
            f"{cannot}. {run} the workflow again with a lasting store (--store "
            f"sqlite:///runs.db) to be able to {to}")


def _unfit(rid: str, err: dict[str, Any], where: str, remote: bool,
           var: str | None) -> str | None:
    """The hint of a failed run that `interlock resume` cannot continue as it is: a
    ``memory://`` run (gone with its process), an error of the pinned definition (an
    agent's `AgentConfigError`: fix the file, migrate), or of this environment (an
    `AgentEnvironmentError` other than an API key's, ``var``: set it, resume)."""
    details = err.get("details")
    mro = details.get("mro") or () if isinstance(details, dict) else ()
    # (an environment's error recorded before AgentEnvironmentError: by its words)
    env = "AgentEnvironmentError" in mro or var is not None \
        or "is not set in the environment" in str(err.get("message"))
    pinned = "AgentConfigError" in mro and not env
    if not remote and in_memory(where):  # nothing can resume or fork it
        return memory_gone("resume it", "Fix the workflow file, then run" if pinned
                           else "Run", "continue a run after a failure")
    if pinned:  # raised by the definition the run keeps: a resume fails the same way
        return (f"the workflow's definition causes this error, and the run keeps the "
                f"definition it started with: `interlock resume {rid}` would fail the "
                f"same way. Fix the workflow file, move the run onto it with `interlock "
                f"migrate {rid} --to FILE{where}`, then `interlock resume {rid}{where}`")
    if env and var is None:
        return (f"set what the error names in the environment of the process that "
                f"continues the run, then run the failed node again with `interlock resume "
                f"{rid}{where}`")
    return None


def failed_hint(run_id: str, error: dict[str, Any] | None, where: str,
                 remote: bool = False) -> str:
    """What can be done about a failed run: a resume re-runs the failed node and decides
    again, on the definition the run keeps -- which does not help every failure.
    ``where``: the options that reach the run (``remote``: a server's, through which
    resume takes no limits and fork is not offered: those go to the server's store)."""
    err = error or {}
    kind = err.get("type")
    details = err.get("details") or {}
    rid = shlex.quote(run_id)
    from ..support import final_failure, missing_key

    var = missing_key(err)
    unfit = _unfit(rid, err, where, remote, var)
    if unfit is not None:  # gone with its process, or a resume would fail the same way
        return unfit
    local, on_store = (" --store URL", " on the server's store (through --server, "
                       "resume takes no limits.* and fork is local)") if remote \
        else (where, "")
    if var is not None:  # a resume before the variable is set would fail the same way
        return (f"the agent had no API key where the run executed: set ${var} in the "
                "environment of the process that executes it -- " + (
                    "`interlock serve` (or its `interlock worker` processes), restarted"
                    if remote else "this shell, or the worker or server that executed it")
                + f" -- then `interlock resume {rid}{where}`")
    final = final_failure(err)
    if final is not None:  # a resume is refused: it would fail the same way
        return (f"this failure is final: {final}; `interlock resume` is refused. To try "
                f"again from before it, start a new run from one of its records: "
                f"`interlock fork {rid}{local} --at SEQ`{on_store} (`interlock trace "
                f"{rid}{where}` lists them)")
    if kind == "budget_exceeded" and details.get("scope") == "node":
        return ("the node's own budget (tokens: in the workflow) is part of the definition "
                "this run keeps: a resume would run it again under the same budget; raise it "
                "in the file and start a new run")
    if kind == "budget_exceeded":
        return f"continue with a higher budget: `interlock resume {rid}{local} --set " \
               f"limits.tokens=N`{on_store}"
    if kind == "step_limit":
        return f"continue with a higher limit: `interlock resume {rid}{local} --set " \
               f"limits.steps=N`{on_store}"
    if kind in ("no_route", "expression_error", "invalid_route"):
        return (f"a resume decides again on the same state (with `--set K=V`, on changed "
                f"config): `interlock resume {rid}{where}`; to change the state, start a new "
                f"run from an earlier record with `interlock fork {rid}{local} --at SEQ "
                f"--patch JSON`{on_store} (see `interlock trace`); a fix to the workflow file "
                "applies to new runs")
    if kind == "write_conflict":
        return ("declare a reducer for the field in the workflow file and start a new run "
                "(this run keeps its definition: a resume would conflict again)")
    return f"run the failed node again with `interlock resume {rid}{where}`"
