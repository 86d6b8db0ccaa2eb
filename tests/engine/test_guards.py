"""Runtime guards with real time: token budgets, timeouts, retries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import interlock
from interlock import START, Workflow


def records_of(wf: Workflow, *args: Any, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    recs: list[dict[str, Any]] = []
    kw.setdefault("store", "memory://")
    result = wf.run_sync(*args, listener=lambda r, v: recs.append(r), **kw)
    return result, recs


# -- token budgets -------------------------------------------------------------------


def test_budget_crossed_in_one_of_two_parallel_branches_stops_the_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    slow_started = threading.Event()
    calls: list[str] = []

    async def cheap(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        calls.append("cheap")
        ctx.record_tokens(100)
        return {"cheap": True}

    async def greedy(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        calls.append("greedy")
        await asyncio.to_thread(slow_started.wait, 5)
        ctx.record_tokens(600)  # crosses the budget of 500
        ctx.record_tokens(1)  # reached only once the budget allows it (on resume)
        return {"greedy": True}

    async def slow(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        calls.append("slow")
        ctx.record_tokens(50)
        slow_started.set()
        await asyncio.sleep(30)  # cancelled when the budget stops the run
        return {"slow": True}

    wf = Workflow("budget", limits={"tokens": 500})
    wf.node("start", lambda s: None).node("cheap", cheap).node("greedy", greedy)
    wf.node("slow", slow).node("join", lambda s: {"done": True})
    wf.edge(START, "start").edge("start", ["greedy", "slow"]).edge("greedy", "cheap")
    wf.edge(["cheap", "slow"], "join")
    t0 = time.perf_counter()
    result = wf.run_sync(store=store)
    assert time.perf_counter() - t0 < 10  # the sleeping sibling was cancelled, not awaited
    assert result.status == "FAILED"
    assert result.error["type"] == "budget_exceeded" and result.error["node"] == "greedy"
    assert result.tokens == 650  # the crossing call counts; the cancelled sibling's 50 too
    trace = asyncio.run(interlock.trace(result.run_id, store=store))
    assert [r["tokens"] for r in trace if r["type"] == "node.failed"
            and r["node"] == "greedy"] == [600]

    calls.clear()
    done = asyncio.run(interlock.resume(result.run_id, store=store, limits={"tokens": 5000},
                                        workflow=wf))
    assert done.status == "COMPLETED", done.error
    assert done.state["done"] is True
    assert "start" not in calls  # completed work was not repeated
    # greedy ran again (601: both calls fit now), slow again, and cheap once
    assert done.tokens == 650 + 601 + 50 + 100


def test_node_budget() -> None:
    async def chatty(state: dict[str, Any], ctx: interlock.Context) -> None:
        ctx.record_tokens(30)
        with contextlib.suppress(Exception):  # a node that swallows the error still fails
            ctx.record_tokens(30)

    wf = Workflow("node-budget")
    wf.node("chatty", chatty, tokens=50).edge(START, "chatty")
    result, _ = records_of(wf)
    assert result.status == "FAILED" and result.error["type"] == "budget_exceeded"
    assert "budget is 50" in result.error["message"]


def test_a_nodes_budget_counts_every_attempt_of_its_visit(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    bodies: list[int] = []

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        bodies.append(ctx.attempt)
        ctx.record_tokens(100)
        raise ConnectionError("the model's server hung up")

    wf = Workflow("visit-budget")
    wf.node("flaky", flaky, tokens=150, retry={"attempts": 3, "backoff": "1ms"})
    wf.edge(START, "flaky")
    result = wf.run_sync(store=store)
    # the second attempt crosses 150 for the visit (100 + 100): no third attempt
    assert result.status == "FAILED" and result.error["type"] == "budget_exceeded", result.error
    assert "used 200 tokens in this visit" in result.error["message"]
    assert bodies == [1, 2] and result.tokens == 200
    # a resume does not run a body whose visit has spent its budget: it would only spend more
    again = wf.resume_sync(result.run_id, store=store)
    assert again.status == "FAILED" and again.error["type"] == "budget_exceeded"
    assert bodies == [1, 2] and again.tokens == 200


def test_tokens_spent_inside_once_survive_the_attempt_being_lost(tmp_path: Path) -> None:
    """A crash (here: the caller's cancellation, which commits nothing more) after a
    journaled call: its tokens are in the log with its result, and the replay on resume
    does not charge them again."""
    store = f"sqlite:///{tmp_path}/runs.db"
    blocked = asyncio.Event()
    release = {"go": False}

    async def agentish(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        def call() -> str:
            ctx.record_tokens(100)  # the model call's usage, charged inside the journal
            return "reply"
        reply = await ctx.once("llm-0", call)
        if not release["go"]:
            blocked.set()
            await asyncio.sleep(60)
        ctx.record_tokens(5)
        return {"reply": reply}

    wf = Workflow("journal-tokens", limits={"tokens": 1000})
    wf.node("agent", agentish).edge(START, "agent")

    async def crash() -> None:
        task = asyncio.create_task(wf.run(store=store, run_id="r-crash"))
        await blocked.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(crash())
    assert asyncio.run(interlock.status("r-crash", store=store)).tokens == 100
    release["go"] = True
    done = wf.resume_sync("r-crash", store=store)
    assert done.status == "COMPLETED" and done.tokens == 105  # not 5: nothing lost
    recs = asyncio.run(interlock.trace("r-crash", store=store))
    [effect] = [r for r in recs if r["type"] == "effect.recorded"]
    assert effect["tokens"] == 100
    assert asyncio.run(interlock.verify("r-crash", store=store)).ok


def test_tokens_are_per_node_in_the_trace() -> None:
    async def a(state: dict[str, Any], ctx: interlock.Context) -> None:
        ctx.record_tokens(12)

    wf = Workflow("tokens")
    wf.node("a", a).edge(START, "a")
    result, recs = records_of(wf)
    assert result.tokens == 12
    assert [r.get("tokens") for r in recs
            if r["type"] in ("node.completed", "node.visited")] == [12]  # (format 2)


# -- timeouts ------------------------------------------------------------------------


def test_async_node_past_its_timeout_is_cancelled_promptly() -> None:
    async def sleepy(state: dict[str, Any]) -> None:
        await asyncio.sleep(10)

    wf = Workflow("timeout")
    wf.node("sleepy", sleepy, timeout="0.5s").edge(START, "sleepy")
    t0 = time.perf_counter()
    result, _ = records_of(wf)
    elapsed = time.perf_counter() - t0
    assert result.status == "FAILED" and "timed out after 0.5s" in result.error["message"]
    assert elapsed < 2


def test_default_timeout_comes_from_limits() -> None:
    async def sleepy(state: dict[str, Any]) -> None:
        await asyncio.sleep(10)

    wf = Workflow("timeout-default", limits={"timeout": "300ms"})
    wf.node("sleepy", sleepy).edge(START, "sleepy")
    result, _ = records_of(wf)
    assert "timed out after 0.3s" in result.error["message"]


def test_the_timeout_counts_from_the_start_of_the_body_not_its_first_await() -> None:
    # The timer is armed lazily, when the body first suspends; the deadline must still be
    # the body's start + timeout, so a body that blocked past it stops at its first await.
    reached: list[str] = []

    async def blocks_then_waits(state: dict[str, Any]) -> None:
        time.sleep(0.6)  # blocks the loop past the 0.3 s deadline
        await asyncio.sleep(0)
        reached.append("after the first await")
        await asyncio.sleep(10)

    wf = Workflow("timeout-from-start")
    wf.node("n", blocks_then_waits, timeout="0.3s").edge(START, "n")
    result, _ = records_of(wf)
    assert result.status == "FAILED" and "timed out after 0.3s" in result.error["message"]
    assert reached == []


def test_a_body_keeps_its_task_and_its_own_timeouts_across_awaits() -> None:
    # Bodies run their first step without a timer; the rest must run in the same task, so
    # a body's own asyncio.timeout / current_task / contextvars behave as with a plain await.
    async def own_timeout(state: dict[str, Any]) -> dict[str, Any]:
        task = asyncio.current_task()
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(5)
        except TimeoutError:
            caught = True
        else:
            caught = False
        return {"caught": caught, "same_task": asyncio.current_task() is task}

    async def fails_after_await(state: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    wf = Workflow("own-timeout")
    wf.node("own", own_timeout, timeout="5s").node("late", fails_after_await)
    wf.edge(START, "own").edge("own", "late")
    result, _ = records_of(wf)
    assert result.state["caught"] is True and result.state["same_task"] is True
    assert result.status == "FAILED" and result.error["node"] == "late"
    assert "KeyError" in result.error["message"]


def busy(seconds: float) -> None:
    """Computes for ``seconds`` without yielding to the event loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_an_async_body_that_overran_without_awaiting_is_failed_as_timed_out() -> None:
    """An async def body that computes past its timeout without awaiting cannot be
    interrupted (no timer fires while it holds the loop): it ended COMPLETED, its update
    applied. It is failed as timed out when it returns, its update discarded -- whether it
    never suspended or computed after its last await."""
    async def never_awaits(state: dict[str, Any]) -> dict[str, Any]:
        busy(1.0)
        return {"out": "computed"}

    async def awaits_then_computes(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        busy(1.0)
        return {"out": "computed"}

    for body in (never_awaits, awaits_then_computes):
        wf = Workflow("overran")
        wf.node("hog", body, timeout="0.3s").node("after", lambda s: {"after": True})
        wf.edge(START, "hog").edge("hog", "after")
        result, recs = records_of(wf)
        assert result.status == "FAILED", (body, result.status)
        assert "timed out after 0.3s" in result.error["message"], result.error
        assert "without awaiting" in result.error["message"], result.error
        assert "out" not in result.state and "after" not in result.state, result.state
        types = [r["type"] for r in recs]
        assert "node.completed" not in types, types
        [failed] = [r for r in recs if r["type"] == "node.failed"]
        assert failed["node"] == "hog"
        assert failed["error"]["details"]["exception"] == "TimeoutError", failed


def test_an_overrun_is_retried_like_any_timeout() -> None:
    attempts: list[int] = []

    async def slow_first(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            busy(0.6)
        return {"ok": ctx.attempt}

    wf = Workflow("overran-retry")
    wf.node("n", slow_first, timeout="0.2s",
            retry={"attempts": 2, "backoff": "0s", "errors": ["TimeoutError"]})
    wf.edge(START, "n")
    result, recs = records_of(wf)
    assert result.status == "COMPLETED", result.error
    assert attempts == [1, 2] and result.state["ok"] == 2
    assert [r["type"] for r in recs].count("node.retrying") == 1


def test_an_overrun_is_caught_by_an_error_edge_like_any_timeout() -> None:
    async def hog(state: dict[str, Any]) -> dict[str, Any]:
        busy(0.5)
        return {"out": "computed"}

    wf = Workflow("overran-caught")
    wf.node("hog", hog, timeout="0.2s").node("handle", lambda s: {"handled": True})
    wf.edge(START, "hog").edge("hog", "handle", on_error=["TimeoutError"])
    result, recs = records_of(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["handled"] is True and "out" not in result.state
    [failed] = [r for r in recs if r["type"] == "node.failed"]
    assert failed["caught"]["error"]["type"] == "TimeoutError", failed


def test_the_node_holding_a_loop_is_found_in_its_threads_stack() -> None:
    """What the server's watchdog names (`support.executing_node`): the node whose async
    body a blocked thread is in, before its first await and after one, even inside a
    function the body calls."""
    import sys

    from interlock.support import executing_node

    def held_by(awaits_first: bool) -> str | None:
        inside, looked = threading.Event(), threading.Event()
        seen: list[str | None] = []

        def blocking_client() -> None:
            inside.set()
            looked.wait(10)  # holds the loop, as a blocking client would

        async def body(state: dict[str, Any]) -> None:
            if awaits_first:
                await asyncio.sleep(0)
            blocking_client()

        def watch(thread: int) -> None:
            if inside.wait(10):
                seen.append(executing_node(sys._current_frames()[thread]))
            looked.set()

        watcher = threading.Thread(target=watch, args=(threading.get_ident(),))
        watcher.start()
        wf = Workflow("held")
        wf.node("the_node", body).edge(START, "the_node")
        records_of(wf)
        watcher.join(10)
        return seen[0] if seen else None

    assert held_by(awaits_first=False) == "the_node"
    assert held_by(awaits_first=True) == "the_node"
    assert executing_node(sys._current_frames()[threading.get_ident()]) is None


def test_sync_node_past_its_timeout_is_abandoned_with_a_clear_record() -> None:
    release = threading.Event()

    def stuck(state: dict[str, Any]) -> None:
        release.wait(10)

    wf = Workflow("sync-timeout")
    wf.node("stuck", stuck, timeout="0.3s").edge(START, "stuck")
    t0 = time.perf_counter()
    result, _ = records_of(wf)
    release.set()
    assert time.perf_counter() - t0 < 2
    assert result.status == "FAILED"
    assert "worker thread was abandoned" in result.error["message"]


def test_a_bodys_own_timeout_error_is_its_failure_not_the_engines_timeout() -> None:
    """A node whose code raises TimeoutError (an upstream call timing out) failed with the
    engine's "timed out after 300s", and a sync node's thread was counted as abandoned
    (which makes the CLI exit with os._exit)."""
    from interlock._engine import _guards

    async def upstream_async(state: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        raise TimeoutError("upstream did not answer in 2s")

    def upstream_sync(state: dict[str, Any]) -> None:
        raise TimeoutError("upstream did not answer in 2s")

    async def before_any_await(state: dict[str, Any]) -> None:
        raise TimeoutError("upstream did not answer in 2s")

    abandoned = _guards.abandoned
    for body in (upstream_async, upstream_sync, before_any_await):
        wf = Workflow("own-timeout")
        wf.node("call", body).edge(START, "call")
        result, recs = records_of(wf)
        assert result.status == "FAILED", body
        message = result.error["message"]
        assert "upstream did not answer in 2s" in message, (body, message)
        assert "timed out after" not in message, (body, message)
        [failed] = [r for r in recs if r["type"] == "node.failed"]
        assert failed["error"]["details"]["exception"] == "TimeoutError", failed
    assert _guards.abandoned == abandoned  # no thread was left behind


def test_retry_errors_timeouterror_covers_the_engines_timeout_and_the_bodys_own() -> None:
    attempts: list[int] = []

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(5)  # the engine's timeout
        if ctx.attempt == 2:
            raise TimeoutError("upstream")  # the body's own
        return {"ok": True}

    wf = Workflow("retry-timeouts")
    wf.node("flaky", flaky, timeout="0.2s",
            retry={"attempts": 3, "backoff": "0s", "errors": ["TimeoutError"]})
    wf.edge(START, "flaky")
    result, _ = records_of(wf)
    assert result.status == "COMPLETED", result.error
    assert attempts == [1, 2, 3]


# -- retries ------------------------------------------------------------------------


def test_failing_twice_then_succeeding_under_three_attempts() -> None:
    attempts: list[int] = []

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return {"ok": ctx.idempotency_key}

    wf = Workflow("retry")
    wf.node("flaky", flaky, retry={"attempts": 3, "backoff": "10ms",
                                   "errors": ["ConnectionError"]})
    wf.edge(START, "flaky")
    seen_status: list[str] = []
    recs: list[dict[str, Any]] = []

    def listen(rec: dict[str, Any], view: Any) -> None:
        recs.append(rec)
        if rec["type"] == "node.retrying":
            seen_status.append(view.status)

    result = wf.run_sync(store="memory://", run_id="r", listener=listen)
    assert result.status == "COMPLETED"
    assert attempts == [1, 2, 3]
    assert result.state["ok"] == "r:flaky:1"  # the same key on every attempt
    retrying = [r for r in recs if r["type"] == "node.retrying"]
    assert [r["attempt"] for r in retrying] == [1, 2]
    assert "attempt 1 failed" in retrying[0]["error"]["message"]
    assert [r["delay_ms"] for r in retrying] == [10.0, 20.0]  # exponential backoff
    assert [r["attempt"] for r in recs if r["type"] == "node.started"] == [1, 2, 3]
    assert seen_status == ["RETRYING", "RETRYING"]  # the run is visibly retrying


def test_a_retrying_run_says_so() -> None:
    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("down")

    wf = Workflow("retrying")
    wf.node("flaky", flaky, retry={"attempts": 2, "backoff": "50ms"}).edge(START, "flaky")
    statuses: list[str] = []
    result = wf.run_sync(store="memory://",
                         listener=lambda r, v: statuses.append(v.status))
    assert "RETRYING" in statuses and result.status == "COMPLETED"


def test_non_retryable_errors_fail_at_once() -> None:
    attempts: list[int] = []

    async def broken(state: dict[str, Any], ctx: interlock.Context) -> None:
        attempts.append(ctx.attempt)
        raise ValueError("bad input")

    wf = Workflow("no-retry")
    wf.node("broken", broken, retry={"attempts": 5, "errors": ["ConnectionError"]})
    wf.edge(START, "broken")
    result, _ = records_of(wf)
    assert result.status == "FAILED" and attempts == [1]


def test_retry_matches_exception_subclasses_by_name() -> None:
    attempts: list[int] = []

    async def refused(state: dict[str, Any], ctx: interlock.Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionRefusedError("nope")  # a ConnectionError

    wf = Workflow("retry-sub")
    wf.node("refused", refused, retry={"attempts": 2, "errors": ["ConnectionError"]})
    wf.edge(START, "refused")
    assert records_of(wf)[0].status == "COMPLETED" and attempts == [1, 2]


# -- cancellation within the process -----------------------------------------------------
# The executor runs in the caller's task (no task of its own); these pin what that must
# keep: a caller's cancellation propagates, a cancellation through the store ends the run
# CANCELLED without leaving the caller's task cancelled, and context variables a node
# sets stay in the run.


def _waiting_workflow(name: str, started: asyncio.Event) -> Workflow:
    async def waits(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(30)
        return {"done": True}

    wf = Workflow(name)
    wf.node("w", waits).edge(START, "w")
    return wf


def test_cancelling_the_caller_propagates_and_leaves_the_run_resumable() -> None:
    from interlock._store import open_store

    async def main() -> None:
        store = open_store("memory://")
        started = asyncio.Event()
        wf = _waiting_workflow("caller-cancel", started)
        task = asyncio.create_task(wf.run(store=store, run_id="r1"))
        await started.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        status = await interlock.status("r1", store=store)
        assert status.status == "RUNNING"  # not ours to end: `resume` picks it up
        assert "done" not in status.state

    asyncio.run(main())


def test_a_cancel_through_the_store_ends_the_run_and_not_the_callers_task() -> None:
    from interlock._store import open_store

    async def main() -> None:
        store = open_store("memory://")
        started = asyncio.Event()
        wf = _waiting_workflow("store-cancel", started)
        task = asyncio.create_task(wf.run(store=store, run_id="r2"))
        await started.wait()
        await interlock.cancel("r2", by="ops", store=store, wait=5)
        result = await task  # returns: the cancellation was the run's, not the caller's
        assert result.status == "CANCELLED"
        assert result.error is not None and "ops" in result.error["message"]
        assert task.cancelling() == 0

    asyncio.run(main())


def test_a_cancelled_node_is_recorded_as_stopped_with_the_tokens_it_spent() -> None:
    from interlock._store import open_store

    async def main() -> None:
        store = open_store("memory://")
        started = asyncio.Event()

        async def spends(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
            ctx.record_tokens(40)  # spent, then the run is cancelled under it
            started.set()
            await asyncio.sleep(30)
            return {"done": True}

        wf = Workflow("cancel-tokens")
        wf.node("w", spends).edge(START, "w")  # alone: it runs inline, not as a task
        task = asyncio.create_task(wf.run(store=store, run_id="r3"))
        await started.wait()
        await interlock.cancel("r3", by="ops", store=store, wait=5)
        result = await task
        assert result.status == "CANCELLED" and result.tokens == 40
        recs = await interlock.trace("r3", store=store)
        [stopped] = [r for r in recs if r["type"] == "node.failed"]
        assert stopped["node"] == "w" and stopped["error"]["type"] == "cancelled"
        assert stopped["tokens"] == 40
        assert (await interlock.verify("r3", store=store)).ok

    asyncio.run(main())


def test_context_variables_a_node_sets_stay_in_the_run() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")
    seen: list[str] = []

    async def sets(state: dict[str, Any]) -> None:
        var.set("node")

    async def reads(state: dict[str, Any]) -> None:
        seen.append(var.get())

    wf = Workflow("ctxvars")
    wf.node("sets", sets).node("reads", reads).edge(START, "sets").edge("sets", "reads")

    async def main() -> None:
        result = await wf.run(store="memory://")
        assert result.status == "COMPLETED"
        assert var.get() == "caller"  # the run's context is a copy of the caller's

    asyncio.run(main())
    assert seen == ["node"]  # ... shared by the run's nodes, as one task's would be


def test_a_long_run_of_nodes_that_never_wait_lets_other_tasks_run() -> None:
    # With the in-memory store nothing in a run of trivial nodes ever suspends; the
    # executor still gives the event loop a turn now and then (a server, a heartbeat,
    # a cancellation watcher sharing the loop must not stall for the whole run).
    async def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"i": state["i"] + 1}

    wf = Workflow("busy-loop")
    wf.node("step", step).edge(START, "step")
    wf.edge("step", "step", when="i < 640").edge("step", "END", otherwise=True)

    async def main() -> int:
        ticks = 0
        stop = False

        async def ticker() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        result = await wf.run({"i": 0}, store="memory://")
        during = ticks - before
        stop = True
        await task
        assert result.status == "COMPLETED" and result.state["i"] == 640
        return during

    assert asyncio.run(main()) >= 5


def test_the_cli_exits_after_a_run_without_waiting_for_an_abandoned_thread(
        tmp_path: Path) -> None:
    # a sync node past its timeout keeps its thread (it cannot be interrupted); the run
    # has failed and said so, and the process exits at once instead of waiting the
    # minutes the body still sleeps
    (tmp_path / "stuck_nodes.py").write_text(
        "import time\n\ndef stuck(state):\n    time.sleep(600)\n    return {}\n")
    (tmp_path / "wf.yaml").write_text(
        "workflow: stuck\nnodes:\n  stuck: {call: stuck_nodes:stuck, timeout: 0.2s}\n"
        "edges:\n  - {from: START, to: stuck}\n  - {from: stuck, to: END}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "interlock", "run", "wf.yaml", "--json",
         "--store", f"sqlite:///{tmp_path / 'runs.db'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["status"] == "FAILED"
