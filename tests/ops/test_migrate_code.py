"""``interlock migrate`` of a conversation waiting for its next message, and of a run
whose code changed under the same definition: ``migrate RUN --to ITS_OWN_FILE`` records
the new code digests (``run.migrated``, from_hash == to_hash, audited like any
migration), so that ``--strict-code`` continuations compare against them -- the way out
the strict-code refusal names. Each through the CLI, as a user would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _workflows import kchat, tool_call
from conftest import records
from test_versions import GATED, NODES, Project

from interlock.support import set_strict_code

CHAT = kchat("[{after}:lookup]", "first answer", tool_call("lookup", q="one"), "looked it up",
             "third answer")

TOOL = '''
def double(state):
    return {"y": state["x"] * 2}

def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"
'''


@pytest.fixture(autouse=True)
def _lenient() -> Iterator[None]:
    yield
    set_strict_code(None)


@pytest.fixture
def project(make_project: Any) -> Project:
    p = Project(make_project(NODES, "migcode_nodes"))
    p.after_file.write_text(TOOL)
    return p


def _edit(p: Project) -> None:
    p.after_file.write_text(TOOL + "# version 2\n")


def test_a_conversation_waiting_for_a_message_is_migrated_and_goes_on(
        project: Project) -> None:
    wf = project.workflow(CHAT)
    assert project.cli("run", wf, "--run-id", "c1").exit_code == 3
    assert project.cli("send", "c1", "hello").stdout.strip() == "first answer"
    edited = project.workflow(CHAT.replace("provider: scripted",
                                           "provider: scripted\n      system: Be careful."),
                              "kchat2.yaml")
    # (on the old code: refused, "the run is WAITING_INPUT: only a waiting, failed or
    # pending run is migrated")
    moved = project.cli("migrate", "c1", "--to", edited, "--by", "ops")
    assert moved.exit_code == 0, moved.output
    assert "node 'a' changed (agent)" in moved.stdout
    assert "the conversation waits for its next message on the new definition: " \
           "`interlock send c1 TEXT" in moved.stderr
    _, status = project.base.cli_json("status", "c1")
    assert status["status"] == "WAITING_INPUT"
    sent = project.cli("send", "c1", "look it up")
    assert sent.exit_code == 3 and sent.stdout.strip() == "looked it up", sent.output
    assert [r["text"] for r in records("c1", project.base.store, "chat.message")] == [
        "hello", "look it up"]
    assert project.cli("verify", "c1").exit_code == 0


def test_strict_code_refuses_a_conversation_then_migrate_to_its_own_file_lets_it_go_on(
        project: Project) -> None:
    wf = project.workflow(CHAT)
    assert project.cli("run", wf, "--run-id", "c2").exit_code == 3
    assert project.cli("send", "c2", "hello").exit_code == 3
    _edit(project)
    refused = _strict(project, "send", "c2", "look it up")
    assert refused.exit_code == 2, refused.output
    assert "interlock migrate c2 --to FILE` (the run's own file" in refused.stderr
    moved = project.cli("migrate", "c2", "--to", wf, "--by", "ops", "--comment", "deploy 2")
    assert moved.exit_code == 0, moved.output
    assert f"the code of module {project.after!r} changed" in moved.stdout
    assert "the same definition" in moved.stderr
    sent = _strict(project, "send", "c2", "look it up")
    assert sent.exit_code == 3 and sent.stdout.strip() == "looked it up", sent.output
    assert project.cli("verify", "c2").exit_code == 0


def test_strict_code_refuses_a_waiting_run_then_migrate_to_its_own_file_records_the_code(
        project: Project) -> None:
    assert project.start(GATED, "r1").exit_code == 3
    wf = "wf.yaml"
    # nothing changed: nothing to migrate
    same = project.cli("migrate", "r1", "--to", wf)
    assert same.exit_code == 2
    assert "its code is the code it was recorded with: nothing to migrate" in same.stderr
    _edit(project)
    refused = _strict(project, "resume", "r1", "--approve", "--by", "al")
    assert refused.exit_code == 2 and "interlock migrate r1 --to FILE" in refused.stderr
    before = project.records("r1")
    # (on the old code: refused, "on this definition already (same hash)")
    moved = project.cli("migrate", "r1", "--to", wf, "--by", "ops")
    assert moved.exit_code == 0, moved.output
    migrated = project.records("r1")[len(before):]
    assert [r["type"] for r in migrated] == ["run.migrated"]
    rec = migrated[0]
    assert rec["from_hash"] == rec["to_hash"] == before[0]["definition_hash"]
    assert rec["by"] == "ops"
    assert rec["code"][project.after] != before[0]["code"][project.after]
    approved = _strict(project, "resume", "r1", "--approve", "--by", "al")
    assert approved.exit_code == 0, approved.output
    after = project.records("r1")
    assert "run.code_changed" not in [r["type"] for r in after]
    assert after[-1]["type"] == "run.completed"
    assert project.cli("verify", "r1").exit_code == 0


def _strict(project: Project, *args: str) -> Any:
    try:
        return project.cli(*args, "--strict-code") if args[0] == "resume" else \
            project.base.cli(*args, env={"INTERLOCK_STRICT_CODE": "1"})
    finally:
        set_strict_code(None)
