"""examples/triage/assistant.yaml (the on-call assistant, SPEC §11), every branch: the
triage sweep as a workflow tool whose gate is approved and rejected, the two specialists,
the guarded restart approved and rejected, a crash mid-turn (SIGKILL while the sweep's
child run runs) then resume; and the openai variant against a local server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, completion

import interlock

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "examples" / "triage" / "assistant.yaml"
OPENAI = REPO / "examples" / "triage" / "assistant.openai.yaml"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # call targets (examples.triage.tools:...) resolve from here
    monkeypatch.syspath_prepend(str(REPO))


def _trace(run_id: str, store: str) -> list[dict[str, Any]]:
    return asyncio.run(interlock.trace(run_id, store=store))


def _tools(run_id: str, store: str) -> list[tuple[str, Any]]:
    return [(r["tool"], r.get("result", r.get("error"))) for r in _trace(run_id, store)
            if r["type"] in ("tool.called", "tool.rejected") and not r.get("agent_tool")]


def test_the_scripted_assistant_with_every_gate_approved(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = interlock.load(SCRIPTED)

    async def talk() -> interlock.RunResult:
        r = await wf.run({}, store=store)
        assert r.status == "WAITING_INPUT"
        rid = r.run_id
        r = await wf.send(rid, "is anything wrong?", store=store)
        assert r.waiting["show"]["last_reply"].startswith("Kafka is degraded")
        r = await wf.send(rid, "run the triage", store=store)
        assert r.status == "WAITING_APPROVAL"
        assert r.waiting["node"] == "assistant/run_triage/approval"
        assert r.waiting["show"]["severity"] == "critical"
        r = await wf.resume(rid, interlock.approve(by="alice"), store=store)
        assert r.status == "WAITING_INPUT", r.error
        r = await wf.send(rid, "why is kafka lagging?", store=store)
        assert "payments-3 is stuck" in r.waiting["show"]["last_reply"]
        r = await wf.send(rid, "and kubernetes?", store=store)
        assert "evicted" in r.waiting["show"]["last_reply"]
        r = await wf.send(rid, "restart kafka", store=store)
        assert r.status == "WAITING_APPROVAL" and r.waiting["kind"] == "tool"
        r = await wf.resume(rid, interlock.approve(by="alice"), store=store)
        assert r.status == "WAITING_INPUT"
        return await wf.send(rid, "thanks, bye", store=store)

    result = asyncio.run(talk())
    assert result.status == "COMPLETED"
    assert result.state == {"assistant": "Goodbye!"}
    tools = _tools(result.run_id, store)
    assert [t for t, _ in tools] == ["service_status", "run_triage", "kafka", "kubernetes",
                                     "restart_service", "end_conversation"]
    triage = dict(tools)["run_triage"]
    assert triage["remediation"] == "fixed after 2 attempt(s)"
    assert dict(tools)["restart_service"] == "kafka restarted"
    inner = [r["tool"] for r in _trace(result.run_id, store) if r.get("agent_tool")
             and r["type"] == "tool.called"]
    assert inner == ["kafka_lag", "pod_events"]
    verified = asyncio.run(interlock.verify(result.run_id, store=store))
    assert verified.ok and len(verified.children) == 1  # the sweep's child run, checked too
    from interlock.support import export_run, verify_export

    async def lines() -> list[bytes]:
        return [line async for line in export_run(result.run_id, store=store)]

    exported = verify_export(asyncio.run(lines()))
    assert exported.ok and len(exported.children) == 1  # the export nests the child


def test_the_scripted_assistant_with_the_gates_rejected(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = interlock.load(SCRIPTED)

    async def talk() -> str:
        rid = (await wf.run({}, store=store)).run_id
        await wf.send(rid, "is anything wrong?", store=store)
        await wf.send(rid, "run the triage", store=store)
        r = await wf.resume(rid, interlock.reject(by="alice", comment="not in business hours"),
                            store=store)
        assert r.status == "WAITING_INPUT", r.error
        for text in ("why is kafka lagging?", "and kubernetes?", "restart kafka"):
            r = await wf.send(rid, text, store=store)
        r = await wf.resume(rid, interlock.reject(by="bob", comment="wait"), store=store)
        assert r.status == "WAITING_INPUT"
        return rid

    rid = asyncio.run(talk())
    tools = _tools(rid, store)
    # the rejected sweep is a tool error the model is told about; the conversation goes on
    triage = dict(tools)["run_triage"]
    assert triage["type"] == "ToolWorkflowError" and "rejected" in triage["message"]
    # who rejected it and why reach the model (review 41: "was rejected", nothing more)
    assert "was rejected by alice: not in business hours" in triage["message"], triage
    children = [r["run_id"] for r in _trace(rid, store) if r["type"] == "child.started"]
    assert len(children) == 1
    child = asyncio.run(interlock.status(children[0], store=store))
    assert child.status == "REJECTED"
    assert ("restart_service", None) in tools  # rejected: never ran
    rejected = [r for r in _trace(rid, store) if r["type"] == "tool.rejected"]
    assert rejected[0]["comment"] == "wait"


def test_a_crash_mid_turn_while_the_sweep_runs_then_resume(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = interlock.load(SCRIPTED)

    async def start() -> str:
        rid = (await wf.run({}, store=store)).run_id
        await wf.send(rid, "is anything wrong?", store=store)
        return rid

    rid = asyncio.run(start())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "send", rid, "run the triage",
                             "--store", store], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # killed once the sweep's child run has started its checks
            started = [r for r in _trace(rid, store) if r["type"] == "child.started"]
            if started and any(r["type"] == "node.started"
                               for r in _trace(started[0]["run_id"], store)):
                break
            assert proc.poll() is None, "the turn ended before the crash"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()

    async def finish() -> interlock.RunResult:
        r = await wf.resume(rid, store=store)
        assert r.status == "WAITING_APPROVAL", r.error
        assert r.waiting["node"] == "assistant/run_triage/approval"
        return await wf.resume(rid, interlock.approve(by="alice"), store=store)

    result = asyncio.run(finish())
    assert result.status == "WAITING_INPUT", result.error
    assert result.waiting["show"]["last_reply"].startswith("The triage sweep has finished")
    records = _trace(rid, store)
    assert len([r for r in records if r["type"] == "child.started"]) == 1  # the same child
    assert [r["text"] for r in records if r["type"] == "chat.message"] == [
        "is anything wrong?", "run the triage"]
    assert len([r for r in records if r["type"] == "chat.reply"]) == 2
    assert asyncio.run(interlock.verify(rid, store=store)).ok


def test_the_openai_assistant_offers_every_tool_to_a_local_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeOpenAI()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    fake.queue.append((200, completion(tool_calls=[("service_status", {"service": "kafka"})])))
    fake.reply("Kafka is degraded.")
    try:
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        wf = interlock.load(OPENAI)

        async def talk() -> interlock.RunResult:
            rid = (await wf.run({}, store=store)).run_id
            return await wf.send(rid, "is anything wrong?", store=store)

        result = asyncio.run(talk())
        assert result.status == "WAITING_INPUT", result.error
        assert result.waiting["show"]["last_reply"] == "Kafka is degraded."
        offered = [t["function"]["name"] for t in fake.requests[0]["body"]["tools"]]
        assert offered == ["service_status", "restart_service", "run_triage", "kafka",
                           "kubernetes", "end_conversation"]
        triage = next(t for t in fake.requests[0]["body"]["tools"]
                      if t["function"]["name"] == "run_triage")["function"]
        assert triage["parameters"]["required"] == ["scenario"]
        second = fake.requests[1]["body"]["messages"]
        assert second[-1]["role"] == "tool" and "degraded" in second[-1]["content"]
    finally:
        fake.close()
