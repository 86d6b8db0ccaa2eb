"""Which gate a decision decided, said the moment it is recorded (``resume --approve``
without ``--gate``, or with a mapped gate's bare name while one item waits).

Without ``--gate`` a decision goes to the gate waiting longest (by ``requested_at``), and
a mapped gate's items are gates of their own (``NODE[i]``). The line names the gate
decided and, when others still wait, which ones and the ``--gate`` that names the next:

    approved 'approval' (no --gate: the only gate waiting)
    approved 'legal', the oldest of 2 waiting gates (no --gate); still waiting: 'finance':
        name it with --gate finance
    approved 'deploy[0]', the oldest of 4 waiting items of 'deploy' (no --gate); still
        waiting: 'deploy[1]', 'deploy[2]', 'deploy[3]': name one with --gate 'deploy[1]'

It is printed on stderr before the lines of what the run does next -- the person sees
which gate they decided before they would run the same command again.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..support import Record, RunView

VERBS = {"approve": "approved", "reject": "rejected", "modify": "modified"}
LISTED = 6  # the waiting gates a note names at most


def decided_record(decision: Any, records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``approval.decided`` among ``records`` that ``decision`` made (its verb, its
    decider; not the engine's for a deadline), or None."""
    return next((rec for rec in records if is_decided(decision, rec)), None)


def is_decided(decision: Any, rec: dict[str, Any]) -> bool:
    """Whether ``rec`` is the ``approval.decided`` that ``decision`` made."""
    return rec.get("type") == "approval.decided" and rec.get("decision") == \
        VERBS[decision.kind] and decision.by in (None, rec.get("by")) \
        and not rec.get("timed_out")


def name_of(rec: dict[str, Any]) -> str:
    """A gate's name as ``--gate`` takes it, from its ``approval.*`` record."""
    item = rec.get("item")
    return str(rec.get("path") or (rec["node"] if item is None else f"{rec['node']}[{item}]"))


def note(decision: Any, rec: dict[str, Any], waiting: list[str]) -> str | None:
    """The line saying which gate ``decision`` decided (``rec``, its ``approval.decided``)
    when it did not name it exactly, ``waiting`` the gates still waiting after it (oldest
    first); None when ``--gate`` named it."""
    verb, name = VERBS[decision.kind], name_of(rec)
    node = str(rec.get("node"))
    if decision.node is not None:
        if name.startswith(f"{decision.node}[") and "/" not in name:
            return f"{verb} {name!r} (the one item of {decision.node!r} waiting)"
        return None
    if not waiting:
        return f"{verb} {name!r} (no --gate: the only gate waiting)"
    mapped = rec.get("item") is not None and "/" not in name
    siblings = [w for w in waiting if mapped and w.startswith(f"{node}[") and "/" not in w]
    of = (f"waiting items of {node!r}" if len(siblings) == len(waiting)
          else "waiting gates")
    listed = ", ".join(repr(w) for w in waiting[:LISTED]) + (
        f", ... ({len(waiting) - LISTED} more)" if len(waiting) > LISTED else "")
    which = "it" if len(waiting) == 1 else "one"
    return (f"{verb} {name!r}, the oldest of {len(waiting) + 1} {of} (no --gate); still "
            f"waiting: {listed}: name {which} with --gate {shlex.quote(waiting[0])}")


def waiting_in(view: RunView) -> list[str]:
    """The names of the gates waiting in ``view``, oldest first (``waiting.pending``'s)."""
    named: list[tuple[float, str]] = []
    for gate in view.pending_gates():
        if gate.kind == "message":  # (a conversation's next message: no person's gate)
            continue
        if gate.children:  # a child run's gates, each by its path from here
            named += [(_at(c.get("requested_at"), gate.requested_at), str(c.get("node")))
                      for c in gate.children]
        else:
            named.append((gate.requested_at, name_of({"node": gate.node, "item": gate.item,
                                                      "path": gate.path})))
    return [n for _, n in sorted(named, key=lambda p: p[0])]


def waiting_before(records: Iterable[dict[str, Any]], seq: int) -> list[str]:
    """The names of the gates waiting right after record ``seq``, from the records (a
    client's view of a run: through ``--server``, or read back after the decision)."""
    gates: dict[tuple[Any, Any, Any], list[str]] = {}
    for rec in records:
        if rec.get("seq", 0) > seq:
            break
        key = (rec.get("node"), rec.get("visit"), rec.get("item"))
        if rec.get("type") == "approval.requested" and rec.get("kind") != "message":
            pending = rec.get("pending")
            gates.pop(key, None)  # (asked again: the newest, last)
            gates[key] = [str(c.get("node")) for c in pending] \
                if isinstance(pending, list) and pending else [name_of(rec)]
        elif rec.get("type") == "approval.decided":
            gates.pop(key, None)
    return [n for names in gates.values() for n in names]


def _at(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) else default


class NoteOnDecided:
    """A listener around the run's own (its progress lines): when the decision's
    ``approval.decided`` is recorded, it prints `note` on stderr, once."""

    def __init__(self, listener: Any, decision: Any) -> None:
        self.listener, self.decision = listener, decision
        self.said = decision is None  # (a plain resume: nothing to say)

    def __call__(self, rec: Record, view: RunView) -> None:
        self.listener(rec, view)
        if not self.said and is_decided(self.decision, rec):
            self.said = True
            say(note(self.decision, rec, waiting_in(view)))

    def child(self, run_id: str, workflow: str) -> Any:
        """A child run's listener: the run's own (`Progress.child`)."""
        return self.listener.child(run_id, workflow)


def say(line: str | None) -> None:
    if line:
        with contextlib.suppress(BrokenPipeError):  # (stderr's reader went away)
            click.echo(line, err=True)
