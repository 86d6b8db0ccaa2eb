"""The scheduler's fast paths write the records its general path writes.

Two shortcuts skip machinery on the common step: a node alone in the run is awaited in
the loop's own task (`Runner.inline`), and the edges of a node whose every out-edge is
plain and unconditional are taken without being decided (`Decider.fast`, over
`Plan.always_taken`). With both off, every visit is a task and every edge is decided:
the records must be the same (but for when they were written and how long nodes took).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

import interlock
from interlock import END, START, Workflow
from interlock._engine._decide import Decider
from interlock._engine._expand import Expander
from interlock._engine._runner import Runner

TIMING = ("at", "duration_ms")
SEQ = ("seq", "implied")  # (what `Expander` adds to the records it writes out)


def chain() -> Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state.get("i", 0) + 1}

    wf = Workflow("chain")
    names = [f"n{k}" for k in range(5)]
    for name in names:
        wf.node(name, inc)
    wf.edge(START, names[0])
    for a, b in itertools.pairwise(names):
        wf.edge(a, b)
    return wf


def loop() -> Workflow:
    async def inc(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state.get("i", 0) + 1}

    wf = Workflow("loop")
    wf.node("inc", inc).node("done", lambda s: {"done": True})
    wf.edge(START, "inc").edge("inc", "inc", when="i < 4")
    wf.edge("inc", "done", otherwise=True)
    return wf


def fan_out_and_join() -> Workflow:
    wf = Workflow("fan", state={"seen": "append"})
    wf.node("start", lambda s: None)
    for name in ("a", "b", "c"):
        wf.node(name, lambda s, name=name: {"seen": [name]})
    wf.node("join", lambda s: {"n": len(s["seen"])})
    wf.edge(START, "start").edge("start", ["a", "b", "c"]).edge(["a", "b", "c"], "join")
    return wf


def retried_and_choosing() -> Workflow:
    calls: list[int] = []

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> Any:
        calls.append(1)
        ctx.record_tokens(3)
        if len(calls) < 2:
            raise ValueError("not yet")
        kept = await ctx.once("send", lambda: {"sent": len(calls)})
        return interlock.goto("end_here", {"kept": kept})

    wf = Workflow("retry")
    wf.node("flaky", flaky, retry={"attempts": 3})
    wf.node("end_here", lambda s: {"ok": True}).node("never", lambda s: None)
    wf.edge(START, "flaky").choose("flaky", ["end_here", "never"]).edge("end_here", END)
    return wf


def switched() -> Workflow:
    wf = Workflow("switch")
    wf.node("pick", lambda s: {"kind": "b"}).node("a", lambda s: None)
    wf.node("b", lambda s: {"b": True})
    wf.edge(START, "pick").switch("pick", "kind", {"a": "a", "b": "b"})
    return wf


WORKFLOWS: dict[str, Callable[[], Workflow]] = {
    "chain": chain, "loop": loop, "fan-out and join": fan_out_and_join,
    "retry, tokens, once and goto": retried_and_choosing, "switch": switched,
}


def records(wf: Workflow) -> list[list[tuple[str, Any]]]:
    """The run's records, fields in order (the order is in the sealed bytes: the hot
    path's literals, `_records`' "the hot path", must keep their builders' order), with
    the timings blanked -- as format 1 writes them (`Expander`: the inline path writes
    ``node.visited``, a visit run as a task ``node.started`` and ``node.completed``; the
    seqs differ by as much)."""
    recs: list[dict[str, Any]] = []
    plans = []

    def listen(rec: dict[str, Any], view: Any) -> None:
        if not rec.get("implied"):  # (told to listeners too: expanded below, again)
            recs.append(dict(rec))
        plans.append(view.plan)

    wf.run_sync({}, store="memory://", listener=listen)
    expanded = Expander(plans[0], split=True).expand(recs)
    return [[(k, None if k in TIMING else v) for k, v in r.items() if k not in SEQ]
            for r in expanded]


@pytest.mark.parametrize("name", WORKFLOWS)
def test_fast_paths_write_the_records_of_the_general_path(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks: list[str] = []
    start_task = Runner._start_task

    def counting(self: Runner, node: str, *args: Any, **kw: Any) -> None:
        tasks.append(node)
        start_task(self, node, *args, **kw)

    monkeypatch.setattr(Runner, "_start_task", counting)
    fast = records(WORKFLOWS[name]())
    fast_tasks = list(tasks)
    monkeypatch.setattr(Runner, "inline", False)
    monkeypatch.setattr(Decider, "fast", False)
    tasks.clear()
    general = records(WORKFLOWS[name]())
    assert fast == general
    assert dict(fast[-1])["type"] == "run.completed"
    # the general path did run every visit as a task; the fast one, only the branches
    assert len(tasks) == sum(r["type"] == "node.started" and r["attempt"] == 1
                             for r in map(dict, general))
    assert len(fast_tasks) < len(tasks)


def test_the_chain_takes_the_always_taken_shortcut() -> None:
    wf = chain()
    assert wf.compile().always_taken >= {"n0", "n1", "n2", "n3"}


# -- the journal's flush: serialised by a flag, not a lock --------------------------------


class _SlowStore:
    """Records each append's start and end; an append waits a few loop turns."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[int]]] = []

    async def append(self, run_id: str, entries: list[Any], summary: Any) -> None:
        seqs = [e.seq for e in entries]
        self.events.append(("start", seqs))
        for _ in range(3):
            await asyncio.sleep(0)
        self.events.append(("end", seqs))


