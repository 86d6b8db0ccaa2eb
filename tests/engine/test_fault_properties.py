"""A property of the executor's failure paths (issue 26): whatever append the store
refuses -- once, a few times, for good, or after committing it (its answer lost) --
a run ends in a terminal status, or stops unfinished with its claim given up and
continues to the same end on a healthy store; ``verify`` accepts what was stored; and
an effect (``ctx.once``) runs once while the process lives.

Hypothesis builds random workflows as a chain of segments -- a node (async or sync,
some with an effect), a fan-out of 2-3 branches into a join, a loop taken K times, a
mapped node over 1-5 items, a node that fails its first attempt under ``retry:`` --
and a `FaultyStore` failing one random append.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import interlock
from interlock import END, START, Workflow
from interlock._engine import _journal
from interlock._errors import StoreError
from interlock._store import open_store
from interlock.testing import FaultyStore

Segment = tuple[Any, ...]  # ("node", sync, effect) | ("fan", k) | ("loop", k)
#                            | ("map", n) | ("retry",)

segments = st.one_of(
    st.tuples(st.just("node"), st.booleans(), st.booleans()),
    st.tuples(st.just("fan"), st.integers(2, 3)),
    st.tuples(st.just("loop"), st.integers(1, 3)),
    st.tuples(st.just("map"), st.integers(1, 5)),
    st.tuples(st.just("retry")),
)


@dataclass
class Built:
    wf: Workflow
    count: int  # the run's ``count`` at its end: one per completed visit (maps aside)
    maps: dict[str, int]  # a map's collect field -> its number of items
    effects: Counter[str]  # how often each effect's function ran (in this process)


def build(plan: list[Segment], effects: Counter[str]) -> Built:  # noqa: C901 - one branch a kind
    state: dict[str, str] = {"count": "add"}
    wf = Workflow("faulty-prop", state=state)
    count = 0
    maps: dict[str, int] = {}
    prev: str = START
    otherwise = False  # the edge out of ``prev`` is a loop's exit

    def link(target: str | list[str]) -> None:
        nonlocal otherwise
        if otherwise:
            wf.edge(prev, target, otherwise=True)
        else:
            wf.edge(prev, target)
        otherwise = False

    def plain(name: str, sync: bool = False, effect: bool = False) -> None:
        if sync:
            def fn(state: dict[str, Any]) -> dict[str, Any]:
                return {"count": 1}
            wf.node(name, fn)
        elif effect:
            async def afn(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
                def act() -> str:
                    effects[f"{name}:{ctx.visit}"] += 1
                    return "done"
                await ctx.once("act", act)
                return {"count": 1}
            wf.node(name, afn)
        else:
            async def anode(state: dict[str, Any]) -> dict[str, Any]:
                await asyncio.sleep(0)
                return {"count": 1}
            wf.node(name, anode)

    for i, seg in enumerate(plan):
        kind = seg[0]
        if kind == "node":
            name = f"n{i}"
            plain(name, sync=seg[1], effect=seg[2])
            link(name)
            prev, count = name, count + 1
        elif kind == "fan":
            fork, join = f"f{i}", f"j{i}"
            branches = [f"f{i}b{b}" for b in range(seg[1])]
            for n in (fork, *branches, join):
                plain(n, sync=n.endswith("b1"))
            link(fork)
            wf.edge(fork, branches).edge(branches, join)
            prev, count = join, count + 2 + len(branches)
        elif kind == "loop":
            name = f"l{i}"
            plain(name)
            link(name)
            wf.edge(name, name, when=f"run.visits.{name} < {seg[1]}")
            prev, count, otherwise = name, count + seg[1], True
        elif kind == "map":
            src, work, field = f"m{i}", f"m{i}w", f"out{i}"
            n = seg[1]
            state[field] = "append"

            async def items(state: dict[str, Any], n: int = n, key: str = f"xs{i}"
                            ) -> dict[str, Any]:
                return {"count": 1, key: list(range(n))}

            async def each(state: dict[str, Any]) -> dict[str, Any]:
                await asyncio.sleep(0)
                return {"v": state["x"]}

            wf.node(src, items).node(work, each)
            link(src)
            wf.map(src, f"xs{i}", work, as_="x", collect=field, max_concurrency=2)
            prev, count = work, count + 1
            maps[field] = n
        else:
            name = f"r{i}"

            async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
                if ctx.attempt == 1:
                    raise RuntimeError("fails its first attempt")
                return {"count": 1}

            wf.node(name, flaky, retry={"attempts": 3, "backoff": "0s"})
            link(name)
            prev, count = name, count + 1
    link(END)
    return Built(wf, count, maps, effects)


def check_end(built: Built, result: interlock.RunResult) -> None:
    assert result.status == "COMPLETED", result.error
    assert result.state["count"] == built.count
    for field, n in built.maps.items():
        assert len(result.state[field]) == n


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(segments, min_size=1, max_size=4), nth=st.integers(1, 14),
       times=st.sampled_from([1, 2, None]), after=st.booleans())
def test_a_run_survives_any_append_its_store_refuses(
        plan: list[Segment], nth: int, times: int | None, after: bool) -> None:
    note(f"plan={plan} nth={nth} times={times} after={after}")
    saved = _journal.RETRY_SECONDS
    _journal.RETRY_SECONDS = 0.5  # 4 tries: a refusal for good is given up on quickly
    try:
        asyncio.run(_scenario(plan, nth, times, after))
    finally:
        _journal.RETRY_SECONDS = saved


async def _scenario(plan: list[Segment], nth: int, times: int | None, after: bool,
                    *, events: bool = True) -> None:
    store = FaultyStore(open_store("memory://"))
    fault = store.fail_append(nth=nth, times=times, after=after)
    built = build(plan, Counter())
    try:
        result = await asyncio.wait_for(built.wf.run(store=store), 60)
    except StoreError as exc:
        # given up: only when the store refused for good, with what the store said
        assert times is None, exc
        if events:
            event("given up, then resumed")
        assert "could not be stored" in str(exc) and "FaultyStore" in str(exc)
        rows = await store.inner.list_runs()
        assert len(rows) == 1
        row = rows[0]
        assert row.summary.status not in ("COMPLETED", "FAILED")
        assert row.owner is None  # left for takeover, no live lease
        assert (await interlock.verify(row.run_id, store=store.inner)).ok
        store.heal()
        again = build(plan, built.effects)
        result = await asyncio.wait_for(again.wf.resume(row.run_id, store=store), 60)
        check_end(again, result)
    else:
        if events:
            note(f"fault hits: {fault.hits}")
            event("completed" + (" through retried appends" if fault.hits else ""))
        check_end(built, result)
        # the process lived: no effect ran twice
        assert all(n == 1 for n in built.effects.values()), built.effects
    assert (await interlock.verify(result.run_id, store=store)).ok
    row = await store.get_run(result.run_id)
    assert row.owner is None and row.summary.status == "COMPLETED"


@pytest.mark.parametrize("nth", range(1, 12))
def test_every_append_of_a_mixed_workflow_may_fail_for_good(nth: int) -> None:
    """Deterministic companion of the property: each append in turn refused for good."""
    plan: list[Segment] = [("node", False, True), ("fan", 2), ("retry",), ("map", 3),
                           ("loop", 2)]
    saved = _journal.RETRY_SECONDS
    _journal.RETRY_SECONDS = 0.1
    try:
        asyncio.run(_scenario(plan, nth, None, False, events=False))
    finally:
        _journal.RETRY_SECONDS = saved
