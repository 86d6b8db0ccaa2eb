"""A run that stops on a limit or on its store is continued by ONE command the person can
paste: ``interlock resume RUN`` with the ``--store`` the run is in (a bare ``interlock
resume RUN`` would read the default store, another one). The engine's messages, which
are recorded in the log and read through every surface, name no command (they cannot
know how the reader reaches the store); the CLI prints the command after them, as
`status` does."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import CliProject

from interlock.testing import FaultyStore

NODES = """
def spend(state, ctx):
    ctx.record_tokens(50)
    return {"spent": True}

def inc(state):
    return {"i": state.get("i", 0) + 1}
"""

BUDGET = """
    workflow: budget
    limits: {tokens: 10}
    nodes: {spend: "{mod}:spend"}
    edges: [{from: START, to: spend}, {from: spend, to: END}]
"""

LOOP = """
    workflow: loop
    limits: {steps: 3}
    nodes: {inc: {call: "{mod}:inc", writes: [i]}}
    edges:
      - {from: START, to: inc}
      - {from: inc, to: inc, when: "i < 10"}
      - {from: inc, to: END, when: "i >= 10"}
"""

TALK = """
    workflow: talk
    chat: assistant
    limits: {steps: 1}
    nodes:
      assistant: {agent: {provider: scripted, replies: [one, two, three]}}
"""


def commands(text: str) -> list[str]:
    """Every ``interlock resume`` command printed in ``text``."""
    return re.findall(r"interlock resume [^`\n]*?(?=`|\n|$)", text)


def test_a_run_over_its_token_budget_gets_one_resume_command_naming_its_store(
        make_project: Any) -> None:
    p: CliProject = make_project(NODES)
    ran = p.start(BUDGET, "b1")
    assert ran.exit_code == 1, ran.output
    want = f"interlock resume b1 --store {p.store} --set limits.tokens=N"
    assert commands(ran.output) == [want], ran.output
    assert "(--set limits.tokens=N) continues it" in ran.output  # the engine's words
    assert commands(p.cli("status", "b1").output) == [want]
    assert commands(p.cli("resume", "b1").output) == [want]  # (over the budget again)


def test_a_run_at_its_step_limit_gets_one_resume_command_naming_its_store(
        make_project: Any) -> None:
    p: CliProject = make_project(NODES)
    ran = p.start(LOOP, "l1")
    assert ran.exit_code == 1, ran.output
    want = f"interlock resume l1 --store {p.store} --set limits.steps=N"
    assert commands(ran.output) == [want], ran.output
    assert commands(p.cli("status", "l1").output) == [want]


def test_a_conversation_at_its_step_limit_gets_one_resume_command(make_project: Any) -> None:
    p: CliProject = make_project(NODES)
    assert p.start(TALK, "t1").exit_code == 3
    assert p.cli("send", "t1", "a").exit_code == 3
    over = p.cli("send", "t1", "b")
    assert over.exit_code == 1, over.output
    assert "(--set limits.steps=N) answers it" in over.output
    assert commands(over.output) == [
        f"interlock resume t1 --store {p.store} --set limits.steps=N"], over.output


def test_a_run_stopped_by_its_store_gets_the_resume_command_naming_it(
        make_project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store refuses every append of the run's completion (for the journal's whole
    retry time): the run stops unfinished, and the error says how to continue it."""
    import interlock._workflow as workflow_module
    from interlock._store import acquire_store

    p: CliProject = make_project(NODES)
    monkeypatch.setattr("interlock._engine._journal.RETRY_SECONDS", 0.2)

    def faulty(store: Any) -> tuple[FaultyStore, bool]:
        st = FaultyStore(acquire_store(store))
        st.fail_append(holding="node.completed", times=None)
        return st, False

    monkeypatch.setattr(workflow_module, "open_store_arg", faulty)
    ran = p.start(LOOP.replace("limits: {steps: 3}", ""), "s1")
    assert ran.exit_code == 2, ran.output
    assert "could not be stored" in ran.output
    assert commands(ran.output) == [f"interlock resume s1 --store {p.store}"], ran.output