class _View:
    status, steps, tokens, error, waiting = "running", 0, 0, None, None
    snapshot_at = 0  # (the seq of the log's latest snapshot: none)
    gates: ClassVar[dict[Any, Any]] = {}  # (no gate waits)

    def apply(self, rec: Any) -> None:
        pass


def _journal(store: _SlowStore) -> Any:
    from interlock import _log as L
    from interlock._engine._journal import Journal
    return Journal(store, "r", _View(), L.LogWriter())  # type: ignore[arg-type]


def test_flushes_in_flight_together_are_serialised_and_each_stores_what_it_staged() -> None:
    store = _SlowStore()

    async def main() -> None:
        j = _journal(store)
        stored: list[int] = []

        async def stage_and_flush(k: int) -> None:
            j.add(("test.rec", {"k": k}))
            seq = j.writer.seq
            await j.flush()
            # when flush returns, what was staged before it is stored
            stored.append(seq)
            assert any(ev == "end" and seq in seqs for ev, seqs in store.events)

        await asyncio.gather(*(stage_and_flush(k) for k in range(5)))
        assert sorted(stored) == [1, 2, 3, 4, 5]
        assert not j._flushing and j._waiting == 0

    asyncio.run(main())
    # never two appends at once: each start is followed by its own end
    kinds = [ev for ev, _ in store.events]
    assert kinds == ["start", "end"] * (len(kinds) // 2)
    assert sorted(s for ev, seqs in store.events if ev == "end" for s in seqs) == [1, 2, 3, 4, 5]


def test_a_flush_cancelled_while_it_waits_leaves_the_others_their_turn() -> None:
    store = _SlowStore()

    async def main() -> None:
        j = _journal(store)
        j.add(("test.rec", {"k": 0}))
        first = asyncio.create_task(j.flush())
        await asyncio.sleep(0)  # in flight
        j.add(("test.rec", {"k": 1}))
        waiter = asyncio.create_task(j.flush())
        other = asyncio.create_task(j.flush())
        await asyncio.sleep(0)
        waiter.cancel()
        await first
        await other
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not j._flushing and j._waiting == 0
        await j.flush()  # not stuck

    asyncio.run(main())
    assert [s for ev, seqs in store.events if ev == "end" for s in seqs] == [1, 2]


def test_the_journal_sets_every_field_of_the_summary() -> None:
    """`Journal.flush` makes the `Summary` without its ``__init__``: every field set."""
    import dataclasses

    from interlock._store import Summary

    seen: list[Any] = []

    class Store(_SlowStore):
        async def append(self, run_id: str, entries: list[Any], summary: Any) -> None:
            seen.append(summary)

    async def main() -> None:
        j = _journal(Store())
        j.add(("test.rec", {"k": 1}))
        await j.flush()

    asyncio.run(main())
    (summary,) = seen
    assert type(summary) is Summary
    assert {f.name for f in dataclasses.fields(Summary)} == {
        "status", "last_seq", "last_hash", "steps", "tokens", "error", "waiting", "updated_at"}
    assert (summary.status, summary.last_seq, summary.steps, summary.tokens, summary.error,
            summary.waiting) == ("running", 1, 0, 0, None, None)
    assert summary.last_hash == summary.copy().last_hash and summary.updated_at > 0
