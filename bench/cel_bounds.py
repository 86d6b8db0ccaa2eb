"""The bounds on evaluation, measured: CEL worst cases and hostile prompt templates.

    python bench/cel_bounds.py            # the table (about a minute)
    python bench/cel_bounds.py --quick    # fewer repetitions

For each CEL case: the estimated cost (interlock._definition._cost), whether the engine admits it
under INTERLOCK_MAX_EXPRESSION_COST, and the milliseconds per evaluation (median of
several) -- of the evaluation itself for an admitted case (what the run pays), of the
refusal for a refused one (the estimate). The values are the largest the documented
limits allow (a run input of INPUT_BYTES, an expression of 1000 characters) or sized to
sit just under the cost limit. Then the hostile Jinja2 templates: time to refusal.

Not a test: CI never runs it. Separate from bench/hardening.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from interlock._definition._expr import EvaluationError, ExpressionCostError, compile_expression
from interlock._definition._limits import EXPRESSION_COST

MiB = 1024 * 1024


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    ints_4m = list(range(550_000))  # ~4 MiB as JSON
    strs_4m = ["abcdef"] * 450_000  # ~4 MiB as JSON
    s_4m = "a" * (4 * MiB - 16)
    chain = "size(" + " + ".join(["s"] * 240) + ") > 0"  # < 1000 characters
    return [
        ("all(x in biglist), 200k", "biglist.all(x, x in biglist)",
         {"biglist": list(range(200_000))}),
        ("map(s + s), 200k", "size(biglist.map(x, s + s)) > 0",
         {"biglist": list(range(200_000)), "s": "x" * 1000}),
        ("size(list) ints 4 MiB", "size(xs) > 0", {"xs": ints_4m}),
        ("size(list) strs 4 MiB", "size(xs) > 0", {"xs": strs_4m}),
        ("all ints, 40k", "xs.all(x, x >= 0)", {"xs": list(range(40_000))}),
        ("all(x in xs), 400", "xs.all(x, x in xs)", {"xs": list(range(400))}),
        ("all(x in xs), 2000", "xs.all(x, x in xs)", {"xs": list(range(2000))}),
        ("map, 1000", "size(xs.map(x, x + 1)) > 0", {"xs": list(range(1000))}),
        ("filter, 1000", "size(xs.filter(x, x >= 0)) > 0", {"xs": list(range(1000))}),
        ("map, 4000", "size(xs.map(x, x + 1)) > 0", {"xs": list(range(4000))}),
        ("map(s + s), 100 x 4000 chars", "size(xs.map(x, s + s)) > 0",
         {"xs": list(range(100)), "s": "a" * 4000}),
        ("s.matches, 4 MiB", "s.matches('(a|aa)*c')", {"s": s_4m}),
        ("size(s + s), 4 MiB", "size(s + s) > 0", {"s": s_4m}),
        ("size(s + ... + s) x240, 4 MiB", chain, {"s": s_4m}),
        ("size(s + ... + s) x240, 16 KiB", chain, {"s": "a" * 16384}),
        ("dicts.all(x.a >= 0), 10k", "xs.all(x, x.a >= 0 && x.b != '')",
         {"xs": [{"a": i, "b": "xy"} for i in range(10_000)]}),
        ("plain: i < 1000", "i < 1000", {"i": 5}),
    ]


def cel_table(reps: int) -> list[tuple[str, str, str, str]]:
    limit = EXPRESSION_COST.get()
    rows = []
    for label, source, ctx in cases():
        expr = compile_expression(source)
        assert expr.cost is not None
        est, _ = expr.cost.estimate(ctx, 10**15)
        times = []
        verdict = "admitted"
        for _ in range(reps):
            t0 = time.perf_counter()
            try:
                expr.evaluate(ctx)
            except ExpressionCostError:
                verdict = "refused"
            except EvaluationError as exc:
                verdict = f"error: {exc}"
            times.append((time.perf_counter() - t0) * 1000)
        rows.append((label, f"{est:_}", verdict, f"{statistics.median(times):.2f}"))
        print(f"  {label}: {rows[-1][1:]} (limit {limit:_})", file=sys.stderr)
    return rows


HOSTILE = {
    "nested range(100000) loops": "{% for a in range(100000) %}{% for b in range(100000) %}"
                                  "x{% endfor %}{% endfor %}",
    "10 ** 10000000": "{{ 10 ** 10000000 }}",
    "'x' * 1000000000": "{{ 'x' * 1000000000 }}",
    "1 MiB + 1 of output": "{% for a in range(1100) %}{% for b in range(1000) %}x"
                           "{% endfor %}{% endfor %}",
}


def jinja_table() -> list[tuple[str, str, str]]:
    import asyncio

    from interlock.agents._prompt import compile_template, render, render_in_thread

    rows = []
    for label, source in HOSTILE.items():
        t = compile_template(source)
        t0 = time.perf_counter()
        try:
            asyncio.run(render_in_thread(render, t, {}))
            outcome = "rendered (!)"
        except Exception as exc:
            outcome = str(exc)[:70]
        rows.append((label, f"{(time.perf_counter() - t0) * 1000:.0f}", outcome))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    reps = 2 if ap.parse_args().quick else 5
    rows = cel_table(reps)
    w = max(len(r[0]) for r in rows)
    print(f"CEL (limit INTERLOCK_MAX_EXPRESSION_COST={EXPRESSION_COST.get():_} units)")
    print(f"{'case':{w}}  {'estimated cost':>22}  {'verdict':9}  ms/eval")
    for label, est, verdict, ms in rows:
        print(f"{label:{w}}  {est:>22}  {verdict:9}  {ms:>7}")
    admitted = [float(r[3]) for r in rows if r[2] == "admitted"]
    print(f"worst admitted evaluation: {max(admitted):.1f} ms")
    print()
    print("Jinja2 hostile templates (defaults)")
    jrows = jinja_table()
    w = max(len(r[0]) for r in jrows)
    for label, ms, outcome in jrows:
        print(f"{label:{w}}  {ms:>6} ms  {outcome}")


if __name__ == "__main__":
    main()
