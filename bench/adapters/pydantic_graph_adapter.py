"""pydantic-graph in the benchmark: ``python pydantic_graph_adapter.py SCENARIO PARAMS_JSON``.

Runs with bench/.venv-pydantic-graph/bin/python (made by bench/setup_pydantic_graph.sh,
with pydantic-graph 2.68.0 pinned). Only the scenarios the issue's pydantic-graph target
is about: S1 (a chain) and S3 (a loop), per-node overhead with no persistence. The other
scenarios print a ``skipped`` line (bench/run.py does not start this adapter for them).

Built the way its documentation builds graphs: ``BaseNode`` subclasses whose ``run``
mutates a dataclass state through ``ctx.state`` and returns the next node or ``End``; the
return annotation of ``run`` is what tells the library the edges. The classes go into a
``GraphBuilder`` with ``g.node(...)``, and a start step returns the first node (the
builder's entry point is a step, as in the package README). pydantic-graph 2.x has one
runner, in memory: ``await graph.run(state=...)``; it has no persistence to turn off.
Instrumentation is left at its default (``auto_instrument=True``): without Logfire
installed, its spans go to logfire-api's no-op shim.

A 1000-node chain needs 1000 distinct classes (a node's id is its class name, and its
successor is read from its return annotation), so they are made with ``types.new_class``,
each ``run`` annotated with the class that follows it. They are not dataclasses: the
documentation's nodes are ``@dataclass`` to carry fields, and these have none (a
``dataclasses.make_dataclass`` per node would add ~0.5 ms each to the build, for
generated ``__init__``/``__repr__``/``__eq__`` no one calls).
"""

from __future__ import annotations

import importlib.metadata
import time
import types
from dataclasses import dataclass
from typing import Any

from _common import Emitter, main, per_step_trials
from pydantic_graph import BaseNode, End, Graph, GraphBuilder, GraphRunContext, StepContext

ENGINE = "pydantic-graph"
NOT_MEASURED = ("not measured for pydantic-graph: the issue's target against it is per-node "
                "overhead (S1, S3) with no persistence")


@dataclass
class Counter:
    i: int = 0


# -- graphs ------------------------------------------------------------------------------

def _node_class(name: str, successor: type[BaseNode[Counter, None, int]] | None
                ) -> type[BaseNode[Counter, None, int]]:
    """A node that increments ``i`` and hands over to ``successor`` (``End`` if None)."""
    if successor is None:
        async def run(self: Any, ctx: GraphRunContext[Counter, None]) -> Any:
            ctx.state.i += 1
            return End(ctx.state.i)
        run.__annotations__["return"] = End[int]
    else:
        async def run(self: Any, ctx: GraphRunContext[Counter, None]) -> Any:
            ctx.state.i += 1
            return successor()
        run.__annotations__["return"] = successor
    run.__qualname__ = f"{name}.run"
    return types.new_class(name, (BaseNode[Counter, None, int],),
                           exec_body=lambda ns: ns.update(run=run, __module__=__name__))


def _with_start(g: GraphBuilder[Counter, None, None, int],
                first: type[BaseNode[Counter, None, int]]) -> Any:
    """The builder's start step: returns the first node."""
    async def start(ctx: StepContext[Counter, None, None]) -> Any:
        return first()
    start.__annotations__["return"] = first
    return g.edge_from(g.start_node).to(g.step(start, node_id="start"))


def chain(n: int) -> Graph[Counter, None, None, int]:
    """start -> N0 -> N1 -> ... -> N{n-1} -> End; each node increments ``i``."""
    classes: list[type[BaseNode[Counter, None, int]]] = []
    successor = None
    for k in reversed(range(n)):
        successor = _node_class(f"N{k}", successor)
        classes.append(successor)
    classes.reverse()
    g = GraphBuilder(name=f"chain-{n}", state_type=Counter, output_type=int)
    g.add(_with_start(g, classes[0]), *(g.node(c) for c in classes))
    return g.build()


@dataclass
class Step(BaseNode[Counter, int, int]):
    """S3's node: ``i += 1``, then itself again while ``i < limit`` (the run's deps)."""

    async def run(self, ctx: GraphRunContext[Counter, int]) -> Step | End[int]:
        ctx.state.i += 1
        if ctx.state.i < ctx.deps:
            return Step()
        return End(ctx.state.i)


def loop() -> Graph[Counter, int, None, int]:
    g = GraphBuilder(name="loop", state_type=Counter, deps_type=int, output_type=int)
    g.add(_with_start(g, Step), g.node(Step))
    return g.build()


def _check(out: Any, state: Counter, n: int) -> None:
    if out != n or state.i != n:
        raise RuntimeError(f"expected i == {n}, got output {out!r}, state.i {state.i!r}")


# -- scenarios -----------------------------------------------------------------------------

async def s1(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    chain(2)  # the same warm-up as the other adapters'
    t0 = time.perf_counter()
    graph = chain(n)  # the node classes, the builder and build()
    em.value("build_compile_ms", (time.perf_counter() - t0) * 1000, "ms")

    async def once() -> None:
        state = Counter()
        _check(await graph.run(state=state), state, n)

    await per_step_trials(em, p, once, n, "per_node")


async def s3(em: Emitter, p: dict[str, Any]) -> None:
    n = p["n"]
    graph = loop()

    async def once() -> None:
        state = Counter()
        _check(await graph.run(state=state, deps=n), state, n)

    await per_step_trials(em, p, once, n, "per_iter")


def not_measured(em: Emitter, p: dict[str, Any]) -> None:
    em.skipped("*", NOT_MEASURED)


def _version() -> str:
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in
                     ("pydantic-graph", "pydantic", "anyio", "logfire-api"))


if __name__ == "__main__":
    main(ENGINE, {"S1": s1, "S3": s3, **{s: not_measured for s in ("S2", "S4", "S5", "S6", "S7")}},
         _version)
