"""LangGraph's side of bench/conversation.py: ``python langgraph_conversation.py TURNS``.

Runs with bench/.venv-langgraph/bin/python. The same conversation as interlock's, built
the way a LangGraph user would: a ``MessagesState`` graph with a durable checkpointer
(``AsyncSqliteSaver`` on a file, one thread per conversation), a model node that answers
at once (no provider), a tools node, and the workflow compiled as a graph of its own
that the ``run_triage`` tool invokes. Each turn is one ``await graph.ainvoke`` of the
user's message on the thread. Prints one JSON line per turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph


class Triage(TypedDict, total=False):
    service: str
    checked: str
    summary: str
    report: str


async def check(state: Triage) -> dict[str, Any]:
    return {"checked": state["service"]}


async def summarize(state: Triage) -> dict[str, Any]:
    return {"summary": f"{state['checked']} ok"}


async def report(state: Triage) -> dict[str, Any]:
    return {"report": state["summary"]}


def triage_graph() -> Any:
    g = StateGraph(Triage)
    g.add_node("check", check)
    g.add_node("summarize", summarize)
    g.add_node("report", report)
    g.add_edge(START, "check")
    g.add_edge("check", "summarize")
    g.add_edge("summarize", "report")
    g.add_edge("report", END)
    return g.compile()


def chat_graph(saver: Any, triage: Any) -> Any:
    calls = [0]

    async def model(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage) and "triage" in str(last.content):
            calls[0] += 1
            return {"messages": [AIMessage(content="", tool_calls=[{
                "name": "run_triage", "args": {"service": "db"}, "id": f"call_{calls[0]}"}])]}
        return {"messages": [AIMessage(content="ok")]}

    async def tools(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[attr-defined]
        result = await triage.ainvoke({"service": call["args"]["service"]})
        return {"messages": [ToolMessage(content=json.dumps(result),
                                         tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


async def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "lg.db")) as saver:
            graph = chat_graph(saver, triage_graph())
            for i in range(5):  # imports, the saver's first statements
                await graph.ainvoke({"messages": [HumanMessage(content=f"warm-up {i}")]},
                                    {"configurable": {"thread_id": "warmup"}})
            for i in range(turns):  # the two conversations' turns alternate
                for kind in ("plain", "workflow_tool") if i % 2 else ("workflow_tool",
                                                                      "plain"):
                    config = {"configurable": {"thread_id": f"conv-{kind}"}}
                    text = f"run the triage {i}" if kind == "workflow_tool" else f"hello {i}"
                    t0 = time.perf_counter()
                    out = await graph.ainvoke({"messages": [HumanMessage(content=text)]},
                                              config)
                    ms = (time.perf_counter() - t0) * 1000
                    assert out["messages"][-1].content == "ok"
                    print(json.dumps({"engine": "langgraph", "kind": kind, "turn": i + 1,
                                      "ms": round(ms, 3)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
