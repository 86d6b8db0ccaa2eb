"""OpenTelemetry spans (SPEC §10): the span tree and attributes of real runs, exported to
the SDK's in-memory exporter in a process of their own (a tracer provider is set once
per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

SCRIPT = textwrap.dedent('''
    import asyncio, json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    import interlock
    from interlock import END, START, Workflow
    from interlock.testing import ScriptedProvider

    tries = {"n": 0}

    async def plan(state):
        return {"xs": [1, 2]}

    async def flaky(state):
        tries["n"] += 1
        if tries["n"] < 2:
            raise ConnectionError("try again")
        return {"ok": True}

    async def double(state):
        return {"d": state["x"] * 2}

    wf = Workflow("traced", state={"d": "append"})
    wf.node("plan", plan)
    wf.node("flaky", flaky, retry={"attempts": 2})
    wf.node("double", double)
    wf.agent("ask", prompt="Summarise.", provider=ScriptedProvider([
        {"content": "done", "usage": {"prompt_tokens": 12, "completion_tokens": 5}}]))
    wf.approval("gate", show=["ok"])
    wf.node("after", plan)
    wf.edge(START, "plan").edge("plan", "flaky")
    wf.map("plan", "xs", "double", as_="x")
    wf.edge(["flaky", "double"], "ask").edge("ask", "gate")
    wf.edge("gate", "after", when='gate.decision == "approved"').edge("after", END)

    async def main():
        async with interlock.open_store("sqlite:///" + sys.argv[1]) as store:
            first = await wf.run({}, store=store)
            done = await wf.resume(first.run_id, interlock.approve(by="alice"), store=store)
            started = (await interlock.trace(first.run_id, store=store))[0]
            return first.status, done.status, started.get("trace")

    statuses = asyncio.run(main())
    provider.shutdown()
    spans = [{"name": s.name, "id": f"{s.context.span_id:016x}",
              "trace": f"{s.context.trace_id:032x}",
              "parent": f"{s.parent.span_id:016x}" if s.parent else None,
              "attrs": dict(s.attributes), "status": s.status.status_code.name,
              "events": [e.name for e in s.events],
              "links": [f"{l.context.span_id:016x}" for l in s.links],
              "start": s.start_time, "end": s.end_time} for s in exporter.get_finished_spans()]
    print(json.dumps({"statuses": statuses, "spans": spans}))
''')


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("otel")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp / "runs.db")], cwd=tmp,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_a_run_is_a_span_with_a_child_per_node_attempt(traced: dict[str, Any]) -> None:
    spans = traced["spans"]
    assert traced["statuses"][:2] == ["WAITING_APPROVAL", "COMPLETED"]
    first, resumed = named(spans, "interlock.run traced")
    # the trace id is in run.started; the resumed execution links to the first span
    assert traced["statuses"][2] == {"trace_id": first["trace"], "span_id": first["id"]}
    assert resumed["links"] == [first["id"]]
    assert first["attrs"]["interlock.status"] == "WAITING_APPROVAL"
    assert resumed["attrs"]["interlock.status"] == "COMPLETED"
    plan = named(spans, "interlock.node plan")[0]
    assert plan["parent"] == first["id"]
    assert plan["attrs"]["interlock.node"] == "plan"
    assert plan["attrs"]["interlock.workflow"] == "traced"
    assert plan["attrs"]["interlock.status"] == "completed"
    assert plan["start"] <= plan["end"]
    # edge decisions are events of the run's span (the gate's condition)
    assert "edge.taken" in resumed["events"]


def test_a_retry_is_two_attempt_spans(traced: dict[str, Any]) -> None:
    flaky = named(traced["spans"], "interlock.node flaky")
    assert [(s["attrs"]["interlock.attempt"], s["attrs"]["interlock.status"], s["status"])
            for s in flaky] == [(1, "retrying", "ERROR"), (2, "completed", "UNSET")]
    assert flaky[0]["attrs"]["error.type"] == "ConnectionError"


def test_a_mapped_node_is_a_span_with_a_child_per_item(traced: dict[str, Any]) -> None:
    double = named(traced["spans"], "interlock.node double")
    [visit] = [s for s in double if "interlock.item" not in s["attrs"]]
    items = sorted((s for s in double if "interlock.item" in s["attrs"]),
                   key=lambda s: s["attrs"]["interlock.item"])
    assert [s["attrs"]["interlock.item"] for s in items] == [0, 1]
    assert all(s["parent"] == visit["id"] for s in items)
    assert visit["attrs"]["interlock.items"] == 2


def test_an_agent_node_has_gen_ai_attributes_and_a_span_per_model_call(
        traced: dict[str, Any]) -> None:
    [ask] = named(traced["spans"], "interlock.node ask")
    [chat] = [s for s in traced["spans"] if s["name"].startswith("chat")]
    assert chat["parent"] == ask["id"]
    assert chat["attrs"]["gen_ai.operation.name"] == "chat"
    assert chat["attrs"]["gen_ai.system"] == "scripted"
    assert chat["attrs"]["gen_ai.usage.input_tokens"] == 12
    assert chat["attrs"]["gen_ai.usage.output_tokens"] == 5
    assert ask["attrs"]["gen_ai.usage.input_tokens"] == 12
    assert ask["attrs"]["gen_ai.usage.output_tokens"] == 5


def test_without_a_provider_nothing_is_imported_and_no_trace_is_recorded(
        tmp_path: Path) -> None:
    code = textwrap.dedent('''
        import sys, interlock
        from interlock import START, Workflow
        wf = Workflow("plain").node("a", lambda s: {"a": 1})
        wf.edge(START, "a")
        r = wf.run_sync(store="sqlite:///" + sys.argv[1])
        import asyncio
        first = asyncio.run(interlock.trace(r.run_id, store="sqlite:///" + sys.argv[1]))[0]
        print("trace" in first, "opentelemetry" in sys.modules)
    ''')
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.db")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in __import__("os").environ.items()
                              if not k.startswith("OTEL_")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_run_created_first_and_executed_later_is_traced_too(tmp_path: Path) -> None:
    # what a server does: Workflow.start (the run queued), then Started.execute
    code = textwrap.dedent('''
        import asyncio, json, sys
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        import interlock
        from interlock import START, Workflow
        wf = Workflow("queued").node("a", lambda s: {"a": 1})
        wf.edge(START, "a")
        async def main():
            async with interlock.open_store("memory://") as store:
                started = await wf.start({}, store=store)
                result = await started.execute()
                first = (await interlock.trace(result.run_id, store=store))[0]
                return result.status, first.get("trace")
        status, ids = asyncio.run(main())
        spans = [(s.name, f"{s.context.span_id:016x}",
                  f"{s.parent.span_id:016x}" if s.parent else None)
                 for s in exporter.get_finished_spans()]
        print(json.dumps({"status": status, "ids": ids, "spans": spans}))
    ''')
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["status"] == "COMPLETED"
    names = {name: (sid, parent) for name, sid, parent in data["spans"]}
    run_id, _ = names["interlock.run queued"]
    assert data["ids"]["span_id"] == run_id
    assert names["interlock.node a"][1] == run_id


def test_a_refused_start_ends_its_span_with_an_error(tmp_path: Path) -> None:
    """issue 26: `Workflow.start` made the run's span before the store refused the run
    (its id taken) and never ended it; `run` and `Started.execute` ended theirs without
    saying they failed. Every span started is ended, with an error status."""
    code = textwrap.dedent('''
        import asyncio, json, sys
        from opentelemetry import trace
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        opened = []
        class Opened(SpanProcessor):
            def on_start(self, span, parent_context=None):
                opened.append(span.name)
        provider.add_span_processor(Opened())
        trace.set_tracer_provider(provider)
        import interlock
        from interlock import START, Workflow
        wf = Workflow("refused").node("a", lambda s: {"a": 1})
        wf.edge(START, "a")
        async def main():
            out = []
            async with interlock.open_store("memory://") as store:
                await wf.run({}, store=store, run_id="taken")
                for attempt in (wf.start({}, store=store, run_id="taken"),
                                wf.run({}, store=store, run_id="taken")):
                    try:
                        await attempt
                    except interlock.RunExists as exc:
                        out.append(type(exc).__name__)
                queued = await wf.start({}, store=store, run_id="queued")
                await interlock.cancel("queued", store=store)
                try:
                    await queued.execute()
                except interlock.ConflictError as exc:
                    out.append(type(exc).__name__)
            return out
        errors = asyncio.run(main())
        spans = [(s.name, s.status.status_code.name, s.status.description,
                  dict(s.attributes).get("interlock.status"))
                 for s in exporter.get_finished_spans()]
        print(json.dumps({"errors": errors, "opened": opened, "spans": spans}))
    ''')
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["errors"] == ["RunExists", "RunExists", "ConflictError"]
    runs = [s for s in data["spans"] if s[0] == "interlock.run refused"]
    assert len(runs) == data["opened"].count("interlock.run refused") == 4  # none left open
    completed, *refused = runs
    assert completed[1] == "UNSET" and completed[3] == "COMPLETED"
    assert [(status, attr) for _, status, _, attr in refused] == [("ERROR", "REFUSED")] * 3
    assert "RunExists" in refused[0][2] and "ConflictError" in refused[2][2]
