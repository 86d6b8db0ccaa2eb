"""Each guard of the node call alone (`interlock._engine._guards`): a fake next call, no engine."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from interlock._definition._model import RetrySpec
from interlock._engine import _guards as G
from interlock._engine._budget import Budget
from interlock._engine._context import Context, PauseRequested
from interlock._errors import BudgetExceededError, NodeError, NodeTimeout, RouteError, RunError


def node(name: str = "n", *, timeout: float = 5.0, is_async: bool = True,
         retry: RetrySpec | None = None, tokens: int | None = None,
         fn: Callable[..., Any] | None = None, wants_ctx: bool = False) -> Any:
    spec = SimpleNamespace(retry=retry, isolation=None, tokens=tokens, call=None, memory=None,
                           executor=None)
    return SimpleNamespace(name=name, timeout=timeout, is_async=is_async, spec=spec, fn=fn,
                           wants_ctx=wants_ctx)


class Port:
    run_id = "run1"
    config: ClassVar[dict[str, Any]] = {}

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget

    def charge_tokens(self, ctx: Context, n: int) -> None:
        assert self.budget is not None
        self.budget.charge(ctx, n)

    def node_args(self, node: str) -> dict[str, Any]:
        return {}


def attempt(pn: Any, number: int = 1, *, ctx: Context | None = None,
            state: dict[str, Any] | None = None) -> G.Attempt:
    return G.attempt_of(pn, 1, number, state or {}, ctx)


def outcome(a: G.Attempt, **kw: Any) -> G.Outcome:
    return G.Outcome(a.pn.name, a.visit, a.number, **kw)


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro
    return asyncio.run(main())


def plain_check(pn: Any, result: Any) -> tuple[dict[str, Any], str | None]:
    return dict(result or {}), None


# -- Settle: what the body did, as an outcome -------------------------------------------


class GuardPort:
    """A fake `G.GuardPort`: each guard takes what it calls from it."""

    def __init__(self, *, check: Any = plain_check, stopped: list[G.Attempt] | None = None,
                 sink: Any = None, pool: Any = None, effects: Any = None) -> None:
        self.check_result = check
        self.attempt_stopped = (stopped if stopped is not None else []).append
        self.sink = sink
        self.failures = lambda node, visit, item: None
        self.process_pool = pool
        self.effects = effects

    def begin(self, pn: Any, visit: int, number: int, item: int | None = None) -> G.Attempt:
        return G.attempt_of(pn, visit, number, {}, None)


def settle(body: Callable[[G.Attempt], Awaitable[Any]],
           stopped: list[G.Attempt] | None = None, check: Any = plain_check) -> G.Settle:
    return G.Settle(body, GuardPort(check=check, stopped=stopped))


def test_settle_turns_a_result_into_a_checked_update() -> None:
    async def body(a: G.Attempt) -> Any:
        return {"x": 1}

    out = run(settle(body)(attempt(node())))
    assert (out.node, out.visit, out.attempt) == ("n", 1, 1)
    assert out.update == {"x": 1} and out.error is None and out.pause is None
    assert out.duration_ms >= 0 and out.tokens == 0


@pytest.mark.parametrize("raised, kind, text", [
    (ValueError("bad"), NodeError, "node 'n' raised ValueError: bad"),
    (SystemExit(3), NodeError, "node 'n' raised SystemExit: 3"),
    (NodeTimeout(), NodeError, "node 'n' timed out after 5s"),
    (RouteError("no such target", node="n"), RouteError, "no such target"),
])
def test_settle_makes_what_the_body_raised_its_error(raised: BaseException, kind: type,
                                                     text: str) -> None:
    async def body(a: G.Attempt) -> Any:
        raise raised

    out = run(settle(body)(attempt(node())))
    assert isinstance(out.error, kind) and out.update is None
    assert str(out.error).startswith(text)


def test_settle_makes_a_refused_result_the_error() -> None:
    def check(pn: Any, result: Any) -> Any:
        raise RouteError("goto nowhere", node=pn.name)

    async def body(a: G.Attempt) -> Any:
        return {"x": 1}

    out = run(settle(body, check=check)(attempt(node())))
    assert isinstance(out.error, RouteError) and out.update is None


def test_settle_keeps_a_request_for_a_human() -> None:
    async def body(a: G.Attempt) -> Any:
        raise PauseRequested("delete", {"what": "all"})

    out = run(settle(body)(attempt(node())))
    assert out.error is None and out.pause is not None and out.pause.key == "delete"


def test_settle_a_cancellation_asked_for_stops_the_visit_and_propagates() -> None:
    stopped: list[G.Attempt] = []
    entered = asyncio.Event()

    async def body(a: G.Attempt) -> Any:
        entered.set()
        await asyncio.sleep(30)

    async def main() -> None:
        a = attempt(node())
        task = asyncio.create_task(settle(body, stopped)(a))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stopped == [a]

    asyncio.run(main())


def test_settle_a_bodys_own_cancellation_is_its_failure() -> None:
    stopped: list[G.Attempt] = []

    async def body(a: G.Attempt) -> Any:
        raise asyncio.CancelledError()

    out = run(settle(body, stopped)(attempt(node())))
    assert isinstance(out.error, NodeError) and "CancelledError" in str(out.error)
    assert stopped == []


# -- where the body runs, under its timeout -----------------------------------------------


def test_in_loop_lets_a_body_that_never_waits_return() -> None:
    async def body(state: dict[str, Any]) -> Any:
        return {"fast": True}

    pn = node(fn=body, timeout=0.01)
    assert run(G.in_loop(attempt(pn))) == {"fast": True}


def test_in_loop_stops_a_body_past_its_deadline() -> None:
    async def body(state: dict[str, Any]) -> Any:
        await asyncio.sleep(30)

    pn = node(fn=body, timeout=0.05)
    with pytest.raises(NodeTimeout):
        run(G.in_loop(attempt(pn)))


@pytest.mark.parametrize("is_async", [True, False])
def test_a_bodys_own_timeout_error_is_left_alone(is_async: bool) -> None:
    async def body(state: dict[str, Any]) -> Any:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(30)

    def sync_body(state: dict[str, Any]) -> Any:
        raise TimeoutError("the body's own")

    pn = node(fn=body if is_async else sync_body, timeout=30, is_async=is_async)
    before = G.abandoned
    with pytest.raises(TimeoutError) as info:
        run((G.in_loop if is_async else G.in_thread)(attempt(pn)))
    assert not isinstance(info.value, NodeTimeout) and G.abandoned == before


def test_in_thread_past_its_deadline_abandons_the_thread() -> None:
    release = threading.Event()

    def body(state: dict[str, Any]) -> Any:
        release.wait(5)

    pn = node(fn=body, timeout=0.05, is_async=False)
    before = G.abandoned
    try:
        with pytest.raises(NodeTimeout):
            run(G.in_thread(attempt(pn)))
        assert G.abandoned == before + 1
    finally:
        release.set()


def test_in_thread_runs_a_sync_body_on_interlocks_threads_in_the_visits_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def body(state: dict[str, Any], ctx: Any) -> Any:
        return {"thread": threading.current_thread().name, "var": var.get(),
                "x": state["x"], "ctx": ctx}

    async def main() -> Any:
        var.set("visit's")
        return await G.in_thread(attempt(node(fn=body, wants_ctx=True, is_async=False),
                                         state={"x": 1}, ctx=None))

    got = asyncio.run(main())
    assert got["thread"].startswith("interlock-node") and got["var"] == "visit's"
    assert got["x"] == 1 and got["ctx"] is None


def test_in_loop_passes_the_context_only_to_a_body_that_takes_it() -> None:
    async def with_ctx(state: dict[str, Any], ctx: Any) -> Any:
        return ctx

    async def without(state: dict[str, Any]) -> Any:
        return state

    ctx = Context(Port(), "n", 1, 1)
    assert run(G.in_loop(attempt(node(fn=with_ctx, wants_ctx=True), ctx=ctx))) is ctx
    assert run(G.in_loop(attempt(node(fn=without), state={"a": 1}))) == {"a": 1}


def test_in_process_hands_the_call_to_the_pool_with_the_nodes_limits() -> None:
    calls: list[dict[str, Any]] = []

    class Result:
        def value(self, name: str) -> Any:
            return {"from": name}

    class Pool:
        async def call(self, call: str, state: dict[str, Any], child: Any, **kw: Any) -> Any:
            calls.append({"call": call, "state": state, "node": child.node, **kw})
            return Result()

    pn = node(timeout=7)
    pn.spec.call, pn.spec.memory = "pkg.mod:fn", 256
    ctx = Context(Port(), "n", 1, 1)
    effects = object()
    body = G.InProcess(GuardPort(pool=lambda: Pool(), effects=lambda c: effects))
    assert run(body(attempt(pn, ctx=ctx, state={"a": 1}))) == {"from": "n"}
    assert calls == [{"call": "pkg.mod:fn", "state": {"a": 1}, "node": "n", "timeout": 7,
                      "memory": 256, "on_tokens": ctx.record_tokens, "effects": effects}]


# -- Budgeted --------------------------------------------------------------------------


def budget(*, tokens: int | None = None, run_tokens: int | None = None) -> Budget:
    plan = SimpleNamespace(nodes={"n": node(tokens=tokens)})
    view = SimpleNamespace(running={}, limits={"tokens": run_tokens} if run_tokens else {},
                           tokens=0)
    return Budget(plan, view, "run1")  # type: ignore[arg-type]


def test_budgeted_keeps_the_attempt_in_flight_while_it_runs() -> None:
    b = budget(run_tokens=100)
    seen: list[int] = []

    async def next_call(a: G.Attempt) -> G.Outcome:
        seen.append(len(b._inflight))
        return outcome(a, update={"x": 1})

    ctx = Context(Port(b), "n", 1, 1)
    out = run(G.Budgeted(next_call, b)(attempt(node(), ctx=ctx)))
    assert seen == [1] and not b._inflight and out.update == {"x": 1}


def test_budgeted_fails_an_attempt_over_a_budget_the_body_swallowed() -> None:
    b = budget(tokens=10)

    async def next_call(a: G.Attempt) -> G.Outcome:
        assert a.ctx is not None
        with pytest.raises(BudgetExceededError):
            a.ctx.record_tokens(11)
        return outcome(a, update={"x": 1}, goto="m", tokens=a.ctx.tokens)

    ctx = Context(Port(b), "n", 1, 1)
    out = run(G.Budgeted(next_call, b)(attempt(node(), ctx=ctx)))
    assert isinstance(out.error, BudgetExceededError) and out.error.details["scope"] == "node"
    assert out.update is None and out.goto is None and out.tokens == 11
    assert ctx.tokens == 11 and ctx.spent.unsaved == 11


def test_budgeted_does_not_run_an_attempt_whose_budget_is_spent() -> None:
    b = budget(tokens=10)
    b._view.running[("n", 1)] = SimpleNamespace(tokens=12)  # earlier attempts spent it
    called: list[G.Attempt] = []

    async def next_call(a: G.Attempt) -> G.Outcome:
        called.append(a)
        return outcome(a)

    out = run(G.Budgeted(next_call, b)(attempt(node(), 2, ctx=Context(Port(b), "n", 1, 2))))
    assert called == [] and isinstance(out.error, BudgetExceededError)
    assert (out.node, out.visit, out.attempt) == ("n", 1, 2)


def test_budget_counts_the_run_across_attempts_in_flight() -> None:
    b = budget(run_tokens=100)
    one, two = Context(Port(b), "n", 1, 1), Context(Port(b), "n", 2, 1)
    b.enter(one)
    b.enter(two)
    one.record_tokens(60)
    with pytest.raises(BudgetExceededError) as info:
        two.record_tokens(41)
    assert info.value.details["scope"] == "run" and info.value.details["used"] == 101
    assert two.spent.over is info.value and one.spent.over is None


# -- Retry -----------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    async def commit(self, items: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        self.records.extend(items)
        return []


def retrier(errors: list[RunError | None], retry: RetrySpec
            ) -> tuple[G.Retry, Sink, list[int]]:
    sink = Sink()
    attempts: list[int] = []

    async def next_call(a: G.Attempt) -> G.Outcome:
        attempts.append(a.number)
        return outcome(a, error=errors[len(attempts) - 1], duration_ms=1.5)

    return G.Retry(next_call, GuardPort(sink=sink)), sink, attempts


def test_retry_runs_attempts_until_one_succeeds_each_a_record() -> None:
    boom = NodeError("boom", node="n", exception="ValueError", mro=["ValueError"])
    retry, sink, attempts = retrier([boom, boom, None], RetrySpec(attempts=3))
    pn = node(retry=RetrySpec(attempts=3))
    out = run(retry(attempt(pn)))
    assert out.error is None and out.attempt == 3 and attempts == [1, 2, 3]
    assert [t for t, _ in sink.records] == ["node.retrying", "node.started"] * 2
    assert sink.records[0][1] == {"node": "n", "visit": 1, "attempt": 1,
                                  "error": boom.to_json(), "duration_ms": 1.5,
                                  "delay_ms": 0.0}
    assert sink.records[1][1] == {"node": "n", "visit": 1, "attempt": 2}


def test_retry_gives_up_after_its_attempts() -> None:
    boom = NodeError("boom", node="n", exception="ValueError", mro=["ValueError"])
    retry, sink, attempts = retrier([boom, boom, boom], RetrySpec(attempts=2))
    out = run(retry(attempt(node(retry=RetrySpec(attempts=2)))))
    assert out.error is boom and attempts == [1, 2] and len(sink.records) == 2


@pytest.mark.parametrize("error, errors", [
    (RouteError("bad goto", node="n"), []),  # never retried
    (NodeError("boom", node="n", exception="KeyError", mro=["KeyError", "LookupError"]),
     ["ValueError"]),  # not one of the errors retried
])
def test_retry_does_not_retry_what_it_must_not(error: RunError, errors: list[str]) -> None:
    spec = RetrySpec(attempts=3, errors=errors)
    retry, sink, attempts = retrier([error], spec)
    out = run(retry(attempt(node(retry=spec))))
    assert out.error is error and attempts == [1] and sink.records == []


def test_retry_matches_errors_along_the_mro() -> None:
    error = NodeError("boom", node="n", exception="KeyError", mro=["KeyError", "LookupError"])
    spec = RetrySpec(attempts=2, errors=["LookupError"])
    retry, _, attempts = retrier([error, None], spec)
    assert run(retry(attempt(node(retry=spec)))).error is None and attempts == [1, 2]


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [G.backoff(0.5, 1.5, False, n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, 1.5]
    assert 0 <= G.backoff(1.0, None, True, 3) <= 4.0
