"""The commands interlock prints for a person to copy (`interlock._hints`): each "decide
with" hint -- run, resume, status, send, chat, a message refused while a gate waits -- is
one command line, naming the gate, that works when pasted; and every follow-up command
carries the options that reach the same store."""

from __future__ import annotations

import shlex
from typing import Any

from _workflows import RECORD_NODES, toolchat, triage
from click.testing import CliRunner
from conftest import CliProject

from interlock.cli import cli
from interlock.support import decide_command, decide_hint

TRIAGE = triage("{mod}:record")
TOOLCHAT = toolchat("triage approved, db is swept")
NODES = RECORD_NODES

GATE = "assistant/run_triage/approval"


def test_decide_hint_is_one_command_with_the_other_decisions_after_it() -> None:
    assert decide_hint("c1", {"node": GATE, "decisions": ["approve", "reject"]}) == \
        f"interlock resume c1 --gate {GATE} --approve (or --reject)"
    # a gate that takes a modify, with where the run is
    assert decide_hint("r", {"node": "gate", "decisions": ["approve", "reject", "modify"]},
                       " --store sqlite:///x.db") == \
        ("interlock resume r --gate gate --approve --store sqlite:///x.db "
         "(or --reject, or --modify PATCH_JSON [--at NODE])")
    # an approval that asks for data; a gate with approvers gets --by
    assert decide_hint("r", {"node": "g", "kind": "approval", "input": {"type": "object"},
                             "decisions": ["approve", "reject"], "approvers": ["alice"]}) == \
        "interlock resume r --gate g --approve --data JSON --by NAME (or --reject [--data JSON])"
    # a map item's gate is quoted: `deploy[2]` is a pattern to a shell
    assert decide_command("r", "deploy[2]", "--approve") == \
        "interlock resume r --gate 'deploy[2]' --approve"


def _conversation_at_a_child_gate(make_project: Any) -> CliProject:
    p: CliProject = make_project(NODES)
    p.workflow(TRIAGE, "triage.yaml")
    p.workflow(TOOLCHAT, "toolchat.yaml")
    assert p.cli("run", "toolchat.yaml", "--run-id", "c1").exit_code == 3
    return p


def test_send_at_a_child_gate_prints_a_decide_command_that_works(make_project: Any) -> None:
    p = _conversation_at_a_child_gate(make_project)
    sent = p.cli("send", "c1", "triage db")
    assert sent.exit_code == 3
    expected = (f"decide with: interlock resume c1 --gate {GATE} --approve --store {p.store} "
                "(or --reject)")
    assert expected in sent.stderr.splitlines()
    # the message refused while the gate waits says the same
    refused = p.cli("send", "c1", "hurry up")
    assert refused.exit_code == 2
    assert f"Decide with: interlock resume c1 --gate {GATE} --approve --store {p.store} " \
        "(or --reject)" in refused.output
    # a resume without a decision, too
    plain = p.cli("resume", "c1")
    assert plain.exit_code == 2
    assert f"decide it: interlock resume c1 --gate {GATE} --approve (or --reject)" \
        in plain.output
    # the command as printed, pasted
    command = expected.removeprefix("decide with: ").removesuffix(" (or --reject)")
    decided = CliRunner().invoke(cli, shlex.split(command)[1:], catch_exceptions=False)
    assert decided.exit_code == 3, decided.output  # the conversation waits for a message
    assert "reply: triage approved, db is swept" in decided.output
    assert (f"waiting for the next message: interlock send c1 TEXT --store {p.store}, or "
            f"interlock chat FILE --session c1 --store {p.store}") in decided.output


def test_status_of_a_conversation_says_how_to_send_the_next_message(
        make_project: Any) -> None:
    p = _conversation_at_a_child_gate(make_project)
    status = p.cli("status", "c1")
    assert status.exit_code == 3
    lines = status.stdout.splitlines()
    assert "decide with:" not in status.stdout  # (it was printed with no command after it)
    assert lines[2].startswith("waiting for message 1 of the conversation (to 'assistant')")
    assert lines[3] == (f"send it with: interlock send c1 TEXT --store {p.store}, or "
                        f"interlock chat FILE --session c1 --store {p.store}")
    assert p.cli("send", "c1", "triage db").exit_code == 3
    status = p.cli("status", "c1")
    assert f"  interlock resume c1 --gate {GATE} --approve --by NAME [--comment TEXT] " \
        f"--store {p.store}" in status.stdout.splitlines()


def test_chat_whose_input_ends_at_a_gate_says_how_to_decide_it(make_project: Any) -> None:
    p = _conversation_at_a_child_gate(make_project)
    out = CliRunner().invoke(cli, ["chat", "toolchat.yaml", "--session", "c1", "--store",
                                   p.store], input="triage db\n", catch_exceptions=False)
    assert out.exit_code == 3
    assert (f"the conversation waits for a decision at '{GATE}': decide with: interlock "
            f"resume c1 --gate {GATE} --approve --store {p.store} (or --reject); or continue "
            f"here: interlock chat toolchat.yaml --session c1 --store {p.store}") \
        in out.stderr.splitlines()


def test_migrate_of_a_waiting_run_points_at_status_with_the_store(make_project: Any) -> None:
    p: CliProject = make_project(NODES)
    p.workflow(TRIAGE, "triage.yaml")
    assert p.cli("run", "triage.yaml", "--run-id", "g1", "--input",
                 '{"service": "db"}').exit_code == 3
    p.workflow(TRIAGE.replace("show: [checked]", "show: [checked, service]"), "v2.yaml")
    moved = p.cli("migrate", "g1", "--to", "v2.yaml")
    assert moved.exit_code == 0, moved.output
    assert (f"it waits on the new definition: `interlock status g1 --store {p.store}` "
            "shows its gate and how to decide it") in moved.stderr
