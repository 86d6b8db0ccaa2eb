"""The engine's added latency per conversation turn and per workflow-tool call (SPEC
§11), interlock beside LangGraph, in one run:

    bash bench/setup_langgraph.sh && python bench/conversation.py [--turns N]

The same conversation in both, on a SQLite file, the model answering at once (interlock:
``provider: scripted``; LangGraph: a model node that returns its message): ``plain``
turns (one model call) and ``workflow_tool`` turns (the model calls ``run_triage``, a
3-node workflow run as a child -- interlock: a ``{workflow: ...}`` tool, a child run with
its own log; LangGraph: the workflow compiled as a graph the tool invokes -- then
answers). A turn is ``Workflow.send`` (interlock) or ``graph.ainvoke`` of the user's
message on the conversation's thread (LangGraph), timed end to end in one process. The
added latency of a workflow-tool call is the median ``workflow_tool`` turn less the
median ``plain`` turn. The table shows turns 1-10, 91-100, 191-200, ... (as far as
``--turns`` goes) and the last ten: whether a turn's cost grows with the conversation;
wall time, then interlock's CPU time per turn (the process's, every thread: on a shared
machine the wall time is mostly waiting).

Not a test: it lives outside ``tests/`` and CI never runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LANGGRAPH_PY = HERE / ".venv-langgraph" / "bin" / "python"

CHILD = """
workflow: triage
input: [service]
nodes:
  check: {call: "conv_bench_nodes:check"}
  summarize: {call: "conv_bench_nodes:summarize"}
  report: {call: "conv_bench_nodes:report"}
edges:
  - {from: START, to: check}
  - {from: check, to: summarize}
  - {from: summarize, to: report}
  - {from: report, to: END}
"""
NODES = """
async def check(state):
    return {"checked": state["service"]}

async def summarize(state):
    return {"summary": state["checked"] + " ok"}

async def report(state):
    return {"report": state["summary"]}
"""


def _chat(turns: int, tool: bool) -> str:
    call = {"tool_calls": [{"name": "run_triage", "arguments": {"service": "db"}}]}
    replies: list[Any] = ([call, "ok"] if tool else ["ok"]) * turns
    return textwrap.dedent(f"""
        workflow: conv-bench
        chat: assistant
        limits: {{steps: 1000000}}
        nodes:
          assistant:
            agent:
              provider: scripted
              max_turns: 4
              tools: [{{workflow: triage.yaml, name: run_triage, description: Triage}}]
              replies: {json.dumps(replies)}
        """)


async def _interlock(turns: int, tmp: Path) -> list[dict[str, Any]]:
    import interlock

    (tmp / "triage.yaml").write_text(CHILD)
    (tmp / "conv_bench_nodes.py").write_text(NODES)
    sys.path.insert(0, str(tmp))
    store = interlock.open_store(f"sqlite:///{tmp / 'interlock.db'}")
    out = []
    try:
        convs = {}
        for kind in ("warmup", "plain", "workflow_tool"):
            path = tmp / f"chat-{kind}.yaml"
            path.write_text(_chat(turns, kind == "workflow_tool"))
            wf = interlock.load(path)
            convs[kind] = (wf, (await wf.run({}, store=store)).run_id)
        for i in range(5):  # imports, the store's first statements, the child's plan
            wf, rid = convs["warmup"]
            await wf.send(rid, f"warm-up {i}", store=store)
        for i in range(turns):  # the two conversations' turns alternate
            for kind in ("plain", "workflow_tool") if i % 2 else ("workflow_tool", "plain"):
                wf, rid = convs[kind]
                c0, t0 = time.process_time(), time.perf_counter()
                r = await wf.send(rid, f"message {i}", store=store)
                ms = (time.perf_counter() - t0) * 1000
                cpu = (time.process_time() - c0) * 1000  # (every thread: the store's too)
                assert r.status == "WAITING_INPUT", r.error
                out.append({"engine": "interlock", "kind": kind, "turn": i + 1,
                            "ms": round(ms, 3), "cpu_ms": round(cpu, 3)})
                print(json.dumps(out[-1]), flush=True)
        children = [r for r in await store.list_runs(limit=1_000_000)
                    if r.workflow == "triage"]
        assert len(children) == turns, f"{len(children)} child runs for {turns} tool calls"
    finally:
        await store.close()
    return out


def _langgraph(turns: int) -> list[dict[str, Any]]:
    if not LANGGRAPH_PY.exists():
        print(f"(no {LANGGRAPH_PY}: run bash bench/setup_langgraph.sh for LangGraph's column)",
              file=sys.stderr)
        return []
    proc = subprocess.run([str(LANGGRAPH_PY), str(HERE / "adapters" / "langgraph_conversation.py"),
                           str(turns)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"LangGraph's side failed (is bench/.venv-langgraph complete? bash "
              f"bench/setup_langgraph.sh):\n{proc.stderr}", file=sys.stderr)
        return []
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        print(json.dumps(line), flush=True)
    return lines


def _windows(turns: int) -> list[tuple[int, int]]:
    """The turns a row of the table covers: 1-10, then ten every hundred (91-100,
    191-200, ...) as far as the conversation goes, and its last ten."""
    out = [(1, 10)] + [(k - 9, k) for k in range(100, turns + 1, 100)]
    if (turns - 9, turns) not in out:
        out.append((max(turns - 9, 1), turns))
    return out


def _table(rows: list[dict[str, Any]], turns: int) -> str:
    engines = [e for e in ("interlock", "langgraph") if any(r["engine"] == e for r in rows)]

    def med(engine: str, kind: str, window: tuple[int, int] | None = None,
            key: str = "ms") -> float | None:
        ms = [r[key] for r in rows if r["engine"] == engine and r["kind"] == kind
              and key in r and (window is None or window[0] <= r["turn"] <= window[1])]
        return statistics.median(ms) if ms else None

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} ms"

    lines = [f"| {turns} turns, SQLite file | " + " | ".join(engines) + " |",
             "|---|" + "---|" * len(engines)]
    for key, what in (("ms", ""), ("cpu_ms", "CPU, ")):  # CPU: the process's, all threads
        for label, kind in (("turn, one model call", "plain"),
                            ("turn with a workflow-tool call", "workflow_tool")):
            for a, b in _windows(turns):
                lines.append(f"| {what}{label} (turns {a}-{b}) | " + " | ".join(
                    cell(med(e, kind, (a, b), key)) for e in engines) + " |")
    added = []
    for e in engines:
        x, y = med(e, "workflow_tool"), med(e, "plain")
        added.append(None if x is None or y is None else x - y)
    lines.append("| added by a workflow-tool call (medians, all turns) | "
                 + " | ".join(cell(v) for v in added) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += asyncio.run(_interlock(args.turns, Path(tmp)))
    rows += _langgraph(args.turns)
    print(_table(rows, args.turns))


if __name__ == "__main__":
    main()
