"""What tracing costs per node: a 1000-node chain run with OpenTelemetry on (the SDK's
in-memory exporter, every span kept) against off, side by side in one invocation.

    python bench/otel_overhead.py              # ~30 s; needs the otel extra
    python bench/otel_overhead.py --n 200 --trials 5

Each mode runs in a fresh process (a tracer provider is set once per process): `off`
has no provider and does not import OpenTelemetry at all; `on` sets an SDK
`TracerProvider` with a `SimpleSpanProcessor` into an `InMemorySpanExporter`, so each
span is also recorded (a batch processor exporting over the network costs less on the
run's path and more elsewhere). One JSON line per mode ({"bench", "mode", "per_node_us",
"trials"}), then a one-line summary with the ratio. Medians of the trials, in-memory
store, the bench adapter's chain (bench/adapters/interlock_adapter.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parent / "adapters"

CHILD = """
import asyncio, gc, statistics, sys, time
sys.path.insert(0, {adapters!r})
if {on!r}:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
import interlock_adapter as A
wf = A.chain({n})
wf.compile()

async def main():
    times = []
    for k in range({trials} + 1):
        gc.collect()
        t0 = time.perf_counter()
        await wf.run({{"i": 0}}, store="memory://")
        if k:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
        if {on!r}:
            exporter.clear()
    return statistics.median(times)

print(asyncio.run(main()) / ({n} + 0) * 1e6)
"""


def measure(on: bool, n: int, trials: int) -> float:
    code = CHILD.format(adapters=str(ADAPTERS), on=on, n=n, trials=trials)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="nodes in the chain")
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        sys.exit("otel_overhead.py: the otel extra is not installed "
                 "(pip install -e '.[otel]')")
    results = {}
    for mode in ("off", "on"):
        results[mode] = measure(mode == "on", args.n, args.trials)
        print(json.dumps({"bench": "otel_overhead", "mode": mode,
                          "per_node_us": round(results[mode], 2), "trials": args.trials,
                          "n": args.n}))
    print(f"tracing on: {results['on']:.1f} us per node, off: {results['off']:.1f} us per "
          f"node ({results['on'] / results['off']:.2f}x, +{results['on'] - results['off']:.1f} "
          "us per node for its span)")


if __name__ == "__main__":
    main()
